"""``Dispatch``: a pass of a real reconciler carried out on fake agent sessions. Stops go
down before starts, each start is the replica's spec (with the engine key derived from
the cluster secret and the version the cluster wants), a start whose node went away is
abandoned and counted as a failure, a replica spanning nodes gets one spec per node
with its peers' addresses, parks go through the park hook, and ``passes`` counts each
pass (the run loop's, too, woken by ``wake``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from llmgw import pki
from llmgw.config import SchedulingConfig
from llmgw.server.catalog import model as catalog
from llmgw.server.catalog.dispatch import Dispatch
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.catalog.reconciler import Reconciler
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.store import SQLiteStore
from llmgw.wire.messages import EngineInfo, ShardStatus, StartShard, StopShard
from llmgw.wire.states import NodeState, ShardState
from tests.support import nodefacts, wiring
from tests.support.agentsession import FakeSession

GIB = 1024**3
SECRET = b"the cluster secret"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Loop:
    """A Dispatch over a real reconciler and registry, its catalog and what it parked."""

    dispatch: Dispatch
    reconciler: Reconciler
    registry: NodeRegistry
    clock: Clock
    models: dict[str, Model]
    parked: list[tuple[str, str]] = field(default_factory=list)

    def node(self, node_id: str, address: str | None = None, connected: bool = True) -> NodeView:
        """A Ready node with 64 GiB and llama.cpp, heard from now; its session a fake."""
        view = NodeView(
            id=node_id,
            cert_serial=1,
            state=NodeState.READY,
            address=address,
            facts=nodefacts.facts(
                cpu_count=16, memory_total=64 * GIB, memory_available=64 * GIB, gpus=[]
            ),
            last_heartbeat=self.clock.now,
            session=FakeSession() if connected else None,
            engines=[EngineInfo(name="llama.cpp", path="/x", version="b4321")],
            engines_probed=True,
        )
        self.registry.nodes[node_id] = view
        return view

    def serve(
        self, name: str = "m", memory: int = GIB, nodes: int = 1, on_demand: bool = False
    ) -> Model:
        """A llama.cpp model of one replica of ``memory`` on each of ``nodes``."""
        profile = Profile(
            name="default", engine="llama.cpp", replicas=1, memory=memory, nodes=nodes
        )
        model = Model(
            name=name,
            source=f"/models/{name}.gguf",
            engine="llama.cpp",
            profiles=(profile,),
            context=512,
            on_demand=on_demand,
        )
        self.models[name] = model
        return model


@pytest.fixture
async def loop(tmp_path: Path) -> AsyncIterator[Loop]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    clock = Clock()
    config = SchedulingConfig(backoff_base=10.0, park_after=1, interval=60.0)
    reconciler = wiring.reconciler(config, clock=clock, engine_version=lambda e: "b4321")
    registry = wiring.registry(store)
    models: dict[str, Model] = {}
    parked: list[tuple[str, str]] = []

    async def park(name: str, reason: str) -> None:
        parked.append((name, reason))

    dispatch = Dispatch(reconciler, registry, models, SECRET, config, asyncio.Event(), park)
    try:
        yield Loop(dispatch, reconciler, registry, clock, models, parked)
    finally:
        await store.close()


def session(view: NodeView) -> FakeSession:
    assert isinstance(view.session, FakeSession)
    return view.session


def starts(view: NodeView) -> list[StartShard]:
    return [m for m in session(view).sent if isinstance(m, StartShard)]


def report(view: NodeView, sent: StartShard, state: ShardState) -> None:
    """What the agent says back of a start it was sent."""
    spec = sent.spec
    view.shards[spec.replica_id] = ShardStatus(
        replica_id=spec.replica_id,
        state=state,
        fingerprint=spec.fingerprint,
        port=spec.port,
        source=spec.source,
        reason="out of memory" if state == ShardState.FAILED else "",
    )


async def test_a_pass_sends_the_stops_then_the_starts_with_the_replicas_spec(
    loop: Loop,
) -> None:
    a = loop.node("a")
    # A replica of a model gone from the catalog, and a model with none yet.
    a.shards["gone.default.0123abcd"] = ShardStatus(
        replica_id="gone.default.0123abcd", state=ShardState.READY, fingerprint="f", port=41000
    )
    model = loop.serve("m")
    plan = await loop.dispatch.reconcile()
    assert loop.dispatch.passes == 1 and loop.dispatch.last_plan is plan
    (start,) = plan.starts
    first, second = session(a).sent
    assert first == StopShard(replica_id="gone.default.0123abcd")
    assert isinstance(second, StartShard)
    spec = second.spec
    ((node, expected),) = catalog.start_specs(model, model.profiles[0], start, {}, SECRET)
    assert node == "a" and start.node == "a"
    assert spec.engine_version == "b4321"  # the version the cluster wants, added here
    assert spec.key == pki.engine_key(SECRET, start.replica_id)
    assert spec == replace(expected, engine_version="b4321")
    assert (spec.replica_id, spec.source, spec.port) == (
        start.replica_id,
        "/models/m.gguf",
        start.port,
    )

    # Reported loading, the next pass sends nothing more.
    report(a, second, ShardState.LOADING)
    a.shards.pop("gone.default.0123abcd")
    await loop.dispatch.reconcile()
    assert len(session(a).sent) == 2 and loop.dispatch.passes == 2


async def test_a_start_whose_node_went_away_is_abandoned_as_a_failure(loop: Loop) -> None:
    gone = loop.node("a", connected=False)  # still Ready to the reconciler, no stream
    loop.serve("m")
    plan = await loop.dispatch.reconcile()
    (start,) = plan.starts
    assert start.node == "a" and gone.session is None
    assert start.replica_id not in loop.reconciler.tracks
    health = loop.reconciler.health[("m", "default")]
    assert (health.consecutive, health.last_reason) == (1, "node not connected")
    # Its profile backs off before trying again.
    plan = await loop.dispatch.reconcile()
    assert plan.starts == []
    status = loop.reconciler.status_of("m", "default")
    assert status is not None and "last: node not connected" in status.note


async def test_a_replica_spanning_nodes_gets_one_spec_per_node_with_its_peers(
    loop: Loop,
) -> None:
    a = loop.node("a", address="10.0.0.1")
    b = loop.node("b", address="10.0.0.2")
    loop.serve("wide", memory=40 * GIB, nodes=2)
    plan = await loop.dispatch.reconcile()
    (start,) = plan.starts
    (worker,) = start.workers
    views = {"a": a, "b": b}
    (leader_sent,) = starts(views[start.node])
    (worker_sent,) = starts(views[worker.node])
    leader, member = leader_sent.spec, worker_sent.spec
    assert (leader.replica_id, member.replica_id) == (start.replica_id, f"{start.replica_id}~1")
    addresses = {"a": "10.0.0.1", "b": "10.0.0.2"}
    lead_at, work_at = addresses[start.node], addresses[worker.node]
    assert leader.group is not None and member.group is not None
    assert (leader.group.rank, member.group.rank) == (0, 1)
    assert leader.group.size == member.group.size == 2
    assert leader.group.leader == member.group.leader == lead_at
    assert leader.group.workers == member.group.workers == [f"{work_at}:{worker.port}"]
    assert leader.group.peers == member.group.peers == ["10.0.0.1", "10.0.0.2"]
    assert (leader.group.bind, member.group.bind) == (lead_at, work_at)
    # Each shard's key is its own.
    assert leader.key == pki.engine_key(SECRET, start.replica_id)
    assert member.key == pki.engine_key(SECRET, f"{start.replica_id}~1")
    assert leader.engine_version == member.engine_version == "b4321"


async def test_a_spanning_start_with_a_node_of_no_address_is_abandoned(loop: Loop) -> None:
    a = loop.node("a", address="10.0.0.1")
    b = loop.node("b", address=None)
    loop.serve("wide", memory=40 * GIB, nodes=2)
    plan = await loop.dispatch.reconcile()
    (start,) = plan.starts
    assert session(a).sent == [] and session(b).sent == []
    assert start.replica_id not in loop.reconciler.tracks
    assert loop.reconciler.health[("wide", "default")].consecutive == 1


async def test_a_failing_on_demand_model_is_stopped_and_parked_through_the_hook(
    loop: Loop,
) -> None:
    a = loop.node("a")
    loop.serve("m", on_demand=True)
    loop.reconciler.want("m")
    await loop.dispatch.reconcile()
    (sent,) = starts(a)
    report(a, sent, ShardState.FAILED)
    plan = await loop.dispatch.reconcile()
    assert plan.parks == loop.parked
    assert loop.parked == [("m", "failed 1 times in a row, last: out of memory")]
    assert session(a).sent[-1] == StopShard(replica_id=sent.spec.replica_id)


async def wait_for(condition: Callable[[], bool]) -> None:
    """Until ``condition`` holds (a counter moved), or fail after a few seconds."""
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.01)


async def test_the_loop_passes_at_once_then_on_each_wake_until_stopped(loop: Loop) -> None:
    a = loop.node("a")
    stop = asyncio.Event()
    running = asyncio.create_task(loop.dispatch.run(stop))
    try:
        await wait_for(lambda: loop.dispatch.passes == 1)
        assert session(a).sent == []
        loop.serve("m")
        loop.dispatch.wake.set()  # the catalog changed: a pass now, not in 60 s
        await wait_for(lambda: loop.dispatch.passes == 2)
        assert len(starts(a)) == 1
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)
    assert running.done() and running.exception() is None


async def test_a_pass_that_fails_does_not_end_the_loop(loop: Loop) -> None:
    a = loop.node("a")
    loop.serve("m", on_demand=True)
    loop.reconciler.want("m")
    await loop.dispatch.reconcile()
    report(a, starts(a)[0], ShardState.FAILED)

    tried: list[str] = []

    async def broken_park(name: str, reason: str) -> None:
        tried.append(name)
        raise RuntimeError("the store went away")

    loop.dispatch.park = broken_park
    stop = asyncio.Event()
    running = asyncio.create_task(loop.dispatch.run(stop))
    try:
        await wait_for(lambda: loop.dispatch.passes == 2)
        assert tried == ["m"]  # that pass failed at its park, and the loop goes on
        loop.dispatch.wake.set()
        await wait_for(lambda: loop.dispatch.passes == 3)
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)
