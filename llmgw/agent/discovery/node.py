"""The node as a whole: ``Discovery`` gathers host, disks and cards into one report.

``facts`` is the full scan for Register; ``live`` the figures that move, for each
heartbeat. ``live`` never waits on a slow tool: the cards (NVML or nvidia-smi), the
disks (a dead NFS server hangs their scan), dcgm-exporter and the InfiniBand ports are
each read by a ``Collector`` on its own schedule with its own deadline, and a heartbeat
sends what each last read with its age (``Heartbeat.ages``). A collector that missed
its deadline or failed leaves its figures absent, names them in ``Heartbeat.unread``
and adds a warning naming the tool, since when and its fix, until it answers again.
Only the fast reads (memory, load, hwmon, RAPL) are made for the heartbeat itself.

The cards' slow figures (ECC, retired and remapped rows, NVLink) are read every
``slow_interval`` and sent then; sooner when an Xid arrives, or when they changed in a
read that gives them anyway (``nvidia-smi -q -x`` does, each read). The node's
warnings (the cards' health and the collectors') are sent whenever they change.
Whether IMEX runs (``imex``) is read every ``slow_interval`` and sent with the vitals.
A card's processes are listed without this node's own engines (their process groups,
given by ``engine_groups``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from llmgw.agent.discovery.collector import Collector, ReadFailed, Reading
from llmgw.agent.discovery.dcgm import ProfCounters, scrape_dcgm_exporter
from llmgw.agent.discovery.disks import scan_disks
from llmgw.agent.discovery.health import card_warnings
from llmgw.agent.discovery.host import CpuMeter, read_host, read_load, read_memory
from llmgw.agent.discovery.ibwatch import PortWatch
from llmgw.agent.discovery.imex import Imex, read_imex
from llmgw.agent.discovery.nvidia import GpuReading, NvidiaCards
from llmgw.agent.discovery.nvidia_smi import DRIVER_FIX, run_nvidia_smi_topo
from llmgw.agent.discovery.nvml import NvmlSource, process_group
from llmgw.agent.discovery.vitals import RaplMeter, read_hwmon
from llmgw.agent.discovery.xidwatch import KMSG, XidWatch
from llmgw.wire.hardware import GPU, Disk, GpuHealth, HostFacts, IbPort, NodeVitals
from llmgw.wire.warnings import split_fix

T = TypeVar("T")


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
    # Seconds since each collected figure was read (Heartbeat.ages), and the figures
    # whose collector failed: absent, and not live on the control plane either.
    ages: dict[str, float] | None = None
    unread: list[str] | None = None


@dataclass(frozen=True)
class CardRead:
    """One read of the cards, and whether it was a slow one (health figures due)."""

    cards: GpuReading
    slow: bool


# The figures of each collector, by the Heartbeat field that carries them.
CARD_FIGURES = ("gpus", "gpu_health")


class Discovery:
    """Reads the node: what it is (``facts``) and how it is doing (``live``).

    ``directories`` are the ones the agent writes to (weights, engines, state, logs);
    their filesystems are the disks reported. ``nvml`` defaults to the real NVML and
    ``nvidia_smi`` (a name on PATH, a path, or a command list) is the fallback.

    The slow reads (cards, disks, dcgm-exporter, InfiniBand ports) are collectors
    (``collector.Collector``): each runs every ``collect_interval`` seconds apart from
    the heartbeat with its own deadline (``card_deadline``, ``disk_timeout``), and
    ``live`` sends what they last read, with its age, without waiting. ``collect``
    reads them all now, for a one-shot caller (doctor) or a test.
    """

    def __init__(
        self,
        directories: Sequence[str | os.PathLike[str]],
        nvml: NvmlSource | None = None,
        nvidia_smi: str | Sequence[str] = "nvidia-smi",
        *,
        disk_timeout: float = 5.0,
        nvidia_smi_timeout: float = 10.0,
        card_deadline: float | None = None,
        collect_interval: float = 5.0,
        cpuinfo: Path = Path("/proc/cpuinfo"),
        slow_interval: float = 15.0,
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
        self._disk_scan: asyncio.Future[list[Disk]] | None = None
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
        self._health_at: float | None = None  # the card collector's clock
        self._sent_xids: dict[str, object] = {}
        self._sent_warnings: list[str] | None = None
        self._judged: list[str] = []  # the cards' warnings from their last figures
        # The next card read is a full one (Register's): NVML retried, slow figures read.
        self._full = False
        self._taken: Reading[CardRead] | None = None
        interval = collect_interval
        deadline = card_deadline if card_deadline is not None else nvidia_smi_timeout
        # A tool that stops or starts answering: the heartbeat goes at once (``news``).
        self._news = asyncio.Event()
        turned = self._news.set
        self._card_reads = Collector(
            lambda: self._cards.tool,
            self._read_cards,
            interval=interval,
            turned=turned,
            deadline=deadline,
            fix=DRIVER_FIX,
        )
        self._disk_reads = Collector(
            "disk",
            self._scan_disks,
            interval=interval,
            turned=turned,
            deadline=disk_timeout,
            doing=f"reading the filesystems of {', '.join(self._directories)}",
            fix=(
                "look for a hung network mount (`df` hangs on it); remount it or bring its "
                "server back"
            ),
        )
        self._port_reads = Collector(
            "ibstat",
            self._ports.read,
            interval=interval,
            turned=turned,
            deadline=deadline,
            fix="run `ibstat` by hand; check the RDMA drivers (`lsmod | grep ib_`)",
        )
        self._prof_reads = Collector(
            "dcgm-exporter",
            self._profiling,
            interval=interval,
            turned=turned,
            deadline=5.0,
            fix=f"check that dcgm-exporter runs and answers at {dcgm_exporter}",
        )
        self._collectors: list[Collector[Any]] = [
            self._card_reads,
            self._disk_reads,
            self._port_reads,
        ]
        if dcgm_exporter is not None:
            self._collectors.append(self._prof_reads)
        # The process groups of this node's engines: theirs are not "other" processes.
        self.engine_groups: Callable[[], set[int]] = set

    async def _scan_disks(self) -> list[Disk]:
        # A scan still running from an earlier read is waited on, not doubled: a hung
        # mount would otherwise take one more worker thread per read. The collector's
        # deadline cancels the wait, never the scan (a thread cannot be stopped).
        scan = self._disk_scan
        if scan is None or scan.done():
            scan = asyncio.ensure_future(asyncio.to_thread(scan_disks, self._directories))
            self._disk_scan = scan
        return await asyncio.shield(scan)

    async def _read_cards(self) -> CardRead:
        now = self._clock()
        full, self._full = self._full, False
        slow = full or now - self._slow_at >= self._slow_interval
        cards = await self._cards.read(retry_nvml=full, slow=slow)
        if cards.gpus is None:
            said = cards.warnings[-1] if cards.warnings else f"{self._cards.tool}: no answer"
            detail, fix = split_fix(said)
            raise ReadFailed(detail.partition(": ")[2] or detail, fix)
        if slow and cards.health is not None:
            self._slow_at = now
        return CardRead(cards, slow)

    async def _waited(self, collector: Collector[T], timeout: float) -> Reading[T] | None:
        """A fresh read for Register (``facts``); what there is while the tool fails."""
        return await collector.next(0 if collector.failing else timeout)

    async def facts(self, hostname: str) -> HostFacts:
        """The full scan, for Register."""
        self._full = True
        host, disks, cards = await asyncio.gather(
            asyncio.to_thread(read_host, self._cpuinfo),
            self._waited(self._disk_reads, self._disk_timeout + 1),
            self._waited(self._card_reads, self._card_reads.deadline + 1),
        )
        for c in self._collectors:
            c.start()
        # A new stream (Register) starts the control plane's copy afresh: the first
        # heartbeat after it sends the slow figures and the warnings again, the slow
        # figures as read here rather than read all again.
        self._sent_xids, self._sent_warnings = {}, None
        card_warnings_now: list[str] = []
        gpus: list[GPU] = []
        source = cuda = None
        if cards is not None:
            self._taken = cards
            read = cards.value.cards
            gpus, source, cuda = read.gpus or [], read.source, read.cuda_version
            card_warnings_now = read.warnings
            if read.health is not None:
                self._health, self._health_at = read.health, cards.at
        topology = None
        if gpus:
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
            disks=disks.value if disks is not None else None,
            # HostFacts has no "not read" for cards; a failed read leaves its warning.
            gpus=gpus,
            gpu_source=source,
            warnings=[
                *host.warnings,
                *(w for w in (self._disk_reads.warning, self._card_reads.warning) if w),
                *card_warnings_now,
            ],
            cuda_version=cuda,
            topology=topology,
        )

    async def collect(self) -> None:
        """Read every collector now and wait for it (each up to its deadline): for a
        one-shot caller and tests; heartbeats never wait on a read."""
        await asyncio.gather(*(c.next(c.deadline + 1) for c in self._collectors))

    async def news(self) -> None:
        """Returns when a tool has stopped or started answering since the last call: its
        figures' absence (or return) and warning are worth a heartbeat now."""
        await self._news.wait()
        self._news.clear()

    async def live(self) -> Live:
        """The moving figures, for a heartbeat: what the collectors last read (waited
        for only when nothing started them yet), the slow ones when due or changed."""
        now = self._clock()
        # Collectors not yet going (no facts() before: doctor, a test) are waited for
        # once; after Register's facts() started them, a heartbeat waits for none.
        first = [c.next(c.deadline + 1) for c in self._collectors if not c.scheduled]
        if first:
            await asyncio.gather(*first)
        memory, load, vitals = await asyncio.to_thread(
            lambda: (read_memory()[1], read_load(), self._vitals(now))
        )
        disks = self._disk_reads.latest
        ports = self._port_reads.latest
        prof = self._prof_reads.latest
        got = self._card_reads.latest
        gpus: list[GPU] | None = None
        health: list[GpuHealth] | None = None
        card_said: list[str] = []
        if got is not None:
            read = got.value
            card_said = read.cards.warnings
            gpus = self._own_removed(
                self._with_profiling(read.cards.gpus or [], prof.value if prof else {})
            )
            if got is not self._taken:
                self._taken = got
                fresh = read.cards.health
                if fresh is not None and (read.slow or fresh != self._health):
                    # Due, or read anyway (nvidia-smi reads them every time) and changed.
                    self._health, self._health_at = fresh, got.at
                    health = fresh
            health = self._xids_news(health)
            # A failed read judges nothing: the cards' last word stands.
            self._judged = card_warnings(gpus, self._health, now)
        failing = [c.warning for c in self._collectors if c.warning]
        warnings = [*self._judged, *failing, *card_said]
        said = None if warnings == self._sent_warnings and health is None else warnings
        self._sent_warnings = warnings
        return Live(
            memory_available=memory,
            cpu_percent=self._cpu.sample(),
            load=load,
            disks=disks.value if disks is not None else None,
            gpus=gpus,
            warnings=[*failing, *card_said],
            gpu_health=health,
            vitals=vitals,
            health_warnings=said,
            ib_ports=ports.value if ports is not None else None,
            ages=self._ages(),
            unread=self._unread() or None,
        )

    def _ages(self) -> dict[str, float] | None:
        ages: dict[str, float] = {}
        for name, c in (
            ("gpus", self._card_reads),
            ("disks", self._disk_reads),
            ("ib_ports", self._port_reads),
        ):
            age = c.age()
            if age is not None:
                ages[name] = round(age, 3)
        if self._health_at is not None and self._card_reads.latest is not None:
            ages["gpu_health"] = round(max(0.0, time.monotonic() - self._health_at), 3)
        return ages or None

    def _unread(self) -> list[str]:
        unread: list[str] = []
        if self._card_reads.failing:
            unread += CARD_FIGURES
        if self._disk_reads.failing:
            unread.append("disks")
        if self._port_reads.failing:
            unread.append("ib_ports")
        return unread

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
        found = await scrape_dcgm_exporter(self._dcgm)
        if found is None:
            raise ReadFailed(f"no answer from {self._dcgm}")
        return found

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
        """Stop the collectors and NVML. A disk scan still hung is abandoned; its thread
        ends when it can."""
        await asyncio.gather(*(c.close() for c in self._collectors))
        if self._disk_scan is not None:
            self._disk_scan.cancel()
            self._disk_scan = None
        await self._cards.close()
