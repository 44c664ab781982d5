"""A node as the control plane sees it (``NodeView``): what its agent registered and
reported, its live figures, its scheduling marks, and the plain JSON the admin API shows
of it. The registry (``registry.py``) keeps one per node."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from llmgw.server.fleet.figures import (
    LiveFigures,
    NodeFigures,
    node_warnings,
    plain,
)
from llmgw.wire import HostFacts
from llmgw.wire.admin import NodeJson, SettingsReportJson
from llmgw.wire.messages import (
    EngineInfo,
    Message,
    Response,
    ShardStatus,
    ShardUsage,
    SlurmStatus,
)
from llmgw.wire.states import NodeState


class Session(Protocol):
    def close(self, reason: str) -> None: ...

    async def send(self, msg: Message) -> None: ...

    def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]: ...


# A record as the wire writes it (``to_map``): its fields, None ones left out.
WireMap = dict[str, Any]


@dataclass
class NodeView:
    id: str
    cert_serial: int
    state: NodeState = NodeState.NOT_READY
    reason: str = ""
    address: str | None = None
    version: str = ""
    # What discovery found (the agent's Register; the store's copy until it registers
    # again after a restart); None: never registered.
    facts: HostFacts | None = None
    # The latest of each figure its heartbeats carried since it registered.
    live: LiveFigures = field(default_factory=LiveFigures)
    last_heartbeat: float | None = None  # monotonic
    last_seen: float | None = None  # wall clock
    session: Session | None = None
    # What the agent reports of its shards, downloads and engines (latest of each).
    shards: dict[str, ShardStatus] = field(default_factory=dict)
    # The Ready replicas the store kept from before this control plane started: routed
    # to only on the probe's proof, and dropped when the agent registers.
    remembered: dict[str, ShardStatus] = field(default_factory=dict)
    # Each replica's share of the node (its latest heartbeat's), by replica id.
    usage: dict[str, ShardUsage] = field(default_factory=dict)
    downloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    engines: list[EngineInfo] = field(default_factory=list)
    engines_probed: bool = False
    engine_message: str | None = None
    # Per engine the fleet wants, what converging on it is doing, in the node's words.
    engine_progress: dict[str, str] = field(default_factory=dict)
    installable: list[str] = field(default_factory=list)
    # What the agent says it can do (Register.features): "ibnetdiscover", ...
    features: list[str] = field(default_factory=list)
    # Scheduling, set by an operator and kept in the store.
    cordoned: bool = False
    draining: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    # What the agent runs with, each setting with where it came from, and the version of
    # the cluster's settings it applied (its Register's); None until it says.
    settings: dict[str, Any] | None = None
    # What Slurm is on the node, as its agent last said (SlurmStatus); None: never said.
    slurm: SlurmStatus | None = None
    # The JSON form of each record ``as_json`` showed, kept while the record is the same
    # object: a node's facts change when it registers, its slow figures once a minute.
    _shown: dict[str, tuple[object, Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def figures(self) -> NodeFigures:
        return NodeFigures.read(self.facts, self.live)

    def routable(self) -> dict[str, ShardStatus]:
        """The shards the gateway may route to: the agent's word, and until its agent
        first registers after a control plane start, what the store remembered."""
        if not self.remembered:
            return self.shards
        return {**self.remembered, **self.shards}

    def engine_names(self) -> frozenset[str]:
        """Engines the node has (installed or configured), by name."""
        if not self.engines_probed:
            return frozenset()
        return frozenset(e.name for e in self.engines)

    def _plain(self, name: str, record: object) -> Any:
        kept = self._shown.get(name)
        if kept is not None and kept[0] is record:
            return kept[1]
        shown = plain(record)
        self._shown[name] = (record, shown)
        return shown

    def as_json(self) -> NodeJson:
        """The node as the admin API shows it: a flat object of plain fields, a live
        figure over the fact of registering, None for what was never read."""
        facts, live = self.facts, self.live
        gpus = live.gpus if live.gpus is not None else facts.gpus if facts else []
        disks = live.disks if live.disks is not None else facts.disks if facts else None
        load = live.load if live.load is not None else facts.load if facts else None
        cpu, available = live.cpu_percent, live.memory_available
        if facts is not None:
            cpu = facts.cpu_percent if cpu is None else cpu
            available = facts.memory_available if available is None else available
        health_warnings = list(live.health_warnings or [])
        now = time.time()
        shown = {
            "memory_available": available,
            "cpu_percent": cpu,
            "load": load,
            "disks": disks,
            "gpus": gpus or None,
            "gpu_health": live.gpu_health,
            "vitals": live.vitals,
            "ib_ports": live.ib_ports,
        }
        return {
            "id": self.id,
            "state": self.state,
            "reason": self.reason,
            "connected": self.session is not None,
            "address": self.address,
            "version": self.version,
            "last_seen": self.last_seen,
            "hostname": facts.hostname if facts else None,
            "os": facts.os if facts else None,
            "arch": facts.arch if facts else None,
            "kernel": facts.kernel if facts else None,
            "cpu_model": facts.cpu_model if facts else None,
            "cpu_count": facts.cpu_count if facts else None,
            "cpu_cores": facts.cpu_cores if facts else None,
            "cpu_flags": list(facts.cpu_flags) if facts else [],
            "cpu_percent": cpu,
            "load": None if load is None else list(load),
            "memory_total": facts.memory_total if facts else None,
            "memory_available": available,
            "disks": None if disks is None else self._plain("disks", disks),
            "gpus": self._plain("gpus", gpus),
            "gpu_source": facts.gpu_source if facts else None,
            "cuda_version": facts.cuda_version if facts else None,
            # Discovery's warnings and the cards' health warnings, each with its fix.
            "warnings": node_warnings(facts, live),
            "health_warnings": health_warnings,
            "gpu_health": self._plain("gpu_health", live.gpu_health),
            "vitals": self._plain("vitals", live.vitals),
            "topology": self._plain("topology", facts.topology if facts else None),
            # InfiniBand and RoCE ports with their counters; None until the agent says.
            "ib_ports": self._plain("ib_ports", live.ib_ports),
            # GB/s, measured once by the agent; None until it has.
            "memory_read_gbs": live.memory_read_gbs,
            "memory_read_one_core_gbs": live.memory_read_one_core_gbs,
            "figure_ages": live.ages(now),
            "stale_figures": [
                name for name, v in shown.items() if v is not None and not live.is_live(name, now)
            ],
            # None until the agent has looked; then [] means it has none.
            "engines": plain(self.engines) if self.engines_probed else None,
            "engine_message": self.engine_message,
            "engine_progress": dict(self.engine_progress),
            "engines_installable": list(self.installable),
            "cordoned": self.cordoned,
            "draining": self.draining,
            "labels": dict(self.labels),
            # The agent's own report, passed on as it came (Register.settings).
            "settings": cast("SettingsReportJson | None", self.settings),
            "features": list(self.features),
            # Filled by the admin API from the Slurm service (``api/replicas.py``).
            "slurm": None,
        }
