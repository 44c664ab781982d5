"""The node as a whole: ``Discovery`` gathers host, disks and cards into one report.

``facts`` is the full scan for Register; ``live`` the figures that move, for each
heartbeat. Both stay well under a second on a sound machine: blocking reads run through
``asyncio.to_thread``, disks and cards are read at the same time, and a disk scan that
hangs (a dead NFS server) is left behind after a timeout instead of holding the beat.

The cards' slow figures (ECC, retired and remapped rows, NVLink) are read every
``slow_interval`` and sent then; sooner when an Xid arrives, or when they changed in a
read that gives them anyway (``nvidia-smi -q -x`` does, each heartbeat). The node's
health warnings are sent whenever they change. Whether IMEX runs (``imex``) is read
every ``slow_interval`` and sent with the vitals. A card's processes are listed without
this node's own engines (their process groups, given by ``engine_groups``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from llmgw.agent.discovery.dcgm import ProfCounters, scrape_dcgm_exporter
from llmgw.agent.discovery.disks import scan_disks
from llmgw.agent.discovery.health import card_warnings
from llmgw.agent.discovery.host import CpuMeter, read_host, read_load, read_memory
from llmgw.agent.discovery.ibwatch import PortWatch
from llmgw.agent.discovery.imex import Imex, read_imex
from llmgw.agent.discovery.nvidia import NvidiaCards
from llmgw.agent.discovery.nvidia_smi import run_nvidia_smi_topo
from llmgw.agent.discovery.nvml import NvmlSource, process_group
from llmgw.agent.discovery.vitals import RaplMeter, read_hwmon
from llmgw.agent.discovery.xidwatch import KMSG, XidWatch
from llmgw.wire.messages import GPU, Disk, GpuHealth, HostFacts, IbPort, NodeVitals


@dataclass(frozen=True)
class Live:
    """The figures a heartbeat carries; None where not read this time."""

    memory_available: int | None
    cpu_percent: float | None
    load: list[float] | None
    disks: list[Disk] | None
    gpus: list[GPU] | None
    warnings: list[str] = field(default_factory=list)
    # Sent only when due or changed; None leaves the control plane's last copy.
    gpu_health: list[GpuHealth] | None = None
    vitals: NodeVitals | None = None
    health_warnings: list[str] | None = None
    ib_ports: list[IbPort] | None = None


class Discovery:
    """Reads the node: what it is (``facts``) and how it is doing (``live``).

    ``directories`` are the ones the agent writes to (weights, engines, state, logs);
    their filesystems are the disks reported. ``nvml`` defaults to the real NVML and
    ``nvidia_smi`` (a name on PATH, a path, or a command list) is the fallback.
    """

    def __init__(
        self,
        directories: Sequence[str | os.PathLike[str]],
        nvml: NvmlSource | None = None,
        nvidia_smi: str | Sequence[str] = "nvidia-smi",
        *,
        disk_timeout: float = 5.0,
        nvidia_smi_timeout: float = 10.0,
        cpuinfo: Path = Path("/proc/cpuinfo"),
        slow_interval: float = 60.0,
        dcgm_exporter: str | None = None,
        kmsg: Path = KMSG,
        sysfs: Path = Path("/sys/class"),
        clock: Callable[[], float] = time.time,
        ports: PortWatch | None = None,
    ) -> None:
        self._directories = [os.fspath(d) for d in directories]
        self._smi = [nvidia_smi] if isinstance(nvidia_smi, str) else list(nvidia_smi)
        self._smi_timeout = nvidia_smi_timeout
        self._cards = NvidiaCards(nvml, nvidia_smi, nvidia_smi_timeout, XidWatch(kmsg))
        self._disk_timeout = disk_timeout
        self._cpuinfo = cpuinfo
        self._disk_scan: asyncio.Task[list[Disk]] | None = None
        # Primed now so the first report has a window to measure over.
        self._cpu = CpuMeter()
        self._slow_interval = slow_interval
        self._dcgm = dcgm_exporter
        self._hwmon = sysfs / "hwmon"
        self._rapl = RaplMeter(sysfs / "powercap")
        self._clock = clock
        self._ports = ports or PortWatch(sysfs.parent.parent)
        # IMEX (nvidia-imex and its channels), read every slow_interval, sent with vitals.
        self._root = sysfs.parent.parent
        self._imex: Imex | None = None
        self._imex_at = float("-inf")
        self._slow_at = float("-inf")
        self._health: list[GpuHealth] = []
        self._sent_xids: dict[str, object] = {}
        self._sent_warnings: list[str] | None = None
        # The process groups of this node's engines: theirs are not "other" processes.
        self.engine_groups: Callable[[], set[int]] = set

    async def _disks(self) -> tuple[list[Disk] | None, list[str]]:
        scan = self._disk_scan
        if scan is None:
            # A scan still running from an earlier call is waited on, not doubled: a
            # hung mount would otherwise take one more worker thread per heartbeat.
            scan = asyncio.ensure_future(asyncio.to_thread(scan_disks, self._directories))
            self._disk_scan = scan
        done, _ = await asyncio.wait({scan}, timeout=self._disk_timeout)
        if not done:
            return None, [
                f"disk: no answer in {self._disk_timeout:g} s reading the filesystems of "
                f"{', '.join(self._directories)}. Fix: look for a hung network mount "
                "(`df` hangs on it); remount it or bring its server back"
            ]
        self._disk_scan = None
        return scan.result(), []

    async def facts(self, hostname: str) -> HostFacts:
        """The full scan, for Register."""
        host, (disks, disk_warnings), cards = await asyncio.gather(
            asyncio.to_thread(read_host, self._cpuinfo),
            self._disks(),
            self._cards.read(retry_nvml=True, slow=True),
        )
        # A new stream (Register) starts the control plane's copy afresh: the first
        # heartbeat after it sends the slow figures and the warnings again, the slow
        # figures as read here rather than read all again.
        self._sent_xids, self._sent_warnings = {}, None
        if cards.health is not None:
            self._health, self._slow_at = cards.health, self._clock()
        topology = None
        if cards.gpus:
            topology = await run_nvidia_smi_topo(self._smi, self._smi_timeout)
        cpu = host.cpu
        return HostFacts(
            hostname=hostname,
            os=host.os,
            arch=host.arch,
            kernel=host.kernel,
            cpu_model=cpu.model,
            cpu_count=cpu.logical,
            cpu_cores=cpu.cores,
            cpu_flags=list(cpu.flags),
            memory_total=host.memory_total,
            memory_available=host.memory_available,
            cpu_percent=self._cpu.sample(),
            load=host.load,
            disks=disks,
            # HostFacts has no "not read" for cards; a failed read leaves its warning.
            gpus=cards.gpus or [],
            gpu_source=cards.source,
            warnings=[*host.warnings, *disk_warnings, *cards.warnings],
            cuda_version=cards.cuda_version,
            topology=topology,
        )

    async def live(self) -> Live:
        """The moving figures, for a heartbeat; the slow ones when due or changed."""
        now = self._clock()
        slow = now - self._slow_at >= self._slow_interval
        (memory, load, vitals), (disks, disk_warnings), cards, prof, ib = await asyncio.gather(
            asyncio.to_thread(lambda: (read_memory()[1], read_load(), self._vitals(now))),
            self._disks(),
            self._cards.read(slow=slow),
            self._profiling(),
            self._ports.read(),
        )
        gpus = cards.gpus
        health: list[GpuHealth] | None = None
        if gpus is not None:
            gpus = self._own_removed(self._with_profiling(gpus, prof))
            if cards.health is not None and (slow or cards.health != self._health):
                # Due, or read anyway (nvidia-smi reads them every time) and changed.
                if slow:
                    self._slow_at = now
                self._health = health = cards.health
            health = self._xids_news(health)
        said = None
        if gpus is not None:  # a failed read judges nothing: the last word stands
            warnings = card_warnings(gpus, self._health, now)
            said = None if warnings == self._sent_warnings and health is None else warnings
            self._sent_warnings = warnings
        return Live(
            memory_available=memory,
            cpu_percent=self._cpu.sample(),
            load=load,
            disks=disks,
            gpus=gpus,
            warnings=[*disk_warnings, *cards.warnings],
            gpu_health=health,
            vitals=vitals,
            health_warnings=said,
            ib_ports=ib,
        )

    def _vitals(self, now: float) -> NodeVitals | None:
        hwmon = read_hwmon(self._hwmon)
        power = self._rapl.sample()
        if now - self._imex_at >= self._slow_interval:
            self._imex, self._imex_at = read_imex(self._root), now
        imex = self._imex
        if not (hwmon.cpu or hwmon.board or power or imex):
            return None
        return NodeVitals(
            cpu_temperatures=hwmon.cpu or None,
            board_temperatures=hwmon.board or None,
            cpu_power=power or None,
            imex_running=imex.running if imex else None,
            imex_channels=imex.channels if imex else None,
        )

    async def _profiling(self) -> dict[str, ProfCounters]:
        if self._dcgm is None:
            return {}
        return await scrape_dcgm_exporter(self._dcgm) or {}

    @staticmethod
    def _with_profiling(gpus: list[GPU], prof: dict[str, ProfCounters]) -> list[GPU]:
        """dcgm-exporter's counters where NVML's GPM gave none."""
        out = []
        for g in gpus:
            c = prof.get(g.uuid)
            if c is None or g.sm_active is not None:
                out.append(g)
            else:
                out.append(
                    replace(
                        g,
                        sm_active=c.sm_active,
                        sm_occupancy=c.sm_occupancy,
                        tensor_active=c.tensor_active,
                        dram_active=c.dram_active,
                    )
                )
        return out

    def _own_removed(self, gpus: list[GPU]) -> list[GPU]:
        if not any(g.processes for g in gpus):
            return gpus
        own = self.engine_groups()
        return [
            replace(g, processes=[p for p in g.processes if process_group(p.pid) not in own])
            if g.processes
            else g
            for g in gpus
        ]

    def _xids_news(self, health: list[GpuHealth] | None) -> list[GpuHealth] | None:
        """The slow figures again, with fresh Xids, when an Xid arrived since sent."""
        xids = self._cards.xids
        now_seen = {h.uuid: xids.seen(h.uuid) for h in self._health}
        if now_seen == self._sent_xids and health is None:
            return None
        self._sent_xids = dict(now_seen)
        self._health = [replace(h, xids=now_seen.get(h.uuid)) for h in self._health]
        return self._health

    @property
    def reads_kernel_log(self) -> bool:
        """Whether Xids come from the kernel log (else NVML's events, since start)."""
        return self._cards.xids.uses_kernel_log

    async def close(self) -> None:
        """Stop NVML. A disk scan still hung is abandoned; its thread ends when it can."""
        if self._disk_scan is not None:
            self._disk_scan.cancel()
            self._disk_scan = None
        await self._cards.close()
