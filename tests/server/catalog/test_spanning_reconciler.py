"""The reconciler with replicas spanning nodes: placed as one group, every node's share
reserved, a worker failing or its node lost failing the whole replica (placed again as
one), orphaned workers stopped, and the groups rebuilt from the agents' reports after
a control plane restart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.server.catalog.model import Model, Profile
from llmgw.server.catalog.reconciler import Plan, Reconciler
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.wiring import Wiring
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.server.catalog.test_reconciler import GIB, Clock, node, reconciler


@pytest.fixture
def clock() -> Clock:
    return Clock()


def wide(nodes: int = 2, replicas: int = 1) -> Model:
    profile = Profile(
        name="default", engine="llama.cpp", replicas=replicas, memory=40 * GIB, nodes=nodes
    )
    return Model(
        name="m", source="/models/m.gguf", engine="llama.cpp", profiles=(profile,), context=512
    )


def report(plan: Plan, nodes: dict[str, NodeView], rec: Reconciler, state: str) -> None:
    """What the agents say back: every shard of every start (leader and workers)."""
    for start in plan.starts:
        fp = rec.tracks[start.replica_id].fingerprint
        shares = [(start.replica_id, start.node, start.port, 0)]
        shares += [(f"{start.replica_id}~{w.rank}", w.node, w.port, w.rank) for w in start.workers]
        for sid, nid, port, rank in shares:
            nodes[nid].shards[sid] = ShardStatus(
                replica_id=sid,
                state=ShardState(state),
                fingerprint=fp,
                port=port,
                source="/models/m.gguf",
                rank=rank if start.workers else None,
            )
    for stop in plan.stops:
        nodes[stop.node].shards.pop(stop.replica_id, None)


def shards(nodes: dict[str, NodeView]) -> dict[str, str]:
    return {sid: v.id for v in nodes.values() for sid in v.shards}


def test_one_replica_takes_two_nodes_with_a_port_each_and_reserves_both(clock: Clock) -> None:
    nodes = {n: node(n) for n in "abc"}
    rec = reconciler(clock)
    plan = rec.plan([wide()], nodes)
    (start,) = plan.starts
    (worker,) = start.workers
    assert worker.rank == 1 and worker.node != start.node
    assert start.rendezvous_port is None  # llama.cpp meets over --rpc, not a rendezvous
    report(plan, nodes, rec, "loading")
    taken = {start.node, worker.node}
    # Each of the two nodes holds its 40 GiB share of the 64: a second replica does not
    # fit beside it on either, only the third node is left for one of its halves.
    caps = {c.id: c for c in rec.capacities(nodes)}
    for nid in taken:
        assert caps[nid].memory_reserved == 40 * GIB
    (free,) = set(nodes) - taken
    assert caps[free].memory_reserved == 0
    plan = rec.plan([wide(replicas=2)], nodes)
    assert plan.starts == []
    assert rec.status[("m", "default")].note.startswith(
        "no 2 nodes wired together fit (nodes without InfiniBand: 1 node(s) fit, 2 needed)"
    )


def test_a_failed_worker_fails_the_whole_replica_which_is_placed_again_as_one(
    clock: Clock,
) -> None:
    nodes = {n: node(n) for n in "ab"}
    rec = reconciler(clock, backoff_base=1.0)
    plan = rec.plan([wide()], nodes)
    report(plan, nodes, rec, "ready")
    (start,) = plan.starts
    rid = start.replica_id
    worker_id = f"{rid}~1"
    assert rec.plan([wide()], nodes).starts == []
    assert rec.status[("m", "default")].ready == 1

    view = nodes[start.workers[0].node]
    view.shards[worker_id] = replace(
        view.shards[worker_id], state=ShardState.FAILED, reason="the engine exited (code -9)"
    )
    plan = rec.plan([wide()], nodes)
    assert sorted((s.replica_id, s.node) for s in plan.stops) == sorted(
        [(rid, start.node), (worker_id, start.workers[0].node)]
    )
    assert "rank 1 on" in plan.stops[0].reason and "code -9" in plan.stops[0].reason
    report(plan, nodes, rec, "ready")
    assert shards(nodes) == {}
    clock.now += 2  # past the backoff
    plan = rec.plan([wide()], nodes)
    (again,) = plan.starts
    assert again.replica_id != rid and len(again.workers) == 1


def test_a_lost_worker_node_fails_the_replica_and_it_goes_where_two_nodes_are(
    clock: Clock,
) -> None:
    nodes = {n: node(n) for n in "abc"}
    rec = reconciler(clock, node_lost_grace=30.0, backoff_base=1.0)
    plan = rec.plan([wide()], nodes)
    report(plan, nodes, rec, "ready")
    (start,) = plan.starts
    lost = start.workers[0].node
    nodes[lost].state, nodes[lost].session = NodeState.NOT_READY, None
    nodes[lost].last_heartbeat = clock.now
    clock.now += 31
    plan = rec.plan([wide()], nodes)
    # Both shards are told to stop (the service sends only where a node is connected;
    # the lost node is told again when it is back).
    assert sorted((s.replica_id, s.node) for s in plan.stops) == sorted(
        [(start.replica_id, start.node), (f"{start.replica_id}~1", lost)]
    )
    assert f"its node {lost} was lost" in plan.stops[0].reason
    nodes[start.node].shards.pop(start.replica_id)
    clock.now += 2
    plan = rec.plan([wide()], nodes)
    (again,) = plan.starts
    assert lost not in {again.node, again.workers[0].node}

    # The node returns still running the old worker: an orphan, stopped.
    nodes[lost].state, nodes[lost].session = NodeState.READY, object()  # type: ignore[assignment]
    nodes[lost].last_heartbeat = clock.now
    plan = rec.plan([wide()], nodes)
    assert (f"{start.replica_id}~1", lost) in [(s.replica_id, s.node) for s in plan.stops]


def test_groups_are_rebuilt_from_the_reports_after_a_restart(clock: Clock) -> None:
    nodes = {n: node(n) for n in "ab"}
    first = reconciler(clock)
    plan = first.plan([wide()], nodes)
    report(plan, nodes, first, "ready")
    (start,) = plan.starts
    # A new control plane knows only what the agents report.
    rec = reconciler(clock)
    plan = rec.plan([wide()], nodes)
    assert plan.starts == [] and plan.stops == []
    track = rec.tracks[start.replica_id]
    assert [(w.rank, w.node) for w in track.workers] == [(1, start.workers[0].node)]
    assert rec.status[("m", "default")].ready == 1
    described = rec.describe(f"{start.replica_id}~1", {"m": wide()}, track.fingerprint)
    assert described["model"] == "m" and "rank 1 of" in described["note"]


def test_a_worker_whose_leader_is_gone_is_stopped_once_the_nodes_reported(clock: Clock) -> None:
    nodes = {n: node(n) for n in "ab"}
    nodes["a"].shards["m.default.0000abcd~1"] = ShardStatus(
        replica_id="m.default.0000abcd~1", state=ShardState.READY, port=42000, rank=1
    )
    nodes["b"].last_heartbeat = None
    rec = reconciler(clock, node_lost_grace=30.0)
    plan = rec.plan([wide(replicas=0)], nodes)
    assert plan.stops == []  # b may yet report the leader
    nodes["b"].last_heartbeat = clock.now
    plan = rec.plan([wide(replicas=0)], nodes)
    assert [(s.replica_id, s.node) for s in plan.stops] == [("m.default.0000abcd~1", "a")]
    # Told once; not again on every pass while the agent stops it.
    assert rec.plan([wide(replicas=0)], nodes).stops == []


def test_the_wiring_decides_the_set_and_an_nvlink_domain_comes_first(clock: Clock) -> None:
    nodes = {n: node(n) for n in ("f1", "f2", "f3", "v1", "v2")}
    wired = {
        "f1": Wiring(fabric="0xa", leaves=("leaf1",)),
        "f2": Wiring(fabric="0xa", leaves=("leaf2",)),
        "f3": Wiring(fabric="0xa", leaves=("leaf1",)),
        "v1": Wiring(nvlink_domain="uuid/1"),
        "v2": Wiring(nvlink_domain="uuid/1"),
    }
    rec = reconciler(clock, lambda views: wired)
    (start,) = rec.plan([wide()], nodes).starts
    assert {start.node, start.workers[0].node} == {"v1", "v2"} and start.nvlink
    # With the domain full, one fabric's two nodes under the same leaf.
    rec2 = reconciler(clock, lambda views: {k: v for k, v in wired.items() if k[0] == "f"})
    (start,) = rec2.plan([wide()], {k: v for k, v in nodes.items() if k[0] == "f"}).starts
    assert {start.node, start.workers[0].node} == {"f1", "f3"} and not start.nvlink


def test_a_worker_s_download_moving_keeps_the_replica_from_timing_out(clock: Clock) -> None:
    """The leader waits for its workers while one fetches its weights: the bytes the
    worker's node reports are the replica's progress, and the start timeout counts from
    the last of them."""
    nodes = {n: node(n) for n in "ab"}
    rec = reconciler(clock, start_timeout=60.0)
    plan = rec.plan([wide()], nodes)
    (start,) = plan.starts
    (worker,) = start.workers
    report(plan, nodes, rec, "loading")
    sid = f"{start.replica_id}~1"
    nodes[worker.node].shards[sid] = replace(
        nodes[worker.node].shards[sid], state=ShardState.DOWNLOADING
    )
    fetching = {"source": "/models/m.gguf", "replica_ids": [sid], "done": 0}
    nodes[worker.node].downloads["/models/m.gguf"] = fetching
    for step in range(1, 5):  # four minutes of the worker's download, moving all along
        fetching["done"] = step * 1000
        assert rec.plan([wide()], nodes).stops == []
        clock.now += 50
        assert rec.plan([wide()], nodes).stops == []
    clock.now += 11  # the worker's download stalls: 61 s since its last byte
    stops = rec.plan([wide()], nodes).stops
    assert {s.replica_id for s in stops} == {start.replica_id, sid}
    assert "after it last made progress" in stops[0].reason
