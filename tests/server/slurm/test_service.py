"""``SlurmService`` and its keeper on a real control plane with fake agents: setup tells
each node its part and writes files from what the nodes report; lend moves a node's
replica away before it stops, then tells the node it is lent; reclaim keeps a node
cordoned while its agent reports a job and gives it back when none is left; an
administrator's drain is shown as theirs; a new leader carries on a reclaim; every
refusal changes nothing; the munge key is in no answer and no log line."""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import pytest

from llmgw.server.requests import SlurmNodes, SlurmSetup
from llmgw.server.slurm.settings import SETTING
from llmgw.wire.messages import ShardStatus, Slurm, SlurmJob, StartShard, StopShard
from llmgw.wire.states import NodeState, ShardState
from tests.server.slurm.fleet import Plane, plane, slurm_data, slurm_sent
from tests.support.agentsession import FakeSession
from tests.support.wiring import ADMIN

__all__ = ["plane", "slurm_data"]


async def two_nodes(p: Plane) -> tuple[FakeSession, FakeSession]:
    a = await p.node("a", "127.0.0.1")
    b = await p.node("b", "127.0.0.2", cpus=8)
    return a, b


async def setup(p: Plane, **body: object) -> dict[str, object]:
    answer = await p.client.post("/api/v1/slurm/setup", json=body)
    assert answer.status_code == 200, answer.text
    shown: dict[str, object] = answer.json()
    return shown


async def test_setup_tells_each_node_its_part_and_writes_files_from_their_reports(
    plane: Plane,
) -> None:
    a, b = await two_nodes(plane)
    await plane.node("c", "127.0.0.3")
    plane.slurm("a")
    shown = await setup(plane, controller="a", nodes=["a", "b"])
    assert shown["enabled"] is True and shown["controller"] == "a"
    assert shown["conf_server"] == "127.0.0.1:6817"
    assert [(n["node"], n["part"], n["stage"]) for n in shown["nodes"]] == [  # type: ignore[attr-defined]
        ("a", "both", "serving"),
        ("b", "slurmd", "serving"),
    ]
    await plane.cp.slurm.keeper.pass_once()
    (to_a,) = slurm_sent(a)
    (to_b,) = slurm_sent(b)
    assert (to_a.part, to_a.lent, to_a.name, to_a.conf_server) == (
        "both",
        False,
        "a",
        "127.0.0.1:6817",
    )
    assert (to_b.part, to_b.lent, to_b.slurm_conf) == ("slurmd", False, None)
    # The controller's files name each node: a's figures from slurmd -C, b's from its facts.
    conf = to_a.slurm_conf or ""
    assert "SlurmctldHost=a(127.0.0.1)" in conf
    assert "NodeName=a" in conf and "CPUs=4" in conf and "RealMemory=7900" in conf
    assert "NodeName=b" in conf and "CPUs=8" in conf and "NodeAddr=127.0.0.2" in conf
    assert "NodeName=c" not in conf
    # The same key to every node with a part, 1024 bytes; none to a node without.
    assert to_a.munge_key == to_b.munge_key and len(base64.b64decode(to_a.munge_key or "")) == 1024
    c_sent = slurm_sent(plane.cp.registry.nodes["c"].session)  # type: ignore[arg-type]
    assert [(m.part, m.munge_key) for m in c_sent] == [("none", None)]
    files = (await plane.client.get("/api/v1/slurm/conf")).json()
    assert files["slurm_conf"] == conf and files["gres_conf"] == to_a.gres_conf
    # A pass with nothing changed sends nothing again.
    await plane.cp.slurm.keeper.pass_once()
    assert len(slurm_sent(a)) == 1 and len(slurm_sent(b)) == 1
    # What a node is told at registration carries its part too.
    pushed = plane.cp.pushed_for("b", "127.0.0.1")
    assert [m for m in pushed if isinstance(m, Slurm)] == [to_b]


async def test_setup_again_changes_what_it_names_and_keeps_the_rest_and_the_key(
    plane: Plane,
) -> None:
    await two_nodes(plane)
    await setup(plane, controller="a", partition="gpu")
    key = plane.cp.slurm.kept.now.munge_key
    shown = await setup(plane, controller="b")
    assert (shown["controller"], shown["partition"]) == ("b", "gpu")
    assert plane.cp.slurm.kept.now.munge_key == key
    assert (await plane.client.post("/api/v1/slurm/off", json={"now": True})).status_code == 200
    shown = await setup(plane)
    assert shown["controller"] == "b" and plane.cp.slurm.kept.now.munge_key == key


async def refused(plane: Plane, path: str, body: dict[str, object], status: int, code: str) -> str:
    before = await plane.cp.store.get_setting(SETTING)
    marks = {n: (v.cordoned, v.draining) for n, v in plane.cp.registry.nodes.items()}
    answer = await plane.client.post(path, json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code
    assert await plane.cp.store.get_setting(SETTING) == before
    assert {n: (v.cordoned, v.draining) for n, v in plane.cp.registry.nodes.items()} == marks
    message: str = error["message"]
    return message


async def test_every_refusal_names_what_is_wrong_and_changes_nothing(plane: Plane) -> None:
    await two_nodes(plane)
    said = await refused(plane, "/api/v1/slurm/lend", {"nodes": ["a"]}, 409, "slurm_off")
    assert "llmgw ctl slurm setup" in said
    said = await refused(plane, "/api/v1/slurm/setup", {"nodes": ["a", "zz"]}, 404, "not_found")
    assert "'zz'" in said and "llmgw ctl nodes" in said
    plane.cp.registry.nodes["b"].state = NodeState.NOT_READY
    plane.cp.registry.nodes["b"].reason = "no heartbeat for 15 s"
    said = await refused(
        plane, "/api/v1/slurm/setup", {"controller": "b"}, 409, "controller_not_ready"
    )
    assert "NotReady" in said and "no heartbeat" in said and "--controller" in said
    plane.cp.registry.nodes["b"].state = NodeState.READY
    plane.slurm("b", installed="21.08.8")
    said = await refused(plane, "/api/v1/slurm/setup", {"controller": "a"}, 409, "slurm_too_old")
    assert "21.08.8" in said and "22.05" in said and "--nodes" in said
    plane.slurm("b")
    said = await refused(
        plane,
        "/api/v1/slurm/setup",
        {"controller": "a", "root": "/srv/my slurm"},
        400,
        "bad_request",
    )
    assert "/srv/my slurm" in said
    await setup(plane, controller="a", nodes=["a"])
    said = await refused(plane, "/api/v1/slurm/lend", {"nodes": ["b"]}, 409, "not_in_slurm")
    assert "b" in said and "--nodes" in said
    said = await refused(plane, "/api/v1/slurm/lend", {"nodes": ["nope"]}, 404, "not_found")
    said = await refused(plane, "/api/v1/slurm/reclaim", {"nodes": ["a"]}, 409, "not_lent")
    assert "a (serving)" in said


async def run_reconciler(plane: Plane) -> list[object]:
    """One reconcile pass; what it sent."""
    before = {n: len(v.session.sent) for n, v in plane.cp.registry.nodes.items()}  # type: ignore[union-attr]
    await plane.cp.models.dispatch.reconcile()
    sent: list[object] = []
    for node_id, view in sorted(plane.cp.registry.nodes.items()):
        session = view.session
        assert isinstance(session, FakeSession)
        sent += [(node_id, m) for m in session.sent[before[node_id] :]]
    return sent


def started(plane: Plane, node_id: str, message: StartShard, state: ShardState) -> None:
    spec = message.spec
    plane.cp.registry.report(
        node_id,
        ShardStatus(
            replica_id=spec.replica_id,
            state=state,
            fingerprint=spec.fingerprint,
            port=spec.port,
            source=spec.source,
        ),
    )


async def test_lend_moves_the_replica_first_then_says_lent_and_reclaim_waits_for_the_job(
    plane: Plane,
) -> None:
    a, b = await two_nodes(plane)
    plane.serve("m")
    ((first, start),) = await run_reconciler(plane)  # type: ignore[misc]
    assert isinstance(start, StartShard)
    other = "b" if first == "a" else "a"
    started(plane, first, start, ShardState.READY)
    await setup(plane, controller=other)
    plane.slurm(first)
    answer = await plane.client.post("/api/v1/slurm/lend", json={"nodes": [first]})
    assert answer.status_code == 200, answer.text
    view = plane.cp.registry.nodes[first]
    assert view.draining and view.cordoned
    assert plane.cp.slurm.service.stage_of(first) == "lending"
    await plane.cp.slurm.keeper.pass_once()
    session = view.session
    assert isinstance(session, FakeSession)
    assert slurm_sent(session)[-1].lent is False
    # The replica is placed elsewhere before the old one stops.
    sent = await run_reconciler(plane)
    assert [(n, type(m).__name__) for n, m in sent] == [(other, "StartShard")]  # type: ignore[misc]
    new = sent[0][1]  # type: ignore[index]
    assert isinstance(new, StartShard)
    started(plane, other, new, ShardState.READY)
    sent = await run_reconciler(plane)
    assert [(n, type(m).__name__) for n, m in sent] == [(first, "StopShard")]  # type: ignore[misc]
    stop = sent[0][1]  # type: ignore[index]
    assert isinstance(stop, StopShard) and stop.replica_id == start.spec.replica_id
    plane.report_shard(first, stop.replica_id, ShardState.STOPPED)
    assert plane.cp.slurm.service.stage_of(first) == "lent"
    await plane.cp.slurm.keeper.pass_once()
    assert slurm_sent(session)[-1].lent is True
    nodes = (await plane.client.get("/api/v1/nodes")).json()
    assert {n["id"]: n["slurm"] for n in nodes} == {first: "lent", other: "serving"}
    plane.slurm(first, state="MIXED", reason=None, jobs=[SlurmJob(id="7", end=2e9)], steps=1)
    metrics = (await plane.client.get("/metrics")).text
    assert f'llmgw_slurm_node_lent{{node="{first}"}} 1' in metrics
    assert f'llmgw_slurm_node_lent{{node="{other}"}} 0' in metrics
    assert f'llmgw_slurm_node_jobs{{node="{first}"}} 1' in metrics

    # Reclaim while the job runs: lent=False is sent, the node stays cordoned.
    answer = await plane.client.post("/api/v1/slurm/reclaim", json={"nodes": [first]})
    assert answer.status_code == 200, answer.text
    await plane.cp.slurm.keeper.pass_once()
    assert slurm_sent(session)[-1].lent is False
    plane.slurm(
        first, state="MIXED+DRAIN", reason="llmgw: reclaimed", jobs=[SlurmJob(id="7")], steps=1
    )
    await plane.cp.slurm.keeper.pass_once()
    assert view.cordoned and plane.cp.slurm.service.stage_of(first) == "reclaiming"
    shown = {n["node"]: n for n in (await plane.client.get("/api/v1/slurm")).json()["nodes"]}
    assert shown[first]["waiting_for"] == "its jobs to end (7)"
    assert shown[first]["admin_drain"] is False
    # The job ends: back in llmgw, uncordoned, left drained in Slurm.
    plane.slurm(first, state="IDLE+DRAIN", reason="llmgw: reclaimed")
    await plane.cp.slurm.keeper.pass_once()
    assert not view.cordoned and not view.draining
    assert plane.cp.slurm.service.stage_of(first) == "serving"
    actions = [r["action"] for r in await plane.cp.store.audit_log(limit=50)]
    assert {"slurm.setup", "slurm.lend", "slurm.reclaim", "slurm.reclaimed"} <= set(actions)


async def test_a_lend_whose_replica_has_nowhere_else_to_go_is_refused(plane: Plane) -> None:
    await plane.node("a", "127.0.0.1")
    plane.serve("m")
    ((_, start),) = await run_reconciler(plane)  # type: ignore[misc]
    assert isinstance(start, StartShard)
    started(plane, "a", start, ShardState.READY)
    await setup(plane, controller="a")
    said = await refused(plane, "/api/v1/slurm/lend", {"nodes": ["a"]}, 409, "nowhere_to_go")
    assert start.spec.replica_id in said and "a: " in said
    answer = await plane.client.post("/api/v1/slurm/lend", json={"nodes": ["a"]})
    assert answer.json()["error"]["verdicts"][0]["node"] == "a"


async def test_an_administrators_drain_is_theirs_and_a_broken_slurm_keeps_no_node(
    plane: Plane,
) -> None:
    await two_nodes(plane)
    await setup(plane, controller="a")
    plane.slurm("b", state="IDLE+DRAIN", reason="bad DIMM [root@2026-12-06T07:00:00]")
    await plane.cp.slurm.service.lend(SlurmNodes(nodes=("b",)), ADMIN)
    shown = {n["node"]: n for n in plane.cp.slurm.service.status()["nodes"]}
    assert shown["b"]["admin_drain"] is True and shown["b"]["stage"] == "lent"
    assert shown["a"]["admin_drain"] is False
    # slurmctld is down: no job can be read, the agent says so; the reclaim ends anyway.
    await plane.cp.slurm.service.reclaim(SlurmNodes(nodes=("b",)), ADMIN)
    plane.cp.registry.report(
        "b",
        plane.cp.registry.nodes["b"].slurm.__class__(  # type: ignore[union-attr]
            version=1,
            part="slurmd",
            state=None,
            jobs=None,
            steps=0,
            problem="slurmctld at 127.0.0.1:6817 does not answer: start it on a",
        ),
    )
    # And on the controller's node, not lent, slurmctld does not start: llmgw keeps it.
    plane.slurm("a", state=None, reason=None, jobs=None, problem="slurmctld exited: see its log")
    await plane.cp.slurm.keeper.pass_once()
    assert not plane.cp.registry.nodes["b"].cordoned
    assert not plane.cp.registry.nodes["a"].cordoned
    assert plane.cp.slurm.service.stage_of("a") == "serving"
    status = plane.cp.slurm.service.status()
    assert any("does not answer" in w for w in status["warnings"])
    assert "a: slurmctld exited: see its log" in status["warnings"]


async def test_a_new_leader_carries_on_a_reclaim(plane: Plane) -> None:
    await two_nodes(plane)
    await setup(plane, controller="a")
    await plane.cp.slurm.service.lend(SlurmNodes(nodes=("b",)), ADMIN)
    await plane.cp.slurm.service.reclaim(SlurmNodes(nodes=("b",)), ADMIN)
    assert plane.cp.registry.nodes["b"].cordoned
    # Another control plane over the same store: it reads the settings and the marks.
    from llmgw.server.app import ControlPlane
    from llmgw.server.datadir import DataDir
    from llmgw.server.store import open_store

    data = DataDir(plane.root)
    config = data.load_config()
    store = await open_store(config, plane.root)
    try:
        cp2 = ControlPlane(data, config, store)
        await cp2.load()
        assert cp2.slurm.service.stage_of("b") == "reclaiming"
        second = Plane(cp2, plane.client, plane.root)
        await second.node("b", "127.0.0.2")
        assert cp2.registry.nodes["b"].cordoned
        second.slurm("b", state="IDLE+DRAIN", reason="llmgw: reclaimed")
        await cp2.slurm.keeper.pass_once()
        assert not cp2.registry.nodes["b"].cordoned
        assert cp2.slurm.service.stage_of("b") == "serving"
    finally:
        await cp2.gateway.close()
        await cp2.inspector.close()
        await store.close()


async def test_off_reclaims_first_then_turns_slurm_off(plane: Plane) -> None:
    a, b = await two_nodes(plane)
    await setup(plane, controller="a")
    await plane.cp.slurm.service.lend(SlurmNodes(nodes=("b",)), ADMIN)
    plane.slurm("b", state="ALLOCATED", reason=None, jobs=[SlurmJob(id="9")], steps=1)
    shown = (await plane.client.post("/api/v1/slurm/off", json={})).json()
    assert shown["enabled"] is True
    assert {n["node"]: n["stage"] for n in shown["nodes"]}["b"] == "reclaiming"
    await plane.cp.slurm.keeper.pass_once()
    assert plane.cp.slurm.kept.now.enabled and plane.cp.registry.nodes["b"].cordoned
    plane.slurm("b", state="IDLE+DRAIN", reason="llmgw: reclaimed")
    await plane.cp.slurm.keeper.pass_once()
    assert not plane.cp.slurm.kept.now.enabled
    assert not plane.cp.registry.nodes["b"].cordoned
    await plane.cp.slurm.keeper.pass_once()
    assert slurm_sent(a)[-1].part == "none" and slurm_sent(b)[-1].part == "none"
    assert plane.cp.slurm.service.stage_of("b") is None


async def test_the_munge_key_is_in_no_answer_and_no_log_line(
    plane: Plane, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    a, _ = await two_nodes(plane)
    await setup(plane, controller="a")
    await plane.cp.slurm.keeper.pass_once()
    key = slurm_sent(a)[-1].munge_key
    assert key
    raw = base64.b64decode(key)
    answers = [
        (await plane.client.get(path)).text
        for path in ("/api/v1/slurm", "/api/v1/slurm/conf", "/api/v1/nodes", "/metrics")
    ]
    audit = json.dumps(await plane.cp.store.audit_log(limit=50))
    stored = await plane.cp.store.get_setting(SETTING) or ""
    for text in [*answers, audit, caplog.text, stored]:
        assert key not in text and raw.hex() not in text
    # Kept sealed: the store holds it only under the cluster's secret.
    assert json.loads(stored)["munge_key"].startswith("sealed1:")
    assert "munge" not in repr(plane.cp.slurm.kept.now)


async def test_setup_names_a_ready_controller_when_none_is_given(plane: Plane) -> None:
    await two_nodes(plane)
    plane.cp.registry.nodes["a"].state = NodeState.NOT_READY
    shown = await plane.cp.slurm.service.setup(SlurmSetup(), ADMIN)
    assert shown["controller"] == "b"


async def test_the_keepers_duty_gives_a_node_back_when_its_agent_reports(plane: Plane) -> None:
    """The leader's duty, not a pass called by hand: woken by the agent's report (the
    registry's change), well before its 2 s pass would come round."""
    await two_nodes(plane)
    await setup(plane, controller="a")
    service = plane.cp.slurm.service
    await service.lend(SlurmNodes(nodes=("b",)), ADMIN)
    await service.reclaim(SlurmNodes(nodes=("b",)), ADMIN)
    plane.slurm("b", state="MIXED+DRAIN", reason="llmgw: reclaimed", jobs=[SlurmJob(id="3")])
    keeper = plane.cp.slurm.keeper
    keeper.interval = 3600.0
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    try:
        async with asyncio.timeout(10):
            while keeper.passes < 1:
                await asyncio.sleep(0.01)
        assert service.stage_of("b") == "reclaiming"
        plane.slurm("b", state="IDLE+DRAIN", reason="llmgw: reclaimed")
        async with asyncio.timeout(10):
            while service.stage_of("b") != "serving":
                await asyncio.sleep(0.01)
        assert not plane.cp.registry.nodes["b"].cordoned
    finally:
        stop.set()
        await task
