"""What the replicas hold on each node: the reserve placement takes from what the node
reports free."""

from __future__ import annotations

from llmgw.server.catalog.holdings import capacities
from llmgw.server.catalog.model import Profile
from llmgw.server.catalog.tracks import Track
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.states import NodeState, ShardState
from tests.support.nodefacts import facts

GIB = 2**30
PROFILE = Profile(name="default", engine="llama.cpp", memory=4 * GIB)


def node(**figures: int) -> NodeView:
    return NodeView(
        id="n1", cert_serial=1, state=NodeState.READY, facts=facts(cpu_count=8, **figures)
    )


def track(state: ShardState) -> Track:
    return Track("m.default.a1", "m", "default", "n1", "fp", state, moved_at=0.0)


def reserved(view: NodeView, *tracks: Track) -> int:
    (cap,) = capacities(tracks, {("m", "default"): PROFILE}, {"n1": view}, {})
    return cap.memory_reserved


def test_a_loading_replica_holds_its_whole_figure() -> None:
    view = node(memory_total=32 * GIB, memory_available=30 * GIB)
    assert reserved(view) == 0
    assert reserved(view, track(ShardState.LOADING)) == 4 * GIB


def test_a_loaded_replica_holds_what_it_has_not_touched_yet() -> None:
    # 1 GiB of the node in use, all of it the replica's: 3 GiB of its promise to come.
    view = node(memory_total=32 * GIB, memory_available=31 * GIB)
    assert reserved(view, track(ShardState.READY)) == 3 * GIB
    # Its whole promise in use: nothing more to hold back.
    view = node(memory_total=32 * GIB, memory_available=28 * GIB)
    assert reserved(view, track(ShardState.READY)) == 0


def test_memory_in_use_not_read_reserves_the_whole_promise_and_no_more() -> None:
    # The node said what is free but not its total: what is in use is unknown, so a
    # loaded replica keeps its whole promise, and nothing running reserves nothing (an
    # absent total once counted as a negative use, reserving what the node had free).
    view = node(memory_available=8 * GIB)
    assert reserved(view) == 0
    assert reserved(view, track(ShardState.READY)) == 4 * GIB
