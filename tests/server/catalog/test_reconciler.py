"""The reconciler's rules on synthetic nodes: passes are run by hand with a fake clock,
and the agents' reports are written into the node views as the registry would."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pytest

from llmgw.config import SchedulingConfig
from llmgw.server.catalog.model import Model, Profile, fingerprint, with_change
from llmgw.server.catalog.reconciler import Plan, Reconciler
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.wiring import Wiring
from llmgw.wire.messages import EngineInfo, ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.support import wiring
from tests.support.nodefacts import facts

GIB = 1024**3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(nid: str, address: str | None = None, memory: int = 64, **kw: Any) -> NodeView:
    view = NodeView(
        id=nid,
        cert_serial=1,
        state=NodeState.READY,
        address=address or f"10.0.0.{ord(nid[-1]) % 250}",
        facts=facts(cpu_count=16, memory_total=memory * GIB, memory_available=memory * GIB),
        last_heartbeat=1000.0,
        session=object(),  # type: ignore[arg-type]
        engines=[EngineInfo(name="llama.cpp", path="/x")],
        engines_probed=True,
    )
    for key, value in kw.items():
        setattr(view, key, value)
    return view


def model(replicas: int = 1, **kw: Any) -> Model:
    base = Model(
        name="m",
        source="/models/m.gguf",
        engine="llama.cpp",
        profiles=(Profile(name="default", engine="llama.cpp", replicas=replicas, memory=GIB),),
        context=512,
    )
    return replace(base, **kw)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def reconciler(
    clock: Clock,
    wired: Callable[[Mapping[str, NodeView]], Mapping[str, Wiring]] = lambda views: {},
    **config: Any,
) -> Reconciler:
    """A reconciler on ``clock``; ``wired`` says how the nodes are wired (none known)."""
    defaults: dict[str, Any] = {"node_lost_grace": 30.0, "backoff_base": 10.0}
    config = SchedulingConfig(**{**defaults, **config})
    return wiring.reconciler(config, clock=clock, wiring=wired)


def apply(plan: Plan, nodes: dict[str, NodeView], rec: Reconciler, state: str = "loading") -> None:
    """What the agents would report back: each start running, each stop gone."""
    for start in plan.starts:
        track = rec.tracks[start.replica_id]
        nodes[start.node].shards[start.replica_id] = ShardStatus(
            replica_id=start.replica_id,
            state=ShardState(state),
            fingerprint=track.fingerprint,
            port=start.port,
            source="/models/m.gguf",
        )
    for stop in plan.stops:
        nodes[stop.node].shards.pop(stop.replica_id, None)


def set_state(nodes: dict[str, NodeView], state: str, only: set[str] | None = None) -> None:
    for view in nodes.values():
        for rid, shard in view.shards.items():
            if only is None or rid in only:
                view.shards[rid] = replace(shard, state=ShardState(state))


def fail(view: NodeView, replica_id: str, reason: str) -> None:
    view.shards[replica_id] = replace(
        view.shards[replica_id], state=ShardState.FAILED, reason=reason
    )


def running(nodes: dict[str, NodeView]) -> dict[str, str]:
    return {rid: v.id for v in nodes.values() for rid in v.shards}


def test_starts_what_is_short_then_stops_what_is_over(clock: Clock) -> None:
    nodes = {"a": node("a"), "b": node("b")}
    rec = reconciler(clock)
    m = model(replicas=3)
    plan = rec.plan([m], nodes)
    assert len(plan.starts) == 3 and not plan.stops
    assert len({(s.node, s.port) for s in plan.starts}) == 3
    apply(plan, nodes, rec)
    # Nothing more while they load.
    assert rec.plan([m], nodes).starts == []
    set_state(nodes, "ready")
    m1 = replace(m, profiles=(replace(m.profiles[0], replicas=1),))
    plan = rec.plan([m1], nodes)
    assert len(plan.stops) == 2 and not plan.starts
    apply(plan, nodes, rec)
    assert len(running(nodes)) == 1
    assert rec.plan([m1], nodes) == Plan()
    assert rec.status[("m", "default")].ready == 1


def test_a_change_of_split_starts_the_new_before_stopping_the_old(clock: Clock) -> None:
    nodes = {"a": node("a")}
    rec = reconciler(clock)
    m = model(replicas=2)
    apply(rec.plan([m], nodes), nodes, rec)
    set_state(nodes, "ready")
    old = set(running(nodes))
    cpu2 = Profile(name="cpu2", engine="llama.cpp", replicas=2, memory=GIB)
    split = replace(m, profiles=(replace(m.profiles[0], replicas=0), cpu2))
    plan = rec.plan([split], nodes)
    assert len(plan.starts) == 2 and all(s.profile == "cpu2" for s in plan.starts)
    assert plan.stops == []  # the old two serve until the new two do
    apply(plan, nodes, rec)
    assert rec.plan([split], nodes).stops == []
    set_state(nodes, "ready")
    plan = rec.plan([split], nodes)
    assert {s.replica_id for s in plan.stops} == old


def test_a_changed_profile_is_replaced_one_by_one(clock: Clock) -> None:
    nodes = {"a": node("a")}
    rec = reconciler(clock)
    m = model(replicas=2)
    apply(rec.plan([m], nodes), nodes, rec)
    set_state(nodes, "ready")
    old = set(running(nodes))
    changed = with_change(m, replace(m, context=1024))
    new_fp = fingerprint(changed, changed.profiles[0])
    plan = rec.plan([changed], nodes)
    assert len(plan.starts) == 1 and plan.stops == []
    apply(plan, nodes, rec)
    for left in (1, 0):
        newest = plan.starts[0].replica_id
        assert rec.plan([changed], nodes).starts == []  # one at a time
        set_state(nodes, "ready", {newest})
        # The new one serves: an old one goes, and the next new one starts.
        plan = rec.plan([changed], nodes)
        assert len(plan.stops) == 1 and plan.stops[0].replica_id in old
        assert len(plan.starts) == left
        apply(plan, nodes, rec)
        ready = sum(
            1 for v in nodes.values() for s in v.shards.values() if s.state == ShardState.READY
        )
        assert ready == 2
    assert all(s.fingerprint == new_fp for s in nodes["a"].shards.values())
    assert not old & set(running(nodes))


def test_in_place_stops_one_before_starting_its_replacement(clock: Clock) -> None:
    nodes = {"a": node("a")}
    rec = reconciler(clock)
    m = model(replicas=2)
    apply(rec.plan([m], nodes), nodes, rec)
    set_state(nodes, "ready")
    changed = replace(with_change(m, replace(m, context=1024)), in_place=True)
    plan = rec.plan([changed], nodes)
    assert len(plan.stops) == 1 and len(plan.starts) == 1
    apply(plan, nodes, rec)
    # While the replacement loads, no second old one goes.
    assert rec.plan([changed], nodes).stops == []


def test_a_stale_replica_is_flagged_and_kept(clock: Clock) -> None:
    nodes = {"a": node("a")}
    rec = reconciler(clock)
    m = model(replicas=1)
    apply(rec.plan([m], nodes), nodes, rec)
    set_state(nodes, "ready")
    # The catalog changed without the change being marked (a restored store).
    edited = replace(m, context=2048)
    for _ in range(3):
        plan = rec.plan([edited], nodes)
        assert plan.starts == [] and plan.stops == []
    status = rec.status[("m", "default")]
    assert status.stale == 1 and "model restart m" in status.note
    (rid,) = running(nodes)
    assert rec.describe(rid, {"m": edited})["stale"] is True


def test_failures_back_off_and_go_elsewhere(clock: Clock) -> None:
    nodes = {"a": node("a"), "b": node("b", memory=32)}
    rec = reconciler(clock, backoff_base=10.0)
    m = model()
    plan = rec.plan([m], nodes)
    assert plan.starts[0].node == "b"  # binpack: the fuller node that fits
    apply(plan, nodes, rec)
    fail(nodes["b"], plan.starts[0].replica_id, "boom")
    plan = rec.plan([m], nodes)
    assert [s.reason for s in plan.stops] == ["failed: boom"] and plan.starts == []
    apply(plan, nodes, rec)
    clock.now += 5
    assert rec.plan([m], nodes).starts == []
    assert "next try in" in rec.status[("m", "default")].note
    clock.now += 6
    plan = rec.plan([m], nodes)
    assert [s.node for s in plan.starts] == ["a"]  # away from where it failed
    apply(plan, nodes, rec)
    fail(nodes["a"], plan.starts[0].replica_id, "again")
    apply(rec.plan([m], nodes), nodes, rec)
    clock.now += 15  # second failure: 20 s
    assert rec.plan([m], nodes).starts == []
    clock.now += 6
    plan = rec.plan([m], nodes)
    # Both failed recently: the binpack choice again, as nothing else fits.
    assert [s.node for s in plan.starts] == ["b"]


def test_start_times_out_from_its_last_progress(clock: Clock) -> None:
    nodes = {"a": node("a")}
    rec = reconciler(clock, start_timeout=60.0)
    m = model()
    plan = rec.plan([m], nodes)
    apply(plan, nodes, rec, state="downloading")
    rid = plan.starts[0].replica_id
    nodes["a"].downloads["/models/m.gguf"] = {"replica_ids": [rid], "done": 0}
    for step in range(1, 6):  # five minutes of a slow download, moving all along
        clock.now += 50
        nodes["a"].downloads["/models/m.gguf"]["done"] = step * 1000
        assert rec.plan([m], nodes).stops == []
    clock.now += 61  # it stalls
    plan = rec.plan([m], nodes)
    assert [s.replica_id for s in plan.stops] == [rid]
    assert "after it last made progress" in plan.stops[0].reason


def test_a_lost_node_is_replaced_after_the_grace_and_not_duplicated_on_return(
    clock: Clock,
) -> None:
    nodes = {"a": node("a"), "b": node("b", memory=32)}
    rec = reconciler(clock, node_lost_grace=30.0)
    m = model()
    apply(rec.plan([m], nodes), nodes, rec)
    set_state(nodes, "ready")
    (first,) = running(nodes)
    assert running(nodes)[first] == "b"
    nodes["b"].state, nodes["b"].session = "NotReady", None
    nodes["b"].last_heartbeat = clock.now
    clock.now += 20
    assert rec.plan([m], nodes).starts == []  # within the grace
    clock.now += 15
    plan = rec.plan([m], nodes)
    assert [s.node for s in plan.starts] == ["a"]
    apply(plan, nodes, rec)
    # b returns still running the old one, before the new one is Ready.
    nodes["b"].state, nodes["b"].session = "Ready", object()  # type: ignore[assignment]
    nodes["b"].last_heartbeat = clock.now
    plan = rec.plan([m], nodes)
    assert [s.replica_id for s in plan.stops] == [plan_start_id(nodes, "a")]
    apply(plan, nodes, rec)
    assert list(running(nodes)) == [first]


def plan_start_id(nodes: dict[str, NodeView], nid: str) -> str:
    (rid,) = nodes[nid].shards
    return rid


def test_after_a_restart_nothing_is_placed_until_the_nodes_report(clock: Clock) -> None:
    nodes = {"a": node("a"), "b": node("b")}
    nodes["b"].last_heartbeat = None  # known from the store, not heard from yet
    nodes["b"].state = "NotReady"
    rec = reconciler(clock, node_lost_grace=30.0)
    m = model()
    assert rec.plan([m], nodes).starts == []
    assert "waiting for every node" in rec.status[("m", "default")].note
    clock.now += 31
    assert len(rec.plan([m], nodes).starts) == 1


def test_a_draining_node_is_emptied_after_the_replacement_serves(clock: Clock) -> None:
    nodes = {"a": node("a"), "b": node("b", memory=32)}
    rec = reconciler(clock)
    m = model()
    apply(rec.plan([m], nodes), nodes, rec)
    set_state(nodes, "ready")
    (on_b,) = running(nodes)
    nodes["b"].draining = nodes["b"].cordoned = True
    plan = rec.plan([m], nodes)
    assert [s.node for s in plan.starts] == ["a"] and plan.stops == []
    apply(plan, nodes, rec)
    set_state(nodes, "ready")
    plan = rec.plan([m], nodes)
    assert [(s.replica_id, s.reason) for s in plan.stops] == [(on_b, "its node is draining")]


def test_on_demand_waits_for_demand_and_parks_after_failures(clock: Clock) -> None:
    nodes = {"a": node("a")}
    rec = reconciler(clock, backoff_base=1.0, park_after=3, on_demand_idle=100.0)
    m = model(on_demand=True)
    assert rec.plan([m], nodes).starts == []
    rec.want("m")
    parks: list[tuple[str, str]] = []
    for _ in range(3):
        plan = rec.plan([m], nodes)
        assert len(plan.starts) == 1
        apply(plan, nodes, rec)
        fail(nodes["a"], plan.starts[0].replica_id, "oom")
        plan = rec.plan([m], nodes)
        parks += plan.parks
        apply(plan, nodes, rec)
        clock.now += 5
    plan = rec.plan([m], nodes)
    parks += plan.parks
    assert parks and parks[0][0] == "m" and "failed 3 times in a row" in parks[0][1]
    assert rec.desired(replace(m, parked=parks[0][1]), m.profiles[0], clock.now) == 0
    # Idle past its period, an on-demand model goes back to zero.
    clock.now += 200
    assert rec.desired(m, m.profiles[0], clock.now) == 0


def test_two_agents_on_one_host_get_different_ports(clock: Clock) -> None:
    nodes = {"a": node("a", address="10.9.9.9"), "b": node("b", address="10.9.9.9")}
    rec = reconciler(clock, engine_ports="42000-42003")
    m = model(replicas=4)
    plan = rec.plan([m], nodes)
    assert sorted(s.port for s in plan.starts) == [42000, 42001, 42002, 42003]
    apply(plan, nodes, rec)
    more = replace(m, profiles=(replace(m.profiles[0], replicas=5),))
    rec.plan([more], nodes)
    assert "no free engine port" in rec.status[("m", "default")].note


def test_replicas_of_a_removed_model_stop_and_hand_started_shards_are_left(
    clock: Clock,
) -> None:
    nodes = {"a": node("a")}
    rec = reconciler(clock)
    m = model()
    apply(rec.plan([m], nodes), nodes, rec)
    nodes["a"].shards["r1"] = ShardStatus(
        replica_id="r1", state=ShardState.READY, fingerprint="direct", port=1
    )
    plan = rec.plan([], nodes)
    assert [s.reason for s in plan.stops] == ["its model is no longer in the catalog"]
    assert "r1" not in {s.replica_id for s in plan.stops}


def test_a_profile_nowhere_to_go_says_why_by_reason(clock: Clock) -> None:
    nodes = {"a": node("a"), "b": node("b"), "c": node("c", cordoned=True)}
    rec = reconciler(clock)
    big = replace(model(), profiles=(replace(model().profiles[0], memory=500 * GIB),))
    assert rec.plan([big], nodes).starts == []
    note = rec.status[("m", "default")].note
    assert note.startswith("no node fits (memory: 2 nodes, node cordoned: 1 node)")
    assert "llmgw ctl explain m" in note
    # Lending by policy takes a node back from Slurm for a model with nowhere to go.
    assert rec.unplaced == {"m": note}
    rec.plan([model()], nodes)  # one that fits: placed, nothing unplaced any more
    assert rec.unplaced == {}
