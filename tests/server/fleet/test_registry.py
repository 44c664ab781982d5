"""Readiness: Ready on register, NotReady after missed heartbeats, Ready again on word."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llmgw.server.fleet.registry import NodeRegistry, RegistryHooks
from llmgw.server.store import Audit, SQLiteStore
from llmgw.wire import Disk, Heartbeat, HostFacts, Register
from llmgw.wire.messages import KvBlocks
from llmgw.wire.states import NodeState
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
    assert view.facts["memory_total"] == 100 and view.cert_serial == 42
    assert again.counts() == {"total": 1, "ready": 0, "not_ready": 1}
    await again.flush()
    stored = await store.get_node("n1")
    assert stored is not None and stored.state == NodeState.NOT_READY
    await store.close()


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


async def test_a_heartbeats_decoded_map_is_kept_as_mapping_it_back_would_give(
    tmp_path: Path,
) -> None:
    from llmgw.wire.framing import FrameDecoder
    from llmgw.wire.messages import (
        GPU,
        GpuHealth,
        NodeVitals,
        XidSeen,
        decode_message,
        encode_message,
    )

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
    shown = []
    for raw in (payload, None):
        reg = await _registry(tmp_path / str(raw is None))
        await reg.register(_register(), FakeSession())
        reg.heartbeat("n1", decoded, raw)
        shown.append({k: v for k, v in reg.nodes["n1"].as_json().items() if k != "last_seen"})
        await reg.store.close()
    assert shown[0] == shown[1]
    assert shown[0]["gpus"][0]["throttle"] == [] and "fan" not in shown[0]["gpus"][0]
    assert shown[0]["gpu_health"][0]["xids"] == [{"code": 79, "count": 1, "last": 5.0}]


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
