"""A node's figures as the control plane keeps them, typed from the wire on.

``HostFacts`` (the agent's Register, or the store's copy after a restart) says what
discovery found; ``LiveFigures`` holds the latest of each figure the heartbeats carry;
``NodeFigures`` is the two read together, the latest live figure over the fact of
registering, as placement, the planner and the pages read them. None is a figure the
agent has not reported, never a zero.

Every live figure has an age: when it was read, by the agent's word (``Heartbeat.ages``,
seconds before the heartbeat, so the two clocks need not agree) or else when the
heartbeat carrying it came. A figure older than ``STALE_AFTER`` seconds (the cards'
slow figures too: the agent reads them every 15 s), or one the agent says it could not read lately
(``Heartbeat.unread``), is not live: placement still reads the last copy, but the API
shows it with its age and as stale, /metrics leaves it out, and the pages grey it.

``plain`` is the JSON form the admin API shows (``codec.to_map``'s answer, quicker).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from dataclasses import dataclass, field
from typing import Any

from llmgw.wire.hardware import GPU, Disk, GpuHealth, HostFacts, IbPort, NodeVitals
from llmgw.wire.messages import AGED_FIGURES, Heartbeat
from llmgw.wire.warnings import COLLECTED_KINDS, warning_kind

# Seconds after which a figure is too old to be shown as live.
STALE_AFTER = 30.0
# The cards' slow figures (ECC, rows, NVLink) are read once a minute by design.
# The aged figures (``AGED_FIGURES``) Register's facts carry too (read when it registered).
FACT_FIGURES = ("memory_available", "cpu_percent", "load", "disks", "gpus")
# What a card is, not how it is doing: kept when its figures are not live.
CARD_IDENTITY = (
    "index",
    "uuid",
    "name",
    "memory_total",
    "compute_capability",
    "driver",
    "bus_id",
    "pcie_gen_max",
    "pcie_width_max",
    "pcie_gen_device_max",
    "pcie_gen_host_max",
    "mig_mode",
    "mig_parent",
    "mig_profile",
    "mig_class",
)


def card_identity(gpu: GPU) -> GPU:
    """The card without its moving figures: what a page or /metrics shows of a card
    whose figures are not live."""
    return GPU(**{name: getattr(gpu, name) for name in CARD_IDENTITY})


@dataclass(slots=True)
class LiveFigures:
    """The latest of each figure a node's heartbeats carried. A heartbeat without a
    figure leaves the last one (the agent sends the slow ones only when they change);
    None: never sent since the node registered. A figure is replaced by the next one,
    never changed in place: /metrics' snapshots and the JSON ``NodeView.as_json`` keeps
    of a record hold on to them as they are."""

    memory_available: int | None = None
    cpu_percent: float | None = None
    load: list[float] | None = None
    disks: list[Disk] | None = None
    gpus: list[GPU] | None = None
    # GB/s, measured once by the agent in the background.
    memory_read_gbs: float | None = None
    memory_read_one_core_gbs: float | None = None
    gpu_health: list[GpuHealth] | None = None
    vitals: NodeVitals | None = None
    # The node's health warnings, whole ([] once they cleared).
    health_warnings: list[str] | None = None
    # InfiniBand and RoCE ports with their counters ([] for a node with none).
    ib_ports: list[IbPort] | None = None
    # When each figure was read (wall clock of the control plane), by field name.
    read_at: dict[str, float] = field(default_factory=dict)
    # The figures the agent could not read lately (its last heartbeat's word).
    unread: frozenset[str] = frozenset()
    # Whether the agent sends ages: it reads its slow tools apart and its heartbeats'
    # warnings speak for them (COLLECTED_KINDS).
    aged: bool = False

    @classmethod
    def registered(cls, now: float) -> LiveFigures:
        """A node's figures as it registers: those its facts carry, read now."""
        return cls(read_at=dict.fromkeys(FACT_FIGURES, now))

    def age(self, name: str, now: float) -> float | None:
        """Seconds since ``name`` was read; None when no one knows."""
        at = self.read_at.get(name)
        return None if at is None else max(0.0, now - at)

    def is_live(self, name: str, now: float) -> bool:
        """Whether ``name`` may be shown as the figure of now."""
        age = self.age(name, now)
        return age is not None and age <= STALE_AFTER and name not in self.unread

    def ages(self, now: float) -> dict[str, float]:
        """Each figure's age in seconds (tenths), for the admin API."""
        return {
            name: round(age, 1) for name in AGED_FIGURES if (age := self.age(name, now)) is not None
        }

    def take(self, beat: Heartbeat, now: float | None = None) -> None:
        """A heartbeat's figures over the last ones; those it does not carry stay (and
        keep their age). ``now``: when it came (wall clock)."""
        now = time.time() if now is None else now
        ages = beat.ages or {}
        self.aged = self.aged or beat.ages is not None
        for name in AGED_FIGURES:
            age = ages.get(name)
            if age is not None:
                self.read_at[name] = now - max(0.0, age)
            elif getattr(beat, name) is not None:
                self.read_at[name] = now
        self.unread = frozenset(beat.unread or ())
        if beat.memory_available is not None:
            self.memory_available = beat.memory_available
        if beat.cpu_percent is not None:
            self.cpu_percent = beat.cpu_percent
        if beat.load is not None:
            self.load = beat.load
        if beat.disks is not None:
            self.disks = beat.disks
        if beat.gpus is not None:
            self.gpus = beat.gpus
        if beat.memory_read_gbs is not None:
            self.memory_read_gbs = beat.memory_read_gbs
        if beat.memory_read_one_core_gbs is not None:
            self.memory_read_one_core_gbs = beat.memory_read_one_core_gbs
        if beat.gpu_health is not None:
            self.gpu_health = beat.gpu_health
        if beat.vitals is not None:
            self.vitals = beat.vitals
        if beat.health_warnings is not None:
            self.health_warnings = beat.health_warnings
        if beat.ib_ports is not None:
            self.ib_ports = beat.ib_ports


def node_warnings(facts: HostFacts | None, live: LiveFigures) -> list[str]:
    """A node's warnings: discovery's at Register, then the heartbeats' (the cards'
    health and the slow tools'), none twice. Once an agent's heartbeats speak for its
    tools (``LiveFigures.aged``), its Register's words on them are left out: the tool
    may answer again since."""
    said = live.health_warnings or []
    old = facts.warnings if facts else []
    if live.aged and live.health_warnings is not None:
        old = [w for w in old if warning_kind(w) not in COLLECTED_KINDS]
    return list(dict.fromkeys([*old, *said]))


@dataclass(frozen=True)
class NodeFigures:
    """A node's facts and latest live figures read together: what placement, the
    planner, /metrics and the pages read. None is a figure the agent has not reported,
    never a zero."""

    cpu_count: int | None = None
    memory_total: int | None = None
    memory_available: int | None = None
    cpu_percent: float | None = None
    load: tuple[float, ...] | None = None
    gpus: tuple[GPU, ...] = ()
    # None: the agent reported no disks (unknown, not full).
    disks: tuple[Disk, ...] | None = None
    memory_read_gbs: float | None = None
    memory_read_one_core_gbs: float | None = None

    @classmethod
    def read(cls, facts: HostFacts | None, live: LiveFigures) -> NodeFigures:
        """The latest live figure where a heartbeat carried one, else the fact."""
        gpus = live.gpus if live.gpus is not None else facts.gpus if facts else None
        disks = live.disks if live.disks is not None else facts.disks if facts else None
        load = live.load if live.load is not None else facts.load if facts else None
        available = live.memory_available
        cpu = live.cpu_percent
        if facts is not None:
            available = facts.memory_available if available is None else available
            cpu = facts.cpu_percent if cpu is None else cpu
        return cls(
            cpu_count=facts.cpu_count if facts else None,
            memory_total=facts.memory_total if facts else None,
            memory_available=available,
            cpu_percent=cpu,
            load=None if load is None else tuple(load),
            gpus=tuple(gpus or ()),
            disks=None if disks is None else tuple(disks),
            memory_read_gbs=live.memory_read_gbs,
            memory_read_one_core_gbs=live.memory_read_one_core_gbs,
        )

    @classmethod
    def shown(cls, facts: HostFacts | None, live: LiveFigures, now: float) -> NodeFigures:
        """``read``, less what is not live: what /metrics and the pages show as now. A
        card whose figures are not live keeps what it is (``card_identity``)."""
        figures = cls.read(facts, live)
        fresh = {name: live.is_live(name, now) for name in FACT_FIGURES}
        if all(fresh.values()):
            return figures
        return dataclasses.replace(
            figures,
            memory_available=figures.memory_available if fresh["memory_available"] else None,
            cpu_percent=figures.cpu_percent if fresh["cpu_percent"] else None,
            load=figures.load if fresh["load"] else None,
            disks=figures.disks if fresh["disks"] else None,
            gpus=figures.gpus if fresh["gpus"] else tuple(map(card_identity, figures.gpus)),
        )


_PLAIN = (int, float, str, bool)
_FIELDS: dict[type, tuple[str, ...]] = {}


def plain(value: Any) -> Any:
    """What ``to_map`` (``llmgw.wire.codec``) makes of ``value``: dataclasses as maps
    without their None fields, lists and tuples as lists, enums as their values. The
    admin API shows every node's cards this way: a dataclass's field names are read once
    and kept, and scalars are taken as they are, so a node of eight cards maps in about
    a tenth of ``to_map``'s time (34 us against 360)."""
    kind = type(value)
    names = _FIELDS.get(kind)
    if names is None:
        if kind in _PLAIN or value is None:
            return value
        if kind is list or kind is tuple:
            return [v if type(v) in _PLAIN else plain(v) for v in value]
        if kind is dict:
            return {k: v if type(v) in _PLAIN else plain(v) for k, v in value.items()}
        if isinstance(value, enum.Enum):
            return value.value
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            return value
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(value))
    out: dict[str, Any] = {}
    for name in names:
        v = getattr(value, name)
        if v is None:
            continue
        out[name] = v if type(v) in _PLAIN else plain(v)
    return out
