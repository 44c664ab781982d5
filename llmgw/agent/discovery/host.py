"""The host itself: CPU model, counts and vector extensions, memory, OS, kernel and load.

The parsers here are pure (text in, figures out), so tests feed them recorded
/proc/cpuinfo and os-release text. The readers around them touch the live system and
may block, so the agent calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
import platform
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

X86_ARCHES = frozenset({"x86_64", "i386", "i686"})
ARM_ARCHES = frozenset({"aarch64", "armv7l", "armv8l"})

# Only what inference engines pick kernels by (ggml's CPU variants, vLLM/SGLang's CPU
# backends); the other hundred cpuinfo flags would be noise on every Register.
# Ordered roughly weakest to strongest so a listing reads as a ladder.
X86_VECTOR_FLAGS = (
    "sse4_2",
    "avx",
    "f16c",
    "fma",
    "bmi2",
    "avx2",
    "avx_vnni",
    "avx512f",
    "avx512cd",
    "avx512dq",
    "avx512bw",
    "avx512vl",
    "avx512vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "amx_fp16",
)
ARM_VECTOR_FLAGS = (
    "neon",
    "asimd",
    "asimdhp",
    "asimddp",
    "fphp",
    "i8mm",
    "bf16",
    "sve",
    "sve2",
    "svei8mm",
    "svebf16",
    "sme",
    "sme2",
)

AVX2_FIX = (
    "on a virtual machine, give it the host CPU model (QEMU `-cpu host`, libvirt "
    "`<cpu mode='host-passthrough'/>`, Proxmox CPU type `host`); on bare metal the CPU "
    "predates AVX2 (Intel Haswell / AMD Excavator) and CPU inference will stay slow"
)

# Implementer and part codes from the Arm TRMs: aarch64 cpuinfo has no "model name".
_ARM_IMPLEMENTERS = {
    0x41: "Arm",
    0x48: "HiSilicon",
    0x4E: "NVIDIA",
    0x51: "Qualcomm",
    0x61: "Apple",
    0xC0: "Ampere",
}
_ARM_PARTS = {
    (0x41, 0xD03): "Arm Cortex-A53",
    (0x41, 0xD05): "Arm Cortex-A55",
    (0x41, 0xD07): "Arm Cortex-A57",
    (0x41, 0xD08): "Arm Cortex-A72",
    (0x41, 0xD0B): "Arm Cortex-A76",
    (0x41, 0xD0C): "Arm Neoverse N1",
    (0x41, 0xD40): "Arm Neoverse V1",
    (0x41, 0xD49): "Arm Neoverse N2",
    (0x41, 0xD4F): "Arm Neoverse V2",
    (0x41, 0xD84): "Arm Neoverse V3",
    (0x41, 0xD8E): "Arm Neoverse N3",
}


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says. ``hypervisor`` is x86's flag for "running in a VM"."""

    model: str | None = None
    logical: int | None = None
    cores: int | None = None
    flags: tuple[str, ...] = ()
    hypervisor: bool = False


@dataclass(frozen=True)
class HostReading:
    """Every host-level figure of one scan; None where it could not be read."""

    os: str
    arch: str
    kernel: str | None
    cpu: CpuInfo
    memory_total: int | None
    memory_available: int | None
    load: list[float] | None
    warnings: list[str] = field(default_factory=list)


def normalise_arch(machine: str) -> str:
    """The kernel's name for the architecture (macOS and Windows spell it differently)."""
    m = machine.strip().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(m, m)


def is_x86(arch: str) -> bool:
    return normalise_arch(arch) in X86_ARCHES


def _blocks(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current.setdefault(key.strip().lower(), value.strip())
    if current:
        blocks.append(current)
    return blocks


def _arm_model(block: dict[str, str]) -> str | None:
    try:
        implementer = int(block["cpu implementer"], 16)
        part = int(block["cpu part"], 16)
    except (KeyError, ValueError):
        return None
    known = _ARM_PARTS.get((implementer, part))
    if known:
        return known
    vendor = _ARM_IMPLEMENTERS.get(implementer, f"implementer {implementer:#x}")
    return f"{vendor} CPU part {part:#x}"


def parse_cpuinfo(text: str, arch: str) -> CpuInfo:
    """Model, counts and the inference-relevant vector extensions from /proc/cpuinfo."""
    blocks = _blocks(text)
    processors = [b for b in blocks if "processor" in b]
    if not processors:
        return CpuInfo()
    first = processors[0]
    model = first.get("model name") or first.get("cpu model") or _arm_model(first)
    # Physical cores are distinct (package, core) pairs; aarch64 does not list them.
    pairs = {(b.get("physical id", "0"), b["core id"]) for b in processors if "core id" in b}
    wanted = ARM_VECTOR_FLAGS if normalise_arch(arch) in ARM_ARCHES else X86_VECTOR_FLAGS
    raw = set((first.get("flags") or first.get("features") or "").split())
    return CpuInfo(
        model=model or None,
        logical=len(processors),
        cores=len(pairs) or None,
        flags=tuple(f for f in wanted if f in raw),
        hypervisor="hypervisor" in raw,
    )


def cpu_warnings(arch: str, cpu: CpuInfo) -> list[str]:
    """The CPU's problems for inference, each with its fix."""
    if not is_x86(arch) or "avx2" in cpu.flags:
        return []
    found = ", ".join(cpu.flags) or "none"
    where = "this is a virtual machine: " if cpu.hypervisor else ""
    return [
        f"CPU: no AVX2 (vector extensions found: {found}); llama.cpp runs several times "
        f"slower on this CPU. Fix: {where}{AVX2_FIX}"
    ]


def parse_os_release(text: str) -> str | None:
    """PRETTY_NAME of an os-release file, else NAME and VERSION_ID, else None."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        try:
            words = shlex.split(raw)
        except ValueError:  # an unbalanced quote: take the text as it stands
            words = [raw.strip("\"'")]
        values[key] = " ".join(words)
    if values.get("PRETTY_NAME"):
        return values["PRETTY_NAME"]
    name = " ".join(v for v in (values.get("NAME"), values.get("VERSION_ID")) if v)
    return name or None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def read_os_name(
    paths: Iterable[Path] = (Path("/etc/os-release"), Path("/usr/lib/os-release")),
) -> str:
    for path in paths:
        text = _read_text(path)
        if text is not None:
            name = parse_os_release(text)
            if name:
                return name
    return platform.system() or "unknown"


def read_cpu(arch: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    """cpuinfo where the kernel has one, with psutil's counts where it lacks them."""
    text = _read_text(cpuinfo)
    cpu = parse_cpuinfo(text, arch) if text else CpuInfo()
    logical = cpu.logical or psutil.cpu_count(logical=True)
    cores = cpu.cores or psutil.cpu_count(logical=False)
    return CpuInfo(cpu.model, logical, cores, cpu.flags, cpu.hypervisor)


def read_memory() -> tuple[int | None, int | None]:
    """Total and available bytes; available counts reclaimable cache, as the kernel does."""
    try:
        vm = psutil.virtual_memory()
    except (OSError, RuntimeError):
        return None, None
    return int(vm.total), int(vm.available)


def read_load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _busy_and_total() -> tuple[float, float]:
    # psutil.cpu_percent's own arithmetic: guest time is already inside user/nice on
    # Linux, and iowait is idle time.
    t = psutil.cpu_times()
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return total - t.idle - getattr(t, "iowait", 0.0), total


class CpuMeter:
    """CPU utilisation (percent of all CPUs) between two samples.

    Keeps its own previous sample rather than psutil.cpu_percent's process-wide one, so
    another caller in the agent cannot shrink our window to nothing. The first sample,
    or one taken too soon after the last, is None: a figure not read, not 0 %.
    """

    MIN_INTERVAL = 0.05

    def __init__(
        self,
        read: Callable[[], tuple[float, float]] = _busy_and_total,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._clock = clock
        self._last: tuple[float, float, float] | None = None
        self.sample()

    def sample(self) -> float | None:
        try:
            busy, total = self._read()
        except (OSError, RuntimeError):
            return None
        now = self._clock()
        last, self._last = self._last, (now, busy, total)
        if last is None or now - last[0] < self.MIN_INTERVAL or total <= last[2]:
            return None
        percent = (busy - last[1]) / (total - last[2]) * 100.0
        return round(min(100.0, max(0.0, percent)), 1)


def read_host(cpuinfo: Path = Path("/proc/cpuinfo")) -> HostReading:
    """One blocking scan of the host-level figures."""
    arch = normalise_arch(platform.machine())
    cpu = read_cpu(arch, cpuinfo)
    total, available = read_memory()
    return HostReading(
        os=read_os_name(),
        arch=arch or "unknown",
        kernel=platform.release() or None,
        cpu=cpu,
        memory_total=total,
        memory_available=available,
        load=read_load(),
        warnings=cpu_warnings(arch, cpu),
    )
