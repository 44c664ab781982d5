"""``llmgw restart``'s run on the control plane (``server/restart.py``), with stand-in
agents' streams and control planes: the order (agents, then standbys before a leader,
then this one), what is skipped and named, and the first failure stopping the run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw.server import restart as restart_module
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.principal import Principal
from llmgw.server.restart import ClusterRestart, Plane, RestartRunning
from llmgw.wire.messages import Response, ShardStatus
from llmgw.wire.states import NodeState, ShardState

ADMIN = Principal.system("test")


class Stream:
    """An agent's stream: answers restart, then (``comes_back``) a new one registers."""

    def __init__(self, view: NodeView, said: list[str], comes_back: bool = True) -> None:
        self.view = view
        self.said = said
        self.comes_back = comes_back

    def close(self, reason: str) -> None:
        pass

    async def send(self, msg: object) -> None:
        pass

    async def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]:
        self.said.append(f"{kind} {self.view.id}")
        yield Response(id="1", result={"restarting": True})
        self.view.session = None
        if self.comes_back:
            asyncio.get_running_loop().call_later(0.05, self.register_again)

    def register_again(self) -> None:
        self.view.session = Stream(self.view, self.said)
        self.said.append(f"back {self.view.id}")


def node(node_id: str, said: list[str], features: list[str], **kw: Any) -> NodeView:
    view = NodeView(id=node_id, cert_serial=1, state=NodeState.READY, version="1.0")
    view.features = features
    view.shards = {"r1": ShardStatus(replica_id="r1", state=ShardState.READY, pid=4242)}
    view.session = Stream(view, said, **kw)
    return view


class Peers:
    """Other control planes over their link: each starts again when asked."""

    def __init__(self, said: list[str], back: bool = True) -> None:
        self.started = {"10.0.0.2:8444": 100.0, "10.0.0.3:8444": 100.0}
        self.said = said
        self.back = back

    async def ask(self, address: str) -> None:
        self.said.append(f"peer restart {address}")
        if self.back:
            self.started[address] = 200.0

    async def started_at(self, address: str) -> float | None:
        return self.started[address]


def service(
    nodes: list[NodeView], said: list[str], peers: Peers, relaunched: Callable[[str], None]
) -> ClusterRestart:
    async def audit(actor: str, detail: str) -> None:
        said.append(f"audit {detail}")

    return ClusterRestart(
        SimpleNamespace(nodes={v.id: v for v in nodes}),  # type: ignore[arg-type]
        "cp-a",
        lambda: [
            Plane("cp-c", "10.0.0.3:8444", "leader"),
            Plane("cp-b", "10.0.0.2:8444", "standby"),
        ],
        peers.ask,
        peers.started_at,
        relaunched,
        audit,
    )


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restart_module, "POLL", 0.01)
    monkeypatch.setattr(restart_module, "LAST_WORD", 0.01)
    monkeypatch.setattr(restart_module, "AGENT_BACK", 1.0)
    monkeypatch.setattr(restart_module, "PLANE_BACK", 1.0)


async def test_agents_then_standbys_then_a_leader_then_this_one() -> None:
    said: list[str] = []
    relaunched = asyncio.Event()
    old = node("old", said, ["heartbeat.v1"])
    gone = node("gone", said, ["heartbeat.v1", "restart.v1"])
    gone.session = None
    nodes = [node("a", said, ["heartbeat.v1", "restart.v1"]), old, gone]
    run = service(nodes, said, Peers(said), lambda why: relaunched.set())

    plan = await run.start(ADMIN)
    assert [(r["node"], r["state"]) for r in plan["agents"]] == [
        ("a", "waiting"),
        ("gone", "skipped"),
        ("old", "skipped"),
    ]
    reasons = {r["node"]: r["reason"] for r in plan["agents"]}
    assert reasons["gone"] == "its agent is not connected"
    assert "does not answer restart" in str(reasons["old"])
    assert [p["name"] for p in plan["control_planes"]] == ["cp-b", "cp-c", "cp-a"]
    with pytest.raises(RestartRunning):
        await run.start(ADMIN)

    await asyncio.wait_for(relaunched.wait(), 5)
    assert said == [
        "audit 3 node(s), 3 control plane(s)",
        "restart a",
        "back a",
        "peer restart 10.0.0.2:8444",
        "peer restart 10.0.0.3:8444",
    ]
    doc = run.status()
    assert doc["stage"] == "this"
    (a,) = [r for r in doc["agents"] if r["node"] == "a"]
    assert (a["state"], a["engines"], a["engines_kept"]) == ("back", {"r1": 4242}, True)
    assert [(p["state"], p["started"]) for p in doc["control_planes"]] == [
        ("back", 200.0),
        ("back", 200.0),
        ("restarting", None),
    ]


async def test_an_agent_that_does_not_come_back_stops_the_run_before_any_control_plane() -> None:
    said: list[str] = []
    relaunched: list[str] = []
    nodes = [node("a", said, ["restart.v1"], comes_back=False)]
    run = service(nodes, said, Peers(said), relaunched.append)
    await run.start(ADMIN)
    assert run._task is not None
    await asyncio.wait_for(run._task, 5)
    doc = run.status()
    assert doc["stage"] == "failed"
    assert doc["agents"][0]["state"] == "failed"
    assert "a: its agent did not come back within 1 s" in str(doc["error"])
    assert not [s for s in said if s.startswith("peer")] and relaunched == []


async def test_an_engine_that_changed_is_said() -> None:
    said: list[str] = []
    nodes = [node("a", said, ["restart.v1"])]
    view = nodes[0]

    class Replaced(Stream):
        def register_again(self) -> None:
            super().register_again()
            view.shards = {"r1": ShardStatus(replica_id="r1", state=ShardState.READY, pid=7)}

    view.session = Replaced(view, said)
    relaunched = asyncio.Event()
    run = service(nodes, said, Peers(said), lambda why: relaunched.set())
    await run.start(ADMIN)
    await asyncio.wait_for(relaunched.wait(), 5)
    assert run.status()["agents"][0]["engines_kept"] is False


async def test_a_control_plane_that_does_not_come_back_stops_the_run_there() -> None:
    said: list[str] = []
    relaunched: list[str] = []
    run = service([], said, Peers(said, back=False), relaunched.append)
    await run.start(ADMIN)
    assert run._task is not None
    await asyncio.wait_for(run._task, 5)
    doc = run.status()
    assert doc["stage"] == "failed" and "cp-b did not come back" in str(doc["error"])
    assert [p["state"] for p in doc["control_planes"]] == ["failed", "waiting", "waiting"]
    assert said[1:] == ["peer restart 10.0.0.2:8444"] and relaunched == []


async def test_agents_are_asked_so_many_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restart_module, "AT_ONCE", 1)
    said: list[str] = []
    relaunched = asyncio.Event()
    nodes = [node(n, said, ["restart.v1"]) for n in ("a", "b")]
    run = service(nodes, said, Peers(said), lambda why: relaunched.set())
    await run.start(ADMIN)
    await asyncio.wait_for(relaunched.wait(), 5)
    assert said[1:5] == ["restart a", "back a", "restart b", "back b"]
