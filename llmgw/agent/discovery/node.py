"""The node as a whole: ``Discovery`` gathers host, disks and cards into one report.

``facts`` is the full scan for Register; ``live`` the few figures that move, for each
heartbeat. Both stay well under a second on a sound machine: blocking reads run through
``asyncio.to_thread``, disks and cards are read at the same time, and a disk scan that
hangs (a dead NFS server) is left behind after a timeout instead of holding the beat.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.agent.discovery.disks import scan_disks
from llmgw.agent.discovery.host import CpuMeter, read_host, read_load, read_memory
from llmgw.agent.discovery.nvidia import NvidiaCards
from llmgw.agent.discovery.nvml import NvmlSource
from llmgw.wire.messages import GPU, Disk, HostFacts


@dataclass(frozen=True)
class Live:
    """The figures a heartbeat carries; None where not read this time."""

    memory_available: int | None
    cpu_percent: float | None
    load: list[float] | None
    disks: list[Disk] | None
    gpus: list[GPU] | None
    warnings: list[str] = field(default_factory=list)


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
    ) -> None:
        self._directories = [os.fspath(d) for d in directories]
        self._cards = NvidiaCards(nvml, nvidia_smi, nvidia_smi_timeout)
        self._disk_timeout = disk_timeout
        self._cpuinfo = cpuinfo
        self._disk_scan: asyncio.Task[list[Disk]] | None = None
        # Primed now so the first report has a window to measure over.
        self._cpu = CpuMeter()

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
            self._cards.read(retry_nvml=True),
        )
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
        )

    async def live(self) -> Live:
        """The moving figures, for a heartbeat."""
        (memory, load), (disks, disk_warnings), cards = await asyncio.gather(
            asyncio.to_thread(lambda: (read_memory()[1], read_load())),
            self._disks(),
            self._cards.read(),
        )
        return Live(
            memory_available=memory,
            cpu_percent=self._cpu.sample(),
            load=load,
            disks=disks,
            gpus=cards.gpus,
            warnings=[*disk_warnings, *cards.warnings],
        )

    async def close(self) -> None:
        """Stop NVML. A disk scan still hung is abandoned; its thread ends when it can."""
        if self._disk_scan is not None:
            self._disk_scan.cancel()
            self._disk_scan = None
        await self._cards.close()
