"""One node's Prometheus families as text: the node's, its cards', its InfiniBand
ports' and its engines' processes', written from the wire's typed records.

Both roles write them: the control plane on ``/metrics`` for every node (while
``metrics.fleet_detail`` is on), and each agent on ``agent.metrics_listen`` for its own
node, under the same names and labels, so that one dashboard reads either. Named as
docs/telemetry.md lists them (base units, ``_total`` counters); a figure not read is
left out, never written as 0.

A scrape of 5,000 nodes of 8 cards writes about two million samples, so the writing is
plain: a card's label text is made once and each sample is one f-string appended to its
family's list, with no map built per sample (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from llmgw.wire.hardware import (
    CARD_WIDE_FIGURES,
    GPU,
    STEADY_FACTS,
    Disk,
    GpuHealth,
    IbPort,
    NodeVitals,
    steady_facts,
)
from llmgw.wire.warnings import THROTTLE_REASONS, warning_kind

# A card's fabric cluster before it joined any: not a multi-node NVLink domain.
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def esc(value: object) -> str:
    """A label value as Prometheus text quotes it."""
    text = str(value)
    if "\\" in text or '"' in text or "\n" in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return text


def fmt(value: float) -> str:
    """A sample's value: an integral float without its ``.0``."""
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def card_joined(h: GpuHealth) -> bool | None:
    """Whether a card (its slow figures) has joined a multi-node NVLink domain; None
    when its fabric was not read, or it is a single node's own fabric, healthy."""
    if h.fabric_state is None:
        return None
    completed = h.fabric_state == "Completed" and h.fabric_status == "Success"
    uuid = h.fabric_cluster_uuid
    if completed and uuid == ZERO_UUID:
        return None
    return completed and uuid is not None and h.fabric_clique_id is not None


_NODE = (
    ("llmgw_node_up", "gauge", "1 while the node is Ready, 0 when it is not."),
    ("llmgw_node_cpu_utilization_ratio", "gauge", "Share of all the node's CPUs busy."),
    ("llmgw_node_load1", "gauge", "1-minute load average."),
    ("llmgw_node_load5", "gauge", "5-minute load average."),
    ("llmgw_node_load15", "gauge", "15-minute load average."),
    ("llmgw_node_cpus", "gauge", "Logical CPUs."),
    ("llmgw_node_memory_total_bytes", "gauge", "RAM."),
    ("llmgw_node_memory_available_bytes", "gauge", "RAM available to new work."),
    ("llmgw_node_memory_used_bytes", "gauge", "RAM in use: total less available."),
    ("llmgw_node_cpu_temperature_celsius", "gauge", "CPU package temperatures (hwmon)."),
    ("llmgw_node_board_temperature_celsius", "gauge", "Board temperatures (hwmon)."),
    ("llmgw_node_cpu_power_watts", "gauge", "CPU package power (RAPL)."),
    ("llmgw_imex_up", "gauge", "1 while nvidia-imex runs on the node, 0 when it does not."),
    ("llmgw_node_disk_total_bytes", "gauge", "Size of a filesystem the agent writes to."),
    ("llmgw_node_disk_free_bytes", "gauge", "Free space on it."),
    ("llmgw_node_warnings", "gauge", "The node's current warnings, by kind."),
)
_PORTS = (
    ("llmgw_ib_port_active", "gauge", "1 when an InfiniBand or RoCE port is ACTIVE, else 0."),
    ("llmgw_ib_port_rate_gbps", "gauge", "A port's link rate, Gb/s."),
    (
        "llmgw_ib_port_counter_total",
        "counter",
        "A port's error and data counters as the kernel keeps them (data in 4-octet units).",
    ),
)
# (family, wire key, scale, help) for the card figures that map one to one.
_CARD_FIGURES = (
    ("llmgw_gpu_busy_ratio", "utilization", 0.01, "Share of time a kernel ran on the card."),
    (
        "llmgw_gpu_memory_busy_ratio",
        "memory_utilization",
        0.01,
        "Share of time card memory was read or written.",
    ),
    ("llmgw_gpu_memory_total_bytes", "memory_total", 1, "Card memory."),
    ("llmgw_gpu_memory_used_bytes", "memory_used", 1, "Card memory in use."),
    ("llmgw_gpu_temperature_celsius", "temperature", 1, "GPU temperature."),
    ("llmgw_gpu_memory_temperature_celsius", "memory_temperature", 1, "Memory temperature."),
    ("llmgw_gpu_power_watts", "power", 1, "Power draw."),
    ("llmgw_gpu_power_limit_watts", "power_limit", 1, "Enforced power limit."),
    ("llmgw_gpu_energy_joules_total", "energy", 1, "Energy since the driver loaded."),
    ("llmgw_gpu_sm_clock_hertz", "sm_clock", 1e6, "SM clock."),
    ("llmgw_gpu_memory_clock_hertz", "memory_clock", 1e6, "Memory clock."),
    ("llmgw_gpu_fan_ratio", "fan", 0.01, "Fan speed."),
    ("llmgw_gpu_pcie_link_gen", "pcie_gen", 1, "PCIe generation in use."),
    ("llmgw_gpu_pcie_link_gen_max", "pcie_gen_max", 1, "Most PCIe generation allowed."),
    ("llmgw_gpu_pcie_link_width", "pcie_width", 1, "PCIe lanes in use."),
    ("llmgw_gpu_pcie_link_width_max", "pcie_width_max", 1, "Most PCIe lanes allowed."),
    (
        "llmgw_gpu_pcie_link_gen_device_max",
        "pcie_gen_device_max",
        1,
        "Most PCIe generation the card itself can run.",
    ),
    (
        "llmgw_gpu_pcie_link_gen_host_max",
        "pcie_gen_host_max",
        1,
        "Most PCIe generation the card's slot allows.",
    ),
    ("llmgw_gpu_sm_active_ratio", "sm_active", 1, "Share of time SMs were active (profiling)."),
    ("llmgw_gpu_sm_occupancy_ratio", "sm_occupancy", 1, "Warps resident over the most."),
    ("llmgw_gpu_tensor_active_ratio", "tensor_active", 1, "Share of time tensor cores ran."),
    ("llmgw_gpu_dram_active_ratio", "dram_active", 1, "Share of time memory was busy."),
)
_HEALTH = (
    ("llmgw_gpu_retired_pages", "retired_pages", "Card memory pages retired."),
    ("llmgw_gpu_nvlink_links", "nvlink_links", "NVLink links the card has."),
    ("llmgw_gpu_nvlink_links_active", "nvlink_active", "NVLink links up."),
)
_CARD_OTHER = (
    ("llmgw_gpu_info", "gauge", "1 per card; its facts as labels."),
    ("llmgw_gpu_pstate", "gauge", "Performance state (0 is the fastest)."),
    ("llmgw_gpu_throttled", "gauge", "1 for each clock throttle reason active, 0 if not."),
    ("llmgw_gpu_foreign_processes", "gauge", "Processes on the card not this node's engines."),
    ("llmgw_gpu_foreign_memory_bytes", "gauge", "Card memory those processes hold."),
    ("llmgw_gpu_mig_mode", "gauge", "1 when the card is in MIG mode."),
    ("llmgw_gpu_ecc_errors_total", "counter", "ECC errors by scope and kind."),
    ("llmgw_gpu_remapped_rows", "gauge", "Memory rows remapped, by kind."),
    ("llmgw_gpu_remap_pending", "gauge", "1 when a row remap waits for a reset."),
    ("llmgw_gpu_remap_failed", "gauge", "1 when a row remap failed."),
    ("llmgw_gpu_xid_errors_total", "counter", "Xid errors the agent saw, by code."),
    ("llmgw_gpu_nvlink_errors_total", "counter", "NVLink error counters summed over links."),
    (
        "llmgw_gpu_nvlink_joined",
        "gauge",
        "1 when the card joined its multi-node NVLink domain (Completed, Success), else 0.",
    ),
)
_SHARD = (
    ("llmgw_shard_cpu_cores", "gauge", "Cores an engine's processes use."),
    ("llmgw_shard_resident_memory_bytes", "gauge", "Resident memory of an engine's processes."),
)


def _families() -> tuple[tuple[str, str, str], ...]:
    out = [*_NODE, *_PORTS]
    out += [
        (n, "counter" if n.endswith("_total") else "gauge", t) for n, _k, _s, t in _CARD_FIGURES
    ]
    out += [(n, "gauge", t) for n, _k, t in _HEALTH]
    return (*out, *_CARD_OTHER, *_SHARD)


# Every family a node's text may hold, in the order they are written: (name, type, help).
FAMILIES = _families()
_AT = {name: i for i, (name, _kind, _text) in enumerate(FAMILIES)}
_UP = _AT["llmgw_node_up"]
# (family's place, wire key, scale, whether a MIG instance writes it) of the card figures.
_CARD_AT = tuple(
    (_AT[name], key, float(scale), key not in CARD_WIDE_FIGURES)
    for name, key, scale, _text in _CARD_FIGURES
)
_HEALTH_AT = tuple((_AT[name], key) for name, key, _text in _HEALTH)
_THROTTLED = _AT["llmgw_gpu_throttled"]
_KNOWN_REASONS = frozenset(THROTTLE_REASONS)
_REASON_LABELS = tuple((r, f',reason="{esc(r)}"') for r in sorted(THROTTLE_REASONS))
_CardFigures = tuple[tuple[int, str, float, bool], ...]
# A card's moving figures that seldom move: written with its steady facts, and compared
# by value to know whether they did.
SELDOM = ("pstate", "processes", "pcie_gen", "pcie_width")
_MOVING_AT: _CardFigures = tuple(
    f for f in _CARD_AT if f[1] not in STEADY_FACTS and f[1] not in SELDOM
)
_STEADY_AT: _CardFigures = tuple(f for f in _CARD_AT if f[1] in STEADY_FACTS or f[1] in SELDOM)
# The families ``steady_text`` writes, and ``moving_text`` never does.
STEADY = frozenset(
    {at for at, _key, _scale, _own in _STEADY_AT}
    | {at for at, _key in _HEALTH_AT}
    | {
        _AT[name]
        for name in (
            "llmgw_gpu_info",
            "llmgw_gpu_pstate",
            "llmgw_gpu_foreign_processes",
            "llmgw_gpu_foreign_memory_bytes",
            "llmgw_gpu_mig_mode",
            "llmgw_gpu_ecc_errors_total",
            "llmgw_gpu_remapped_rows",
            "llmgw_gpu_remap_pending",
            "llmgw_gpu_remap_failed",
            "llmgw_gpu_xid_errors_total",
            "llmgw_gpu_nvlink_errors_total",
            "llmgw_gpu_nvlink_joined",
        )
    }
)


@dataclass(frozen=True)
class ShardUsage:
    """What an engine's processes use on the node: cores and resident bytes."""

    replica: str
    model: str  # what it serves; "" when not known
    cores: float | None
    rss: int | None


@dataclass(frozen=True)
class NodeSample:
    """What is written of one node: its figures as read now (a figure not live is None,
    or absent from its tuple), as the wire carries them."""

    id: str
    up: bool
    cpu_count: int | None = None
    memory_total: int | None = None
    memory_available: int | None = None
    cpu_percent: float | None = None
    load: tuple[float, ...] | None = None
    gpus: tuple[GPU, ...] = ()
    disks: tuple[Disk, ...] | None = None
    cuda_version: str | None = None
    warnings: tuple[str, ...] = ()
    gpu_health: tuple[GpuHealth, ...] = ()
    vitals: NodeVitals | None = None
    ib_ports: tuple[IbPort, ...] = ()
    shards: tuple[ShardUsage, ...] = ()


# One node's text: per family (in FAMILIES' order) its sample lines, each ending in a
# newline, or "" when it has none.
NodeText = tuple[str, ...]


def _value(value: object, scale: float) -> str | None:
    # The hot path: an exact int or float as it is; a bool (an int to Python) is no figure.
    if type(value) is int:
        return str(value) if scale == 1.0 else fmt(value * scale)
    if type(value) is float:
        return fmt(value if scale == 1.0 else value * scale)
    return None


class _Lines:
    """Sample lines by family place, for one node."""

    __slots__ = ("out",)

    def __init__(self) -> None:
        self.out: list[list[str]] = [[] for _ in FAMILIES]

    def add(self, at: int, labels: str, value: object, scale: float = 1.0) -> None:
        text = _value(value, scale)
        if text is not None:
            self.out[at].append(f"{FAMILIES[at][0]}{{{labels}}} {text}\n")

    def text(self) -> NodeText:
        return tuple("".join(lines) for lines in self.out)


def up_text(node_id: str, up: bool) -> NodeText:
    """Only ``llmgw_node_up``: a node whose figures are too old to stand for now."""
    out = [""] * len(FAMILIES)
    out[_UP] = f'llmgw_node_up{{node="{esc(node_id)}"}} {int(up)}\n'
    return tuple(out)


def node_text(node: NodeSample, kind_of: Callable[[str], str] = warning_kind) -> NodeText:
    """All of one node's samples, by family; ``kind_of`` names a warning's kind."""
    return merged(moving_text(node, kind_of), steady_text(node))


def merged(moving: NodeText, steady: NodeText) -> NodeText:
    """A node's text from its two parts: each family is written by one of them."""
    return tuple(m or s for m, s in zip(moving, steady, strict=True))


def _cards(node: NodeSample) -> Iterator[tuple[GPU, GpuHealth | None, bool]]:
    """Each card with its health and whether it is the first of its physical card (a
    MIG instance after its card's first writes only its own figures)."""
    health = {h.uuid: h for h in node.gpu_health}
    seen: set[str] = set()
    for gpu in node.gpus:
        card = gpu.mig_parent or gpu.uuid
        first = card not in seen
        seen.add(card)
        yield gpu, health.get(card) if first else None, first


def steady_key(gpu: GPU) -> tuple[object, ...]:
    """What a card's part of ``steady_text`` is made of, besides its health."""
    return (*steady_facts(gpu), *(getattr(gpu, name) for name in SELDOM))


def steady_text(node: NodeSample) -> NodeText:
    """The families of the cards' steady facts, their seldom moving figures and their
    health (``STEADY``): the same from one heartbeat to the next until one of those
    changes (``steady_key``) or the health is read again."""
    lines = _Lines()
    node_id = esc(node.id)
    for gpu, health, first in _cards(node):
        _card_steady(lines, node_id, gpu, health, node.cuda_version, first)
    return lines.text()


def moving_text(node: NodeSample, kind_of: Callable[[str], str] = warning_kind) -> NodeText:
    """Every family but ``STEADY``: the node's, its ports', disks', warnings', engines'
    and its cards' moving figures."""
    lines = _Lines()
    add = lines.add
    node_id = esc(node.id)
    where = f'node="{node_id}"'
    add(_UP, where, int(node.up))
    add(_AT["llmgw_node_cpu_utilization_ratio"], where, node.cpu_percent, 0.01)
    load = node.load
    if load is not None and len(load) == 3:
        for name, value in zip(("load1", "load5", "load15"), load, strict=True):
            add(_AT[f"llmgw_node_{name}"], where, value)
    add(_AT["llmgw_node_cpus"], where, node.cpu_count)
    total, available = node.memory_total, node.memory_available
    add(_AT["llmgw_node_memory_total_bytes"], where, total)
    add(_AT["llmgw_node_memory_available_bytes"], where, available)
    if total is not None and available is not None:
        add(_AT["llmgw_node_memory_used_bytes"], where, total - available)
    vitals = node.vitals or NodeVitals()
    for family, sensors, label in (
        ("llmgw_node_cpu_temperature_celsius", vitals.cpu_temperatures, "sensor"),
        ("llmgw_node_board_temperature_celsius", vitals.board_temperatures, "sensor"),
        ("llmgw_node_cpu_power_watts", vitals.cpu_power, "package"),
    ):
        for sensor, value in sorted((sensors or {}).items()):
            add(_AT[family], f'{where},{label}="{esc(sensor)}"', value)
    if vitals.imex_running is not None:
        add(_AT["llmgw_imex_up"], where, int(vitals.imex_running))
    _ports(lines, node_id, node.ib_ports)
    for disk in node.disks or ():
        at_disk = f'{where},path="{esc(disk.path)}"'
        add(_AT["llmgw_node_disk_total_bytes"], at_disk, disk.total)
        add(_AT["llmgw_node_disk_free_bytes"], at_disk, disk.free)
    kinds: dict[str, int] = {}
    for warning in node.warnings:
        kind = kind_of(warning)
        kinds[kind] = kinds.get(kind, 0) + 1
    for kind, n in sorted(kinds.items()):
        add(_AT["llmgw_node_warnings"], f'{where},kind="{esc(kind)}"', n)
    for gpu, _health, first in _cards(node):
        _card_moving(lines, node_id, gpu, first)
    for shard in node.shards:
        at_shard = f'{where},replica="{esc(shard.replica)}",model="{esc(shard.model)}"'
        add(_AT["llmgw_shard_cpu_cores"], at_shard, shard.cores)
        add(_AT["llmgw_shard_resident_memory_bytes"], at_shard, shard.rss)
    return lines.text()


def _ports(lines: _Lines, node_id: str, ports: Iterable[IbPort]) -> None:
    active, rate = _AT["llmgw_ib_port_active"], _AT["llmgw_ib_port_rate_gbps"]
    counter = _AT["llmgw_ib_port_counter_total"]
    for p in ports:
        where = (
            f'node="{node_id}",device="{esc(p.device)}",port="{esc(p.port)}",'
            f'link_layer="{esc(p.link_layer or "")}"'
        )
        state = p.state
        lines.add(active, where, None if state is None else int(state == "ACTIVE"))
        lines.add(rate, where, p.rate_gbps)
        for name, n in sorted(p.counters.items()):
            lines.add(counter, f'{where},counter="{esc(name)}"', n)


def _where(node_id: str, gpu: GPU) -> str:
    return (
        f'node="{node_id}",gpu="{gpu.index}",uuid="{esc(gpu.uuid)}",'
        f'model="{esc(gpu.mig_class or gpu.name)}"'
    )


def _figures(lines: _Lines, where: str, gpu: GPU, figures: _CardFigures, whole_card: bool) -> None:
    # The card's label text is made once; each figure is then one f-string.
    out = lines.out
    tail = f"{{{where}}} "
    for at, key, scale, own in figures:
        if whole_card or own:
            text = _value(getattr(gpu, key), scale)
            if text is not None:
                out[at].append(f"{FAMILIES[at][0]}{tail}{text}\n")


def _card_moving(lines: _Lines, node_id: str, gpu: GPU, whole_card: bool = True) -> None:
    """One card's moving figures; a MIG instance after its card's first writes only its
    own (memory, work), not the card's temperature, power or clocks again."""
    where = _where(node_id, gpu)
    _figures(lines, where, gpu, _MOVING_AT, whole_card)
    if not whole_card:
        return
    # A card near its power cap goes in and out of throttling from one read to the next.
    throttle = gpu.throttle
    if throttle is None:
        return
    out = lines.out[_THROTTLED]
    if all(reason in _KNOWN_REASONS for reason in throttle):
        # The usual case, nine lines a card: each reason's label made once, here.
        for reason, label in _REASON_LABELS:
            on = "1" if reason in throttle else "0"
            out.append(f"llmgw_gpu_throttled{{{where}{label}}} {on}\n")
        return
    for reason in sorted({*THROTTLE_REASONS, *throttle}):
        lines.add(_THROTTLED, f'{where},reason="{esc(reason)}"', int(reason in throttle))


def _card_steady(
    lines: _Lines,
    node_id: str,
    gpu: GPU,
    health: GpuHealth | None,
    cuda: str | None,
    whole_card: bool = True,
) -> None:
    """One card's facts (``llmgw_gpu_info``), the figures that seldom move (``SELDOM``),
    and its health."""
    where = _where(node_id, gpu)
    info = (
        f'{where},driver="{esc(gpu.driver or "")}",cuda="{esc(cuda or "")}",'
        f'compute_capability="{esc(gpu.compute_capability or "")}",'
        f'bus_id="{esc(gpu.bus_id or "")}"'
    )
    lines.out[_AT["llmgw_gpu_info"]].append(f"llmgw_gpu_info{{{info}}} 1\n")
    _figures(lines, where, gpu, _STEADY_AT, whole_card)
    if not whole_card:
        return
    add = lines.add
    pstate = gpu.pstate
    if pstate is not None and pstate[1:].isdigit():
        add(_AT["llmgw_gpu_pstate"], where, int(pstate[1:]))
    processes = gpu.processes
    if processes is not None:
        add(_AT["llmgw_gpu_foreign_processes"], where, len(processes))
        held = [p.memory for p in processes]
        if all(m is not None for m in held):
            add(_AT["llmgw_gpu_foreign_memory_bytes"], where, sum(m or 0 for m in held))
    if gpu.mig_mode is not None:
        lines.add(_AT["llmgw_gpu_mig_mode"], where, int(gpu.mig_mode))
    if health is not None:
        _health(lines, where, health)


def _health(lines: _Lines, where: str, h: GpuHealth) -> None:
    add = lines.add
    ecc = _AT["llmgw_gpu_ecc_errors_total"]
    for scope, kind, count in (
        ("volatile", "corrected", h.ecc_volatile_corrected),
        ("volatile", "uncorrected", h.ecc_volatile_uncorrected),
        ("aggregate", "corrected", h.ecc_aggregate_corrected),
        ("aggregate", "uncorrected", h.ecc_aggregate_uncorrected),
    ):
        add(ecc, f'{where},scope="{scope}",kind="{kind}"', count)
    for at, key in _HEALTH_AT:
        add(at, where, getattr(h, key))
    rows = _AT["llmgw_gpu_remapped_rows"]
    add(rows, f'{where},kind="correctable"', h.remapped_correctable)
    add(rows, f'{where},kind="uncorrectable"', h.remapped_uncorrectable)
    if h.remap_pending is not None:
        add(_AT["llmgw_gpu_remap_pending"], where, int(h.remap_pending))
    if h.remap_failed is not None:
        add(_AT["llmgw_gpu_remap_failed"], where, int(h.remap_failed))
    xid = _AT["llmgw_gpu_xid_errors_total"]
    for x in h.xids or ():
        add(xid, f'{where},xid="{x.code}"', x.count)
    nvlink = _AT["llmgw_gpu_nvlink_errors_total"]
    for counter, n in sorted((h.nvlink_errors or {}).items()):
        add(nvlink, f'{where},counter="{esc(counter)}"', n)
    joined = card_joined(h)
    if joined is not None:
        add(_AT["llmgw_gpu_nvlink_joined"], where, int(joined))


def join(texts: Sequence[NodeText]) -> str:
    """The nodes' texts as one exposition: each family's HELP and TYPE once, then its
    samples of every node in the order given; a family no node has is still declared."""
    return "".join(parts(texts))


def parts(texts: Sequence[NodeText]) -> list[str]:
    """``join``'s pieces, in order, not yet joined: a large fleet's exposition is
    hundreds of megabytes, better encoded a few megabytes at a time than copied whole."""
    out: list[str] = []
    for at, (name, kind, text) in enumerate(FAMILIES):
        out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
        out.extend(t[at] for t in texts)
    return out
