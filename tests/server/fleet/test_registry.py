"""Readiness: Ready on register, NotReady after missed heartbeats, Ready again on word."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from llmgw.server.fleet.registry import NodeRegistry, RegistryHooks
from llmgw.server.store import Audit, SQLiteStore
from llmgw.wire import GPU, Disk, Heartbeat, HostFacts, Register
from llmgw.wire.hardware import CardLinks, GpuTopology
from llmgw.wire.messages import KvBlocks, ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.support import wiring


class FakeSession:
    def __init__(self) -> None:
        self.closed: str | None = None

    def close(self, reason: str) -> None:
        self.closed = reason


async def _registry(tmp_path: Path, hooks: RegistryHooks = wiring.QUIET) -> NodeRegistry:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    reg = NodeRegistry(store, heartbeat_interval=5.0, missed_heartbeats=3, hooks=hooks)
    await reg.enrolled("n1", 42)
    return reg


def _register() -> Register:
    host = HostFacts(
        hostname="n1", os="linux", arch="x86_64", memory_total=100, memory_available=50
    )
    return Register(node_id="n1", version="0.1", host=host)


async def test_ready_notready_ready(tmp_path: Path) -> None:
    reg = await _registry(tmp_path)
    assert reg.certificate_ok("n1", 42) and not reg.certificate_ok("n1", 43)
    session = FakeSession()
    await reg.register(_register(), session)
    view = reg.nodes["n1"]
    assert view.state == NodeState.READY
    start = view.last_heartbeat
    assert start is not None
    assert reg.sweep(now=start + 14.9) == []
    assert reg.sweep(now=start + 15.1) == ["n1"]
    assert view.state == NodeState.NOT_READY and "missed 3 heartbeats" in view.reason
    await reg.flush()
    stored = await reg.store.get_node("n1")
    assert stored is not None and stored.state == NodeState.NOT_READY

    reg.heartbeat(
        "n1",
        Heartbeat(
            seq=1, memory_available=7, disks=[Disk(path="/", fstype="ext4", total=10, free=5)]
        ),
    )
    assert view.state == NodeState.READY
    shown = view.as_json()
    # Live figures override the ones from Register; absent ones keep the last known.
    assert shown["memory_available"] == 7 and shown["memory_total"] == 100
    assert shown["disks"] == [
        {"path": "/", "fstype": "ext4", "total": 10, "free": 5, "shared": False}
    ]
    assert shown["cpu_percent"] is None
    await reg.flush()
    stored = await reg.store.get_node("n1")
    assert stored is not None and stored.state == NodeState.READY
    await reg.store.close()


async def test_reenrolled_node_drops_its_old_stream(tmp_path: Path) -> None:
    reg = await _registry(tmp_path)
    old = FakeSession()
    await reg.register(_register(), old)
    await reg.enrolled("n1", 99)
    assert old.closed and "new certificate" in old.closed
    assert reg.certificate_ok("n1", 99) and not reg.certificate_ok("n1", 42)
    await reg.store.close()


async def test_second_connection_replaces_first(tmp_path: Path) -> None:
    reg = await _registry(tmp_path)
    first, second = FakeSession(), FakeSession()
    await reg.register(_register(), first)
    await reg.register(_register(), second)
    assert first.closed and "replaced" in first.closed and second.closed is None
    reg.disconnected("n1", first)  # the old one's end must not unhook the new one
    assert reg.nodes["n1"].session is second
    await reg.store.close()


async def test_restart_loads_nodes_not_ready(tmp_path: Path) -> None:
    reg = await _registry(tmp_path)
    await reg.register(_register(), FakeSession())
    # Registrations are written in batches, with the monitor's next flush.
    stored = await reg.store.get_node("n1")
    assert stored is not None and stored.state == NodeState.NOT_READY and stored.facts is None
    await reg.flush()
    stored = await reg.store.get_node("n1")
    assert stored is not None and stored.state == NodeState.READY and stored.facts
    await reg.store.close()
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    again = wiring.registry(store)
    await again.load()
    view = again.nodes["n1"]
    assert view.state == NodeState.NOT_READY and "waiting for its agent" in view.reason
    # The store's facts, typed again: the host the agent registered.
    assert view.facts == _register().host and view.cert_serial == 42
    assert view.as_json()["memory_total"] == 100
    assert again.counts() == {"total": 1, "ready": 0, "not_ready": 1}
    await again.flush()
    stored = await store.get_node("n1")
    assert stored is not None and stored.state == NodeState.NOT_READY
    await store.close()


def _rich_host() -> HostFacts:
    """Facts with every kind of record in them: cards, disks, the topology, warnings."""
    return HostFacts(
        hostname="n1",
        os="linux",
        arch="x86_64",
        kernel="6.8",
        cpu_count=16,
        cpu_flags=["avx2"],
        memory_total=100,
        memory_available=50,
        cpu_percent=3.0,
        load=[0.5, 0.25, 0.0],
        disks=[Disk(path="/", fstype="ext4", total=10, free=5)],
        gpus=[GPU(index=0, uuid="GPU-a", name="H100", memory_total=80, throttle=[])],
        warnings=["pcie: card 0 runs at x8. Fix: reseat it"],
        cuda_version="13.0",
        topology=GpuTopology(cards=[CardLinks(index=0, numa_node=0, nics={"mlx5_0": "PIX"})]),
    )


async def test_a_restarted_control_plane_shows_each_node_as_it_did(tmp_path: Path) -> None:
    """The stored facts (JSON) come back typed and are shown, field for field, as the
    facts the agent registered were; the live figures are not read until it says."""
    reg = await _registry(tmp_path)
    await reg.register(Register(node_id="n1", version="0.1", host=_rich_host()), FakeSession())
    before = reg.nodes["n1"].as_json()
    await reg.flush()
    await reg.store.close()
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    again = wiring.registry(store)
    await again.load()
    after = again.nodes["n1"].as_json()
    await store.close()
    assert again.nodes["n1"].facts == _rich_host()
    moved = {"state", "reason", "connected", "last_seen", "figure_ages", "stale_figures"}
    assert {k: v for k, v in after.items() if k not in moved} == {
        k: v for k, v in before.items() if k not in moved
    }
    # Read as it registered, then; after the restart, of no known age: not live.
    assert before["stale_figures"] == [] and set(before["figure_ages"]) >= {"gpus", "disks"}
    assert after["figure_ages"] == {}
    assert {"gpus", "disks"} <= set(after["stale_figures"])
    assert after["topology"] == {
        "cards": [{"index": 0, "numa_node": 0, "gpus": {}, "nics": {"mlx5_0": "PIX"}}]
    }
    assert after["gpu_health"] is None and after["ib_ports"] is None  # never sent


async def test_stored_facts_that_cannot_be_read_are_no_facts(tmp_path: Path) -> None:
    reg = await _registry(tmp_path)
    await reg.store.register_node("n1", None, "0.1", {"hostname": "n1", "gpus": "x"}, 1.0)
    await reg.load()
    view = reg.nodes["n1"]
    assert view.facts is None
    shown = view.as_json()
    assert (shown["hostname"], shown["gpus"], shown["cpu_count"]) == (None, [], None)
    await reg.store.close()


async def test_a_node_never_registered_shows_nothing_read(tmp_path: Path) -> None:
    reg = await _registry(tmp_path)
    shown = reg.nodes["n1"].as_json()
    assert shown["hostname"] is None and shown["memory_total"] is None
    assert (shown["gpus"], shown["cpu_flags"], shown["warnings"]) == ([], [], [])
    assert shown["disks"] is None and shown["load"] is None and shown["topology"] is None
    reg.heartbeat("n1", Heartbeat(seq=1, cpu_percent=7.5, gpus=[]))
    shown = reg.nodes["n1"].as_json()
    assert shown["cpu_percent"] == 7.5 and shown["gpus"] == [] and shown["hostname"] is None
    await reg.store.close()


async def test_a_heartbeat_without_a_figure_keeps_the_last_one(tmp_path: Path) -> None:
    reg = await _registry(tmp_path)
    await reg.register(Register(node_id="n1", version="0.1", host=_rich_host()), FakeSession())
    card = GPU(index=0, uuid="GPU-a", name="H100", memory_total=80, memory_used=9)
    reg.heartbeat(
        "n1", Heartbeat(seq=1, memory_available=40, gpus=[card], health_warnings=["xid: 79"])
    )
    reg.heartbeat("n1", Heartbeat(seq=2, cpu_percent=9.0))
    view = reg.nodes["n1"]
    shown = view.as_json()
    assert (shown["memory_available"], shown["cpu_percent"]) == (40, 9.0)
    assert shown["gpus"] == [
        {"index": 0, "uuid": "GPU-a", "name": "H100", "memory_total": 80, "memory_used": 9}
    ]
    assert shown["warnings"] == [*_rich_host().warnings, "xid: 79"]
    figures = view.figures()
    assert figures.gpus == (card,) and figures.memory_available == 40
    # [] clears the health warnings; the facts' disks stand until a heartbeat has some.
    reg.heartbeat("n1", Heartbeat(seq=3, health_warnings=[]))
    assert view.as_json()["health_warnings"] == [] and figures.disks == tuple(
        _rich_host().disks or ()
    )
    # Registering again starts the live figures afresh.
    await reg.register(Register(node_id="n1", version="0.1", host=_rich_host()), FakeSession())
    assert view.as_json()["memory_available"] == 50 and view.live.gpus is None
    await reg.store.close()


async def test_an_operators_marks_are_written_with_their_audit_then_taken(
    tmp_path: Path,
) -> None:
    woken: list[int] = []
    reg = await _registry(
        tmp_path, replace(wiring.QUIET, changed=lambda: woken.append(reg.version))
    )
    view = reg.nodes["n1"]
    before = reg.version
    await reg.set_scheduling(view, True, True, {"zone": "a"}, Audit("admin@t", "node.drain", "n1"))
    assert (view.cordoned, view.draining, view.labels) == (True, True, {"zone": "a"})
    assert reg.version > before and woken == [reg.version]  # placement looks again
    stored = await reg.store.get_node("n1")
    assert stored is not None and stored.cordoned and stored.draining
    assert stored.labels == {"zone": "a"}
    (entry, *_) = await reg.store.audit_log()
    assert (entry["actor"], entry["action"], entry["target"]) == ("admin@t", "node.drain", "n1")
    await reg.store.close()


async def test_a_heartbeat_is_shown_as_the_wire_map_it_came_in(tmp_path: Path) -> None:
    from llmgw.wire.framing import FrameDecoder
    from llmgw.wire.hardware import GPU, GpuHealth, NodeVitals, XidSeen
    from llmgw.wire.messages import decode_message, encode_message

    beat = Heartbeat(
        seq=3,
        disks=[Disk(path="/", fstype="ext4", total=10, free=5)],
        gpus=[GPU(index=0, uuid="GPU-a", name="H100", temperature=61, throttle=[])],
        gpu_health=[GpuHealth(uuid="GPU-a", index=0, xids=[XidSeen(79, 1, 5.0)])],
        vitals=NodeVitals(cpu_power={"package0": 120.5}),
        health_warnings=["xid: card 0 ... Fix: reset it"],
    )
    (payload,) = FrameDecoder().feed(encode_message(beat))
    decoded = decode_message(payload)
    assert isinstance(decoded, Heartbeat)
    reg = await _registry(tmp_path)
    await reg.register(_register(), FakeSession())
    reg.heartbeat("n1", decoded)
    shown = reg.nodes["n1"].as_json()
    await reg.store.close()
    for name in ("disks", "gpus", "gpu_health", "vitals", "health_warnings"):
        assert shown[name] == payload[name], name
    assert shown["gpus"][0]["throttle"] == [] and "fan" not in shown["gpus"][0]
    assert shown["gpu_health"][0]["xids"] == [{"code": 79, "count": 1, "last": 5.0}]
    # Shown again, the same: nothing of the first answer was kept changed.
    assert reg.nodes["n1"].as_json() == shown


async def test_a_replicas_cache_goes_to_the_router_and_changes_nothing_else(
    tmp_path: Path,
) -> None:
    heard: list[tuple[str, KvBlocks, bool]] = []
    hooks = replace(wiring.QUIET, kv_blocks=lambda node, msg, runs: heard.append((node, msg, runs)))
    reg = await _registry(tmp_path, hooks)
    await reg.register(_register(), FakeSession())
    version = reg.version
    cache = KvBlocks("m.default.a1", 16, added=[1, 2])
    reg.report("n1", cache)
    # Heard, and said not to be believed: n1 runs no such replica.
    assert heard == [("n1", cache, False)]
    assert reg.version == version  # the routing table is not rebuilt for it
    assert reg.nodes["n1"].shards == {}
    await reg.store.close()


def _shard(rid: str, state: ShardState, port: int | None, rank: int | None = None) -> ShardStatus:
    return ShardStatus(
        replica_id=rid, state=state, port=port, pid=7, rank=rank, last_lines=["loading"]
    )


async def test_the_replicas_an_agent_reports_ready_are_remembered_across_a_restart(
    tmp_path: Path,
) -> None:
    """What a control plane started again routes to before the agents speak: the store
    keeps each node's Ready replicas (leaders only, with a port), written when they
    change; loaded, they are remembered, not reported, and the agent's word replaces
    them."""
    reg = await _registry(tmp_path)
    writes: list[object] = []
    write = reg.store.set_node_replicas

    async def counted(changes: Any) -> None:
        writes.append(changes)
        await write(changes)

    reg.store.set_node_replicas = counted  # type: ignore[method-assign]
    ready = _shard("m.default.a1", ShardState.READY, 8001)
    shards = [
        ready,
        _shard("m.default.b2", ShardState.STARTING, 8002),
        _shard("m.span.c3~1", ShardState.READY, 8003, rank=1),  # a worker serves no HTTP
    ]
    await reg.register(replace(_register(), shards=shards), FakeSession())
    await reg.flush()
    stored = await reg.store.get_node("n1")
    assert stored is not None and stored.replicas == [
        {
            "replica_id": "m.default.a1",
            "state": "ready",
            "reason": "",
            "port": 8001,
            "pid": 7,
            "cards": [],
        }
    ]
    assert len(writes) == 1
    reg.report("n1", _shard("m.default.b2", ShardState.LOADING, 8002))
    await reg.flush()
    assert len(writes) == 1  # what serves did not change: nothing written
    reg.report("n1", _shard("m.default.b2", ShardState.READY, 8002))
    await reg.flush()
    stored = await reg.store.get_node("n1")
    assert stored is not None and stored.replicas is not None
    assert [r["replica_id"] for r in stored.replicas] == ["m.default.a1", "m.default.b2"]
    # The node goes silent: its engines may still run, so the store keeps them.
    assert reg.sweep(now=(reg.nodes["n1"].last_heartbeat or 0) + 16) == ["n1"]
    await reg.flush()
    await reg.store.close()

    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    again = wiring.registry(store)
    await again.load()
    view = again.nodes["n1"]
    assert view.state == NodeState.NOT_READY and view.shards == {}
    assert set(view.remembered) == {"m.default.a1", "m.default.b2"}
    assert view.remembered["m.default.a1"] == replace(ready, last_lines=None)
    assert view.routable() == view.remembered
    # The agent registers: its word is the truth, the remembered ones go.
    await again.register(replace(_register(), shards=[ready]), FakeSession())
    assert view.remembered == {} and view.routable() == {"m.default.a1": ready}
    await again.flush()
    stored = await store.get_node("n1")
    assert stored is not None and stored.replicas is not None
    assert [r["replica_id"] for r in stored.replicas] == ["m.default.a1"]
    await store.close()


async def test_a_standby_follows_the_leaders_remembered_replicas(tmp_path: Path) -> None:
    """A standby serves /v1 from the leader's word: a leader started again passes on the
    replicas it remembers, and the standby drops them when the leader does."""
    (tmp_path / "leader").mkdir()
    (tmp_path / "standby").mkdir()
    leader = await _registry(tmp_path / "leader")
    standby = await _registry(tmp_path / "standby")
    shard = _shard("m.default.a1", ShardState.READY, 8001)
    leader.nodes["n1"].remembered = {shard.replica_id: shard}
    before = standby.version
    standby.follow(leader.followable())
    assert standby.nodes["n1"].remembered == {shard.replica_id: shard}
    assert standby.nodes["n1"].shards == {} and standby.version == before + 1
    leader.nodes["n1"].remembered = {}
    standby.follow(leader.followable())
    assert standby.nodes["n1"].remembered == {} and standby.version == before + 2
    await leader.store.close()
    await standby.store.close()
