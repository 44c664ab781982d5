"""Node discovery: what the machine is (CPU, memory, disks, NVIDIA cards) and how it is doing.

``Discovery`` is the entry point: ``facts`` for Register, ``live`` for heartbeats. The
modules behind it are split by what they read: ``host`` (CPU, memory, OS, load),
``disks`` (filesystems of the agent's directories), ``nvml`` and ``nvidia_smi`` (the two
ways to read NVIDIA cards), ``nvidia`` (which of the two answers), ``cardread`` (their
answers as wire records), ``smixml``, ``mig``, ``topology``, ``xid``/``xidwatch`` and
``pcilink`` (the formats of NVIDIA's and the kernel's tools), ``health`` (warnings from
the figures), ``vitals`` (hwmon and RAPL) and ``dcgm`` (a node's dcgm-exporter).
"""

from __future__ import annotations

from llmgw.agent.discovery.cardread import read_nvml, read_nvml_health
from llmgw.agent.discovery.disks import (
    DiskTotals,
    Mount,
    disk_totals,
    is_shared,
    mount_of,
    mounts,
    scan_disks,
)
from llmgw.agent.discovery.health import card_warnings
from llmgw.agent.discovery.host import (
    AVX2_FIX,
    CpuInfo,
    CpuMeter,
    HostReading,
    cpu_warnings,
    is_x86,
    normalise_arch,
    parse_cpuinfo,
    parse_os_release,
    read_host,
)
from llmgw.agent.discovery.node import Discovery, Live
from llmgw.agent.discovery.nvidia import GpuReading, NvidiaCards, is_gpu_warning
from llmgw.agent.discovery.nvidia_smi import (
    QUERY_FIELDS,
    NvidiaSmiFormatError,
    SmiReading,
    parse_query_gpu_csv,
    run_nvidia_smi,
)
from llmgw.agent.discovery.nvml import (
    NvmlError,
    NvmlSource,
    NvmlUnavailable,
    PynvmlSource,
    decode_throttle,
)
from llmgw.agent.discovery.nvmlfake import FakeCard, FakeNvml
from llmgw.wire.warnings import warning_kind

__all__ = [
    "AVX2_FIX",
    "CpuInfo",
    "CpuMeter",
    "Discovery",
    "DiskTotals",
    "FakeCard",
    "FakeNvml",
    "GpuReading",
    "HostReading",
    "Live",
    "Mount",
    "NvidiaCards",
    "NvidiaSmiFormatError",
    "NvmlError",
    "NvmlSource",
    "NvmlUnavailable",
    "PynvmlSource",
    "QUERY_FIELDS",
    "SmiReading",
    "card_warnings",
    "cpu_warnings",
    "decode_throttle",
    "disk_totals",
    "is_gpu_warning",
    "is_shared",
    "is_x86",
    "mount_of",
    "mounts",
    "normalise_arch",
    "parse_cpuinfo",
    "parse_os_release",
    "parse_query_gpu_csv",
    "read_host",
    "read_nvml",
    "read_nvml_health",
    "run_nvidia_smi",
    "scan_disks",
    "warning_kind",
]
