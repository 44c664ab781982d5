"""Lending by policy on a real control plane with fake agents, its clock driven by the
test (no sleeps): an idle node is lent after the set time and not before; a model whose
requests queue past the limit, or whose replica has nowhere to go, gets the lent node
back within one pass, and the node returns to llmgw when its job ends; with the policy
off nothing happens; every decision is in the audit with its reason, and
``GET /api/v1/slurm`` says what the policy would do next."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from llmgw.client.ctl_slurm import shown as status_text
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.gateway.router import Endpoint
from llmgw.server.slurm.lender import Lender
from llmgw.server.slurm.policy import Decision
from llmgw.server.store import StoreUnavailable
from llmgw.wire.messages import Slurm, SlurmJob, StartShard
from llmgw.wire.states import ShardState
from tests.server.slurm.fleet import GIB, Plane, plane, slurm_data, slurm_sent
from tests.server.slurm.test_service import run_reconciler, setup, started
from tests.support.agentsession import FakeSession

__all__ = ["plane", "slurm_data"]

MIN = 60.0
WALL = 1_800_000_000.0


class Clock:
    """The lender's and the gateway queue's monotonic clock, and Slurm's wall clock."""

    def __init__(self, plane: Plane) -> None:
        self.now = 5000.0
        lender = plane.cp.slurm.keeper.lender
        assert isinstance(lender, Lender)
        lender.clock = lambda: self.now
        lender.wall = lambda: WALL
        lender.restart()
        plane.cp.gateway.queue.clock = lambda: self.now
        # One waiter outlasts the limit here; a backlog of many is the queue's own test.
        plane.cp.gateway.queue.wait = 3600.0


async def policy(p: Plane, **body: object) -> None:
    answer = await p.client.post("/api/v1/slurm/policy", json=body)
    assert answer.status_code == 200, answer.text


async def shown(p: Plane) -> dict[str, object]:
    answer = await p.client.get("/api/v1/slurm")
    assert answer.status_code == 200, answer.text
    doc: dict[str, object] = answer.json()
    return doc


def last(p: Plane, node_id: str) -> Slurm:
    session = p.cp.registry.nodes[node_id].session
    assert isinstance(session, FakeSession)
    return slurm_sent(session)[-1]


async def policy_audit(p: Plane) -> list[tuple[str, str, str]]:
    return [
        (r["action"], r["target"], r["detail"])
        for r in reversed(await p.cp.store.audit_log(limit=100, actor="slurm-policy"))
        if r["action"].startswith("slurm.")
    ]


async def serve_on_a(p: Plane) -> Endpoint:
    """Model m's one replica Ready on a (b is Slurm's, so a is the only place)."""
    p.serve("m")
    ((node_id, start),) = await run_reconciler(p)  # type: ignore[misc]
    assert node_id == "a" and isinstance(start, StartShard)
    started(p, "a", start, ShardState.READY)
    (endpoint,) = p.cp.gateway.router.serving("m")
    return endpoint


@contextlib.asynccontextmanager
async def queued(p: Plane, endpoint: Endpoint) -> AsyncIterator[asyncio.Task[Endpoint | None]]:
    """A request of m waiting in the gateway's queue behind one at its replica's slot."""
    router, queue = p.cp.gateway.router, p.cp.gateway.queue
    endpoint.outstanding = endpoint.slots
    waiter = asyncio.create_task(queue.admit("m", "key", 0, lambda: router.pick("m", room=True)))
    async with asyncio.timeout(5):
        while queue.depth("m") != 1:
            await asyncio.sleep(0.002)
    try:
        yield waiter
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter


async def test_an_idle_node_is_lent_after_the_set_time_and_not_before(plane: Plane) -> None:
    await plane.node("a", "127.0.0.1")
    await plane.node("b", "127.0.0.2")
    plane.slurm("a")
    plane.slurm("b")
    await setup(plane, controller="a", nodes=["b"])
    clock = Clock(plane)
    await policy(plane, lend_idle_after=1800)
    keeper = plane.cp.slurm.keeper
    await keeper.pass_once()
    assert (await shown(plane))["next"] == [
        "lend b in 30 min if it serves nothing meanwhile (policy: 30 min)"
    ]
    clock.now += 30 * MIN - 1
    await keeper.pass_once()
    assert plane.cp.slurm.service.stage_of("b") == "serving"
    assert not plane.cp.registry.nodes["b"].cordoned and last(plane, "b").lent is False
    doc = await shown(plane)
    assert doc["next"] == ["lend b in 1 s if it serves nothing meanwhile (policy: 30 min)"]
    # `ctl slurm status` says it after its table.
    assert status_text(doc).endswith(
        "Lending by policy, next:\n  lend b in 1 s if it serves nothing meanwhile (policy: 30 min)"
    )
    assert await policy_audit(plane) == []
    clock.now += 1
    await keeper.pass_once()
    assert plane.cp.slurm.service.stage_of("b") == "lent"
    assert plane.cp.registry.nodes["b"].cordoned and last(plane, "b").lent is True
    words = "b: it served nothing since the keeper began watching 30 min ago (policy: 30 min)"
    assert ("slurm.lend", "slurm", words) in await policy_audit(plane)
    assert (await shown(plane))["next"] == [
        "nothing to lend: no node of Slurm's set is serving, Ready and free of replicas"
    ]


async def test_a_request_served_on_a_node_holds_it_back(plane: Plane) -> None:
    await plane.node("a", "127.0.0.1")
    plane.slurm("a")
    await setup(plane, controller="a", nodes=["a"])
    clock = Clock(plane)
    await policy(plane, lend_idle_after=1800)
    endpoint = await serve_on_a(plane)
    keeper = plane.cp.slurm.keeper
    clock.now += 60 * MIN
    await keeper.pass_once()  # it runs a replica: never lent while it does
    plane.cp.gateway.router.last_served["a"] = clock.now + 10 * MIN  # served later on
    view = plane.cp.registry.nodes["a"]
    view.shards.clear()  # and then its replica went (as a drain would move it)
    plane.cp.registry.version += 1
    clock.now += 39 * MIN
    await keeper.pass_once()
    assert plane.cp.slurm.service.stage_of("a") == "serving"
    assert (await shown(plane))["next"] == [
        "lend a in 60 s if it serves nothing meanwhile (policy: 30 min)"
    ]
    clock.now += 1 * MIN
    await keeper.pass_once()
    assert plane.cp.slurm.service.stage_of("a") == "lent"
    assert endpoint.node == "a"


async def test_a_model_queued_past_the_limit_gets_the_lent_node_back_after_its_job(
    plane: Plane,
) -> None:
    await plane.node("a", "127.0.0.1")
    await plane.node("b", "127.0.0.2")
    plane.slurm("a")
    await setup(plane, controller="a", nodes=["a", "b"])
    clock = Clock(plane)
    endpoint = await serve_on_a(plane)
    answer = await plane.client.post("/api/v1/slurm/lend", json={"nodes": ["b"]})
    assert answer.status_code == 200, answer.text
    keeper = plane.cp.slurm.keeper
    await keeper.pass_once()
    assert plane.cp.slurm.service.stage_of("b") == "lent" and last(plane, "b").lent is True
    job = SlurmJob(id="7", name="train", user="ana", state="RUNNING", end=WALL + 20)
    plane.slurm("b", state="ALLOCATED", reason=None, jobs=[job], steps=1)
    await policy(plane, reclaim_when_queued=60)
    async with queued(plane, endpoint):
        clock.now += 59
        await keeper.pass_once()
        assert plane.cp.slurm.service.stage_of("b") == "lent"
        assert await policy_audit(plane) == []
        clock.now += 16
        await keeper.pass_once()  # one pass
        assert plane.cp.slurm.service.stage_of("b") == "reclaiming"
        assert last(plane, "b").lent is False
        words = "b: model m's requests have queued for 75 s (policy: 60 s); b's 1 job end in 20 s"
        assert await policy_audit(plane) == [("slurm.reclaim", "slurm", words)]
        # While its job runs it stays cordoned, and no other node is taken for m.
        plane.slurm("b", state="ALLOCATED+DRAIN", reason="llmgw: reclaimed", jobs=[job], steps=1)
        clock.now += 20
        await keeper.pass_once()
        assert plane.cp.registry.nodes["b"].cordoned
        assert (await shown(plane))["next"] == [
            "model m's requests have queued for 95 s (policy: 60 s): b is being taken back for it"
        ]
        # The job ends: b is back in llmgw, uncordoned, left drained in Slurm.
        plane.slurm("b", state="IDLE+DRAIN", reason="llmgw: reclaimed", jobs=[], steps=0)
        await keeper.pass_once()
        assert plane.cp.slurm.service.stage_of("b") == "serving"
        assert not plane.cp.registry.nodes["b"].cordoned
        assert await policy_audit(plane) == [("slurm.reclaim", "slurm", words)]


async def test_a_replica_with_nowhere_to_go_gets_the_lent_node_back(plane: Plane) -> None:
    await plane.node("a", "127.0.0.1")
    await plane.node("b", "127.0.0.2")
    plane.slurm("a")
    plane.slurm("b")
    await setup(plane, controller="a", nodes=["b"])
    Clock(plane)
    answer = await plane.client.post("/api/v1/slurm/lend", json={"nodes": ["b"]})
    assert answer.status_code == 200, answer.text
    await policy(plane, reclaim_when_queued=60)
    # Two replicas of 40 GiB on nodes of 64: one fits on a, the other only on b.
    profile = Profile(name="default", engine="llama.cpp", replicas=2, memory=40 * GIB)
    plane.cp.models.models["big"] = Model(
        name="big", source="/models/big.gguf", engine="llama.cpp", profiles=(profile,), context=512
    )
    sent = await run_reconciler(plane)
    assert [n for n, _ in sent] == ["a"]  # type: ignore[misc]
    assert "big" in plane.cp.reconciler.unplaced
    await plane.cp.slurm.keeper.pass_once()
    assert plane.cp.slurm.service.stage_of("b") == "reclaiming"
    ((action, _, words),) = await policy_audit(plane)
    assert action == "slurm.reclaim"
    assert words.startswith("b: a replica of model big has nowhere to go (no node fits (")
    assert words.endswith("; b runs no job")
    await plane.cp.slurm.keeper.pass_once()  # b drained, no job: back in llmgw
    assert plane.cp.slurm.service.stage_of("b") == "serving"
    sent = await run_reconciler(plane)
    assert [n for n, _ in sent] == ["b"]  # type: ignore[misc]


async def test_with_the_policy_off_nothing_happens(plane: Plane) -> None:
    await plane.node("a", "127.0.0.1")
    await plane.node("b", "127.0.0.2")
    await plane.node("c", "127.0.0.3")
    plane.slurm("a")
    await setup(plane, controller="a", nodes=["a", "b", "c"])
    clock = Clock(plane)
    endpoint = await serve_on_a(plane)
    answer = await plane.client.post("/api/v1/slurm/lend", json={"nodes": ["b"]})
    assert answer.status_code == 200, answer.text
    await policy(plane, lend_idle_after=1800, reclaim_when_queued=60)
    await policy(plane, off=True)
    keeper = plane.cp.slurm.keeper
    async with queued(plane, endpoint):
        for _ in range(3):
            clock.now += 86400
            await keeper.pass_once()
        assert plane.cp.gateway.queue.backlogs() == {"m": 3 * 86400}
        service = plane.cp.slurm.service
        assert [service.stage_of(n) for n in "abc"] == ["serving", "lent", "serving"]
        assert (await shown(plane))["next"] == []
        assert await policy_audit(plane) == []


async def test_a_failed_decision_keeps_no_node_from_hearing_its_part(
    plane: Plane, caplog: pytest.LogCaptureFixture
) -> None:
    await plane.node("a", "127.0.0.1")
    b = await plane.node("b", "127.0.0.2")
    plane.slurm("a")
    await setup(plane, controller="a", nodes=["b"])
    clock = Clock(plane)
    await policy(plane, lend_idle_after=1800)
    lender = plane.cp.slurm.keeper.lender
    assert lender is not None
    act = lender.act

    async def broken(decision: Decision) -> object:
        raise StoreUnavailable("the store is read-only")

    lender.act = broken
    clock.now += 31 * MIN
    await plane.cp.slurm.keeper.pass_once()
    assert "lending by policy failed this pass" in caplog.text
    assert [m.part for m in slurm_sent(b)] == ["slurmd"]  # told its part all the same
    assert plane.cp.slurm.service.stage_of("b") == "serving"
    lender.act = act
    await plane.cp.slurm.keeper.pass_once()
    assert plane.cp.slurm.service.stage_of("b") == "lent"
