"""A heartbeat's figures stay typed from the frame to the registry: decoding a heartbeat
of eight cards and taking it into ``NodeRegistry`` makes no dict of a record and no
record of a dict through the generic codec (``to_map``, ``from_map``, ``plain``).

The counting replaces those functions wherever a module of llmgw holds them by name
(``from llmgw.wire.messages import to_map`` binds a name of its own), so a call put back
anywhere on the path is counted; the last test shows the counting sees such a call."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llmgw.server.fleet import figures
from llmgw.server.fleet import stream as server
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry, RegistryHooks, serving_replicas
from llmgw.wire import codec
from llmgw.wire.framing import FrameDecoder
from llmgw.wire.hardware import (
    CARD_FIGURES,
    GPU,
    Disk,
    GpuHealth,
    GpuProcess,
    HostFacts,
    NodeVitals,
)
from llmgw.wire.messages import (
    Heartbeat,
    Registered,
    ShardStatus,
    ShardUsage,
    decode_message,
    encode_message,
)
from llmgw.wire.states import ShardState
from tests.support.streampair import Pair

GIB = 1 << 30
COUNTED: dict[str, Callable[..., Any]] = {
    "to_map": codec.to_map,
    "from_map": codec.from_map,
    "plain": figures.plain,
}


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts of every generic conversion made while the test runs."""
    counts: Counter[str] = Counter()

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)

        return counted

    wrapped = {name: counting(name, real) for name, real in COUNTED.items()}
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("llmgw"):
            continue
        for name, real in COUNTED.items():
            if getattr(module, name, None) is real:
                monkeypatch.setattr(module, name, wrapped[name])
    yield counts


def _card(i: int) -> GPU:
    """A card with every figure a driver gives."""
    return GPU(
        index=i,
        uuid=f"GPU-{i}",
        name="NVIDIA H100 80GB HBM3",
        memory_total=80 * GIB,
        memory_used=60 * GIB + i,
        utilization=90,
        compute_capability="9.0",
        driver="550.54.15",
        bus_id=f"00000000:{i:02X}:00.0",
        memory_utilization=40,
        temperature=60 + i,
        memory_temperature=70,
        power=650.5,
        power_limit=700.0,
        energy=3.2e9,
        sm_clock=1980,
        memory_clock=2619,
        fan=30,
        pstate="P0",
        throttle=["sw_power_cap"],
        pcie_gen=5,
        pcie_width=16,
        pcie_gen_max=5,
        pcie_width_max=16,
        pcie_gen_device_max=5,
        pcie_gen_host_max=5,
        sm_active=0.8,
        sm_occupancy=0.4,
        tensor_active=0.5,
        dram_active=0.6,
        processes=[GpuProcess(pid=4100 + i, name="python3", memory=GIB)],
        mig_mode=False,
    )


def _frame() -> bytes:
    """One heartbeat of a busy node with eight cards, every figure in it."""
    cards = [_card(i) for i in range(8)]
    return encode_message(
        Heartbeat(
            seq=7,
            memory_available=500 * GIB,
            cpu_percent=12.5,
            load=[3.0, 2.5, 2.0],
            disks=[Disk(path="/", fstype="ext4", total=512 * GIB, free=300 * GIB)],
            gpus=cards,
            shards=[ShardUsage("r1", cpu_percent=150.0, rss=3 * GIB)],
            gpu_health=[GpuHealth(uuid=g.uuid, index=g.index) for g in cards],
            vitals=NodeVitals(cpu_temperatures={"package0": 50.0}),
            health_warnings=[],
            ages={"gpus": 0.5},
        )
    )


async def _registry() -> NodeRegistry:
    hooks = RegistryHooks(changed=lambda: None, kv_blocks=lambda *_: None)
    reg = NodeRegistry(None, heartbeat_interval=5.0, missed_heartbeats=3, hooks=hooks)  # type: ignore[arg-type]
    facts = HostFacts(hostname="n1", os="Linux", arch="x86_64", memory_total=768 * GIB)
    view = reg.nodes["n1"] = NodeView(id="n1", cert_serial=1, facts=facts)
    view.shards["r1"] = ShardStatus(
        replica_id="r1", state=ShardState.READY, port=8000, cards=["GPU-0", "GPU-1"]
    )
    return reg


async def test_a_heartbeat_with_eight_cards_is_taken_without_a_dict_conversion(
    conversions: Counter[str],
) -> None:
    frame = _frame()  # encoding is the agent's side: not counted
    reg = await _registry()
    conversions.clear()
    (payload,) = FrameDecoder().feed(frame)
    beat = decode_message(payload)
    assert isinstance(beat, Heartbeat)
    reg.heartbeat("n1", beat)
    assert conversions == Counter()
    view = reg.nodes["n1"]
    # What was taken is the typed records, as sent.
    assert view.live.gpus == [_card(i) for i in range(8)]
    assert view.usage == {"r1": ShardUsage("r1", cpu_percent=150.0, rss=3 * GIB)}
    assert reg.history.series("n1") is not None
    assert reg.heartbeats == 1


async def test_a_heartbeat_of_moving_figures_is_made_whole_without_a_dict_conversion(
    conversions: Counter[str],
) -> None:
    """The same through both ends of a stream, the agent sending the cards' moving
    figures alone: the control plane's stream lays them over the cards it has."""
    pair = Pair()
    pair.settle()
    pair.node.send(Registered(node_id="n1", heartbeat_interval=5.0, features=[CARD_FIGURES]))
    pair.settle()
    reg = await _registry()
    cards = [_card(i) for i in range(8)]
    for step in range(2):
        sent = pair.agent.heartbeat(float(step), gpus=cards, shards=[ShardUsage("r1", rss=step)])
        assert (sent.gpu_figures is not None) == (step == 1)  # whole first, then figures
        data = pair.agent.data_to_send()  # encoded here: the agent's side, not counted
        conversions.clear()
        (event,) = [e for e in pair.node.receive(data) if isinstance(e, server.Reported)]
        assert isinstance(event.message, Heartbeat)
        reg.heartbeat("n1", event.message)
        assert conversions == Counter()
        pair.settle()
    assert event.message.gpus == cards
    assert reg.nodes["n1"].live.gpus == cards and reg.heartbeats == 2


async def test_the_counting_sees_a_conversion_the_registry_makes(
    conversions: Counter[str],
) -> None:
    """The registry's own ``to_map`` (its write of serving replicas, off the heartbeat
    path) is counted: one put back into ``heartbeat`` would be too."""
    reg = await _registry()
    assert serving_replicas(reg.nodes["n1"].shards)
    assert conversions["to_map"] >= 1
    (payload,) = FrameDecoder().feed(_frame())
    codec.from_map(Heartbeat, payload)
    assert conversions["from_map"] >= 1
