"""``EnginePorts``: the engine ports handed out per host address (two agents on one
machine share its ports), never one in use (reported by an agent or held by a start not
reported yet) nor one an engine just found taken on that node; a replica spanning nodes
gets a port on each, and a rendezvous port on its leader where its engine meets there;
a placement that cannot have every port it needs takes none."""

from __future__ import annotations

import pytest

from llmgw.server.catalog.ports import BAD_FOR, EnginePorts, host, port_range
from llmgw.server.catalog.scheduler import Placement, Request
from llmgw.server.catalog.tracks import Member, Track
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import ShardState


def node(node_id: str, address: str | None = None, *ports: int) -> NodeView:
    view = NodeView(id=node_id, cert_serial=1, address=address)
    for i, port in enumerate(ports):
        rid = f"m.default.{i:08x}"
        view.shards[rid] = ShardStatus(replica_id=rid, state=ShardState.READY, port=port)
    return view


def track(node_id: str, port: int | None, **kw: object) -> Track:
    made = Track("m.default.0000ffff", "m", "default", node_id, None, ShardState.PENDING, 0.0)
    made.port = port
    for key, value in kw.items():
        setattr(made, key, value)
    return made


def placement(engine: str, leader: str, *workers: str) -> Placement:
    request = Request(
        model="m", profile="default", engine=engine, source="/m", nodes=1 + len(workers)
    )
    return Placement(request, leader, workers=tuple((w, ()) for w in workers))


def test_a_range_is_both_ends_included() -> None:
    assert list(port_range("41000-41003")) == [41000, 41001, 41002, 41003]
    assert list(port_range("8080-8080")) == [8080]
    with pytest.raises(ValueError):
        port_range("41000")


def test_a_node_is_its_address_or_else_its_id() -> None:
    assert host(node("a", "10.0.0.1")) == "10.0.0.1" and host(node("a")) == "a"


def test_ports_in_use_are_the_reported_and_the_held_by_host() -> None:
    nodes = {
        "a": node("a", "10.0.0.1", 41000, 41002),
        # A second agent on the same machine: its ports are the machine's.
        "a2": node("a2", "10.0.0.1", 41005),
        "b": node("b", "10.0.0.2"),
        "c": node("c"),
    }
    tracks = [
        track("b", 41001, rendezvous_port=41009, workers=[Member(1, "c", port=41003)]),
        track("gone", 41004),  # its node is no longer known: holds nothing
        track("b", None),
    ]
    assert EnginePorts("41000-41010").used(nodes, tracks) == {
        "10.0.0.1": {41000, 41002, 41005},
        "10.0.0.2": {41001, 41009},
        "c": {41003},
    }


def test_take_skips_what_is_used_on_the_host_and_marks_what_it_gives() -> None:
    ports = EnginePorts("41000-41003")
    a, twin = node("a", "10.0.0.1"), node("twin", "10.0.0.1")
    used = {"10.0.0.1": {41000}}
    assert ports.take(a, used, now=0.0) == 41001
    assert ports.take(twin, used, now=0.0) == 41002  # the same machine
    assert ports.take(node("b", "10.0.0.2"), used, now=0.0) == 41000
    assert ports.take(a, used, now=0.0) == 41003
    assert ports.take(a, used, now=0.0) is None  # the range is spent on this host
    assert used == {"10.0.0.1": {41000, 41001, 41002, 41003}, "10.0.0.2": {41000}}


def test_a_port_an_engine_found_taken_is_not_given_on_that_node_for_a_while() -> None:
    ports = EnginePorts("41000-41001")
    a, b = node("a", "10.0.0.1"), node("b", "10.0.0.2")
    ports.bad[("a", 41000)] = 100.0
    assert ports.take(a, {}, now=100.0 + BAD_FOR - 1) == 41001
    assert ports.take(b, {}, now=100.0) == 41000  # another node may use it
    assert ports.take(a, {}, now=100.0 + BAD_FOR) == 41000  # and this one again, later


def test_a_replica_on_one_node_gets_one_port() -> None:
    ports = EnginePorts("41000-41010")
    nodes = {"a": node("a", "10.0.0.1")}
    assert ports.for_placement(placement("vllm", "a"), nodes, {}, 0.0) == (41000, None, [])


def test_a_spanning_replica_gets_a_port_on_each_node_and_a_rendezvous_where_it_meets() -> None:
    ports = EnginePorts("41000-41010")
    nodes = {"a": node("a", "10.0.0.1"), "b": node("b", "10.0.0.2"), "c": node("c", "10.0.0.3")}
    used: dict[str, set[int]] = {"10.0.0.2": {41000}}
    assert ports.for_placement(placement("vllm", "a", "b", "c"), nodes, used, 0.0) == (
        41000,
        41001,
        [41001, 41000],
    )
    # llama.cpp's workers are reached over --rpc: no rendezvous.
    assert ports.for_placement(placement("llama.cpp", "a", "b"), nodes, used, 0.0) == (
        41002,
        None,
        [41002],
    )
    assert used == {
        "10.0.0.1": {41000, 41001, 41002},
        "10.0.0.2": {41000, 41001, 41002},
        "10.0.0.3": {41000},
    }


def test_a_placement_that_cannot_have_every_port_takes_none() -> None:
    ports = EnginePorts("41000-41001")
    nodes = {"a": node("a", "10.0.0.1"), "b": node("b", "10.0.0.2")}
    used = {"10.0.0.2": {41000, 41001}}
    assert ports.for_placement(placement("llama.cpp", "a", "b"), nodes, used, 0.0) is None
    assert used["10.0.0.1"] == set()
    # Room for the leader's port but not its rendezvous: none taken either.
    one = EnginePorts("41000-41000")
    used = {}
    assert one.for_placement(placement("sglang", "a", "b"), nodes, used, 0.0) is None
    assert used == {"10.0.0.1": set(), "10.0.0.2": set()}
