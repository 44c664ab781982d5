"""The fleet on ``/metrics``: every node's, card's and engine's figures as Prometheus text.

Written from the registry's latest reports when scraped, named as docs/telemetry.md
lists them (base units, ``_total`` counters). A figure the agent did not report is left
out, never written as 0, and a node not heard from for ``STALE`` seconds has only its
``llmgw_node_up`` written: its figures are too old to stand for now.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from llmgw.server.fleet.figures import NodeFigures, node_warnings
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.nvlink import card_joined
from llmgw.wire.hardware import CARD_WIDE_FIGURES, GPU, GpuHealth, IbPort, NodeVitals
from llmgw.wire.messages import ShardUsage
from llmgw.wire.states import NodeState
from llmgw.wire.warnings import THROTTLE_REASONS, warning_kind

STALE = 60.0


def _esc(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_text(pairs: Mapping[str, object]) -> str:
    return ",".join(f'{k}="{_esc(v)}"' for k, v in pairs.items())


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _fmt(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


class Families:
    """Samples grouped by family, written with one HELP and TYPE each, in first-use order."""

    def __init__(self) -> None:
        self._meta: dict[str, tuple[str, str]] = {}
        self._samples: dict[str, list[str]] = {}

    def declare(self, name: str, kind: str, text: str) -> None:
        self._meta.setdefault(name, (kind, text))
        self._samples.setdefault(name, [])

    def add(self, name: str, labels: str, value: float | None, scale: float = 1.0) -> None:
        self.add_each(labels, ((name, value, scale),))

    def add_each(self, labels: str, samples: Iterable[tuple[str, float | None, float]]) -> None:
        """Samples of one label set: (family, value, scale) each, None values left out.

        The hot path of a scrape (about 50 samples a card): an exact int or float is
        written as it is; a bool (an int to Python) is no figure."""
        out = self._samples
        for name, value, scale in samples:
            if type(value) is int:
                text = str(value) if scale == 1.0 else _fmt(value * scale)
            elif type(value) is float:
                text = _fmt(value if scale == 1.0 else value * scale)
            else:
                continue
            out[name].append(f"{name}{{{labels}}} {text}")

    def lines(self) -> Iterable[str]:
        for name, (kind, text) in self._meta.items():
            yield f"# HELP {name} {text}"
            yield f"# TYPE {name} {kind}"
            yield from self._samples[name]


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


_PORTS = (
    ("llmgw_ib_port_active", "gauge", "1 when an InfiniBand or RoCE port is ACTIVE, else 0."),
    ("llmgw_ib_port_rate_gbps", "gauge", "A port's link rate, Gb/s."),
    (
        "llmgw_ib_port_counter_total",
        "counter",
        "A port's error and data counters as the kernel keeps them (data in 4-octet units).",
    ),
)


def _ports(f: Families, node: str, ports: Iterable[IbPort]) -> None:
    for p in ports:
        where = label_text(
            {"node": node, "device": p.device, "port": p.port, "link_layer": p.link_layer or ""}
        )
        state = p.state
        f.add("llmgw_ib_port_active", where, None if state is None else int(state == "ACTIVE"))
        f.add("llmgw_ib_port_rate_gbps", where, p.rate_gbps)
        for counter, n in sorted(p.counters.items()):
            f.add("llmgw_ib_port_counter_total", f'{where},counter="{_esc(counter)}"', n)


def _declare_all(f: Families) -> None:
    for name, kind, text in (*_NODE, *_PORTS):
        f.declare(name, kind, text)
    for name, _key, _scale, text in _CARD_FIGURES:
        f.declare(name, "gauge" if not name.endswith("_total") else "counter", text)
    for name, _key, text in _HEALTH:
        f.declare(name, "gauge", text)
    for name, kind, text in (*_CARD_OTHER, *_SHARD):
        f.declare(name, kind, text)


@dataclass(frozen=True)
class NodeSnapshot:
    """What /metrics writes of one node, taken on the event loop so the text can be
    written in a worker thread while heartbeats go on changing the registry (they
    replace a view's records, never change one)."""

    id: str
    up: bool
    last_seen: float | None
    figures: NodeFigures  # the facts with the latest live figures over them
    cuda_version: str | None
    # Discovery's warnings, then the cards' health warnings.
    warnings: tuple[str, ...]
    gpu_health: tuple[GpuHealth, ...]
    vitals: NodeVitals | None
    ib_ports: tuple[IbPort, ...]
    usage: dict[str, ShardUsage]
    sources: dict[str, str | None]  # replica -> what it serves

    @classmethod
    def of(cls, view: NodeView, now: float | None = None) -> NodeSnapshot:
        """The node as of ``now`` (wall clock): a figure that is not live (too old, or
        unread lately by its agent) is left out, a card keeping what it is."""
        facts, live = view.facts, view.live
        now = time.time() if now is None else now
        return cls(
            id=view.id,
            up=view.state == NodeState.READY,
            last_seen=view.last_seen,
            figures=NodeFigures.shown(facts, live, now),
            cuda_version=facts.cuda_version if facts else None,
            warnings=tuple(node_warnings(facts, live)),
            gpu_health=tuple(live.gpu_health or ()) if live.is_live("gpu_health", now) else (),
            vitals=live.vitals if live.is_live("vitals", now) else None,
            ib_ports=tuple(live.ib_ports or ()) if live.is_live("ib_ports", now) else (),
            usage=dict(view.usage),
            sources={r: s.source for r, s in view.shards.items()},
        )


def _node(f: Families, view: NodeSnapshot, kind_of: Callable[[str], str]) -> None:
    figures = view.figures
    node = f'node="{_esc(view.id)}"'
    f.add("llmgw_node_cpu_utilization_ratio", node, figures.cpu_percent, 0.01)
    load = figures.load
    if load is not None and len(load) == 3:
        for name, value in zip(("load1", "load5", "load15"), load, strict=True):
            f.add(f"llmgw_node_{name}", node, value)
    f.add("llmgw_node_cpus", node, figures.cpu_count)
    total, available = figures.memory_total, figures.memory_available
    f.add("llmgw_node_memory_total_bytes", node, total)
    f.add("llmgw_node_memory_available_bytes", node, available)
    if total is not None and available is not None:
        f.add("llmgw_node_memory_used_bytes", node, total - available)
    vitals = view.vitals or NodeVitals()
    for family, sensors, label in (
        ("llmgw_node_cpu_temperature_celsius", vitals.cpu_temperatures, "sensor"),
        ("llmgw_node_board_temperature_celsius", vitals.board_temperatures, "sensor"),
        ("llmgw_node_cpu_power_watts", vitals.cpu_power, "package"),
    ):
        for sensor, value in sorted((sensors or {}).items()):
            f.add(family, f'{node},{label}="{_esc(sensor)}"', value)
    if vitals.imex_running is not None:
        f.add("llmgw_imex_up", node, int(vitals.imex_running))
    _ports(f, view.id, view.ib_ports)
    for disk in figures.disks or ():
        where = f'{node},path="{_esc(disk.path)}"'
        f.add("llmgw_node_disk_total_bytes", where, disk.total)
        f.add("llmgw_node_disk_free_bytes", where, disk.free)
    kinds: dict[str, int] = {}
    for warning in view.warnings:
        kind = kind_of(warning)
        kinds[kind] = kinds.get(kind, 0) + 1
    for kind, n in sorted(kinds.items()):
        f.add("llmgw_node_warnings", f'{node},kind="{_esc(kind)}"', n)
    health = {h.uuid: h for h in view.gpu_health}
    cards_seen: set[str] = set()
    for gpu in figures.gpus:
        card = gpu.mig_parent or gpu.uuid
        first = card not in cards_seen
        cards_seen.add(card)
        _card(f, view.id, gpu, health.get(card) if first else None, view.cuda_version, first)
    for replica, usage in sorted(view.usage.items()):
        model = view.sources.get(replica)
        where = label_text({"node": view.id, "replica": replica, "model": model or ""})
        cpu = _num(usage.cpu_percent)
        f.add("llmgw_shard_cpu_cores", where, None if cpu is None else cpu / 100)
        f.add("llmgw_shard_resident_memory_bytes", where, usage.rss)


def _card(
    f: Families,
    node: str,
    gpu: GPU,
    health: GpuHealth | None,
    cuda: str | None,
    whole_card: bool = True,
) -> None:
    """One card's samples; a MIG instance after its card's first writes only its own
    figures (memory, work), not the card's temperature, power or clocks again."""
    where = label_text(
        {"node": node, "gpu": gpu.index, "uuid": gpu.uuid, "model": gpu.mig_class or gpu.name}
    )
    info = {
        "driver": gpu.driver or "",
        "cuda": cuda or "",
        "compute_capability": gpu.compute_capability or "",
        "bus_id": gpu.bus_id or "",
    }
    f.add("llmgw_gpu_info", f"{where},{label_text(info)}", 1)
    f.add_each(
        where,
        (
            (family, getattr(gpu, key), scale)
            for family, key, scale, _text in _CARD_FIGURES
            if whole_card or key not in CARD_WIDE_FIGURES
        ),
    )
    if not whole_card:
        return
    pstate = gpu.pstate
    if pstate is not None and pstate[1:].isdigit():
        f.add("llmgw_gpu_pstate", where, int(pstate[1:]))
    throttle = gpu.throttle
    if throttle is not None:
        for reason in sorted({*THROTTLE_REASONS, *throttle}):
            f.add("llmgw_gpu_throttled", f'{where},reason="{reason}"', int(reason in throttle))
    processes = gpu.processes
    if processes is not None:
        f.add("llmgw_gpu_foreign_processes", where, len(processes))
        held = [p.memory for p in processes]
        if all(m is not None for m in held):
            f.add("llmgw_gpu_foreign_memory_bytes", where, sum(m or 0 for m in held))
    if gpu.mig_mode is not None:
        f.add("llmgw_gpu_mig_mode", where, int(gpu.mig_mode))
    if health is not None:
        _health(f, where, health)


def _health(f: Families, where: str, h: GpuHealth) -> None:
    for scope, kind, count in (
        ("volatile", "corrected", h.ecc_volatile_corrected),
        ("volatile", "uncorrected", h.ecc_volatile_uncorrected),
        ("aggregate", "corrected", h.ecc_aggregate_corrected),
        ("aggregate", "uncorrected", h.ecc_aggregate_uncorrected),
    ):
        f.add("llmgw_gpu_ecc_errors_total", f'{where},scope="{scope}",kind="{kind}"', count)
    for family, key, _text in _HEALTH:
        f.add(family, where, getattr(h, key))
    for kind, rows in (
        ("correctable", h.remapped_correctable),
        ("uncorrectable", h.remapped_uncorrectable),
    ):
        f.add("llmgw_gpu_remapped_rows", f'{where},kind="{kind}"', rows)
    for family, flag in (
        ("llmgw_gpu_remap_pending", h.remap_pending),
        ("llmgw_gpu_remap_failed", h.remap_failed),
    ):
        if flag is not None:
            f.add(family, where, int(flag))
    for xid in h.xids or ():
        f.add("llmgw_gpu_xid_errors_total", f'{where},xid="{xid.code}"', xid.count)
    for counter, n in sorted((h.nvlink_errors or {}).items()):
        f.add("llmgw_gpu_nvlink_errors_total", f'{where},counter="{_esc(counter)}"', n)
    joined = card_joined(h)
    if joined is not None:
        f.add("llmgw_gpu_nvlink_joined", where, int(joined))


def fleet_metrics(
    nodes: Iterable[NodeView | NodeSnapshot],
    kind_of: Callable[[str], str] = warning_kind,
    now: float | None = None,
) -> list[str]:
    """Prometheus text lines for every node; ``kind_of`` names a warning's kind. Give
    snapshots (``NodeSnapshot.of``) to write them away from the event loop."""
    now = time.time() if now is None else now
    f = Families()
    _declare_all(f)
    snaps = [n if isinstance(n, NodeSnapshot) else NodeSnapshot.of(n, now) for n in nodes]
    for view in sorted(snaps, key=lambda v: v.id):
        f.add("llmgw_node_up", f'node="{_esc(view.id)}"', int(view.up))
        if view.last_seen is None or now - view.last_seen > STALE:
            continue
        _node(f, view, kind_of)
    return list(f.lines())


def cluster_metrics(
    models: Iterable[tuple[str, int, int]],
    budgets: Iterable[tuple[str, str, int, int]],
    joules_per_token: Mapping[tuple[str, str], float],
) -> list[str]:
    """Models' replicas wanted and Ready (name, desired, ready), each key's share of its
    monthly budget used (id, name, tokens used, budget), and each replica's card energy
    per answered token by (model, replica)."""
    f = Families()
    f.declare(
        "llmgw_replica_joules_per_token",
        "gauge",
        "A replica's card energy over the tokens it answered, since this control plane started.",
    )
    for (model, replica), value in sorted(joules_per_token.items()):
        f.add(
            "llmgw_replica_joules_per_token",
            label_text({"model": model, "replica": replica}),
            value,
        )
    f.declare("llmgw_model_replicas_wanted", "gauge", "Replicas a model should have now.")
    f.declare("llmgw_model_replicas_ready", "gauge", "Replicas of a model Ready.")
    f.declare("llmgw_key_budget_used_ratio", "gauge", "A key's tokens this month over its budget.")
    for name, desired, ready in sorted(models):
        where = f'model="{_esc(name)}"'
        f.add("llmgw_model_replicas_wanted", where, desired)
        f.add("llmgw_model_replicas_ready", where, ready)
    for key_id, name, used, budget in sorted(budgets):
        if budget > 0:
            where = label_text({"key": key_id, "name": name})
            f.add("llmgw_key_budget_used_ratio", where, used / budget)
    return list(f.lines())
