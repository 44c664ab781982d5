"""The hardware checks of ``llmgw doctor``: CPU, memory, disks, NVIDIA cards, the clock.

``hardware_checks`` judges a ``HostFacts`` that discovery already read, so it is pure
and tests hand it made-up facts. ``clock_check`` asks the system's time tools itself.
A check never fails for a missing tool; every warning carries its fix.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from llmgw.agent.discovery import AVX2_FIX, is_gpu_warning, is_x86, normalise_arch
from llmgw.wire.hardware import Disk, HostFacts
from llmgw.wire.warnings import split_fix

GiB = 1 << 30
MIN_AVAILABLE_MEMORY = 4 * GiB
# Below these a model download is likely to run out of room: warn. Below DISK_FULL not
# even the engines and logs fit: fail.
DISK_LOW_FRACTION = 0.10
DISK_LOW_BYTES = 5 * GiB
DISK_FULL_BYTES = 1 * GiB

Status = Literal["ok", "warn", "fail"]
# A command's exit status and output, or None when it could not run or hung.
Runner = Callable[[Sequence[str]], tuple[int, str] | None]


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report. ``fix`` says what to do when not ok."""

    name: str
    status: Status
    detail: str
    fix: str | None = None


def _size(n: int) -> str:
    if n >= 1024 * GiB:
        return f"{n / (1024 * GiB):.1f} TiB"
    return f"{n / GiB:.1f} GiB"


def cpu_check(facts: HostFacts) -> Check:
    flags = facts.cpu_flags
    counts = f"{facts.cpu_count} CPUs" if facts.cpu_count else "CPU count not read"
    if facts.cpu_cores:
        counts += f" ({facts.cpu_cores} cores)"
    about = f"{facts.cpu_model or 'unknown model'}, {counts}"
    arch = normalise_arch(facts.arch)
    if is_x86(arch):
        if not flags:
            return Check(
                "cpu",
                "warn",
                f"{about}: no vector extensions read from /proc/cpuinfo",
                "check that /proc/cpuinfo is readable by the agent's user",
            )
        if "avx2" not in flags:
            return Check(
                "cpu",
                "warn",
                f"{about}: no AVX2 (found: {', '.join(flags)}); llama.cpp runs several "
                "times slower without it",
                AVX2_FIX,
            )
        return Check("cpu", "ok", f"{about}: AVX2 present ({', '.join(flags)})")
    if arch == "aarch64":
        if not {"asimd", "neon"} & set(flags):
            return Check(
                "cpu",
                "warn",
                f"{about}: no NEON (asimd) read from /proc/cpuinfo",
                "check that /proc/cpuinfo is readable by the agent's user",
            )
        return Check("cpu", "ok", f"{about}: NEON present ({', '.join(flags)})")
    return Check("cpu", "ok", f"{about}: {facts.arch}, no vector extension check for it")


def memory_check(facts: HostFacts) -> Check:
    total, available = facts.memory_total, facts.memory_available
    if available is None:
        return Check("memory", "warn", "memory not read", "check that /proc/meminfo is readable")
    figures = (
        f"{_size(available)} of {_size(total)} available"
        if total
        else (f"{_size(available)} available")
    )
    if available < MIN_AVAILABLE_MEMORY:
        return Check(
            "memory",
            "warn",
            f"{figures}; under {_size(MIN_AVAILABLE_MEMORY)} leaves no room to load a model",
            "stop what else uses memory on this node, or add memory: loading a model "
            "takes about its weights' size in RAM",
        )
    return Check("memory", "ok", figures)


def _disk_check(disk: Disk) -> Check:
    name = f"disk {disk.path}"
    kind = f"{disk.fstype}, shared" if disk.shared else disk.fstype
    share = f" ({disk.free / disk.total:.0%})" if disk.total else ""
    detail = f"{_size(disk.free)} free of {_size(disk.total)}{share}, {kind}"
    fix = (
        f"free space on {disk.path} (delete weights no longer served, old engine builds "
        "and logs) or move the agent's directories to a larger filesystem"
    )
    if disk.free < DISK_FULL_BYTES:
        return Check(name, "fail", f"{detail}: too full to fetch weights or write logs", fix)
    low = disk.free < DISK_LOW_BYTES or (
        disk.total > 0 and disk.free < disk.total * DISK_LOW_FRACTION
    )
    if low:
        return Check(
            name,
            "warn",
            f"{detail}: under {DISK_LOW_FRACTION:.0%} or {_size(DISK_LOW_BYTES)} free",
            fix,
        )
    return Check(name, "ok", detail)


def disk_checks(facts: HostFacts) -> list[Check]:
    if facts.disks is None:
        said = [w for w in facts.warnings if w.startswith("disk:")]
        detail, fix = split_fix(said[0]) if said else ("disk space not read", None)
        return [Check("disks", "warn", detail, fix or "run `df` on the agent's directories")]
    if not facts.disks:
        # Not a failure: the agent makes its directories when it first starts.
        return [
            Check(
                "disks",
                "warn",
                "none of the agent's directories exists yet, so their space is unknown",
                "start the agent once (it creates them) or check the paths in agent.yaml",
            )
        ]
    return [_disk_check(d) for d in facts.disks]


def nvidia_check(facts: HostFacts) -> Check:
    warnings = [w for w in facts.warnings if is_gpu_warning(w)]
    gpus = facts.gpus
    if gpus:
        models = Counter(g.name for g in gpus)
        kinds = ", ".join(f"{n}x {name}" for name, n in models.items())
        drivers = sorted({g.driver for g in gpus if g.driver})
        driver = f"driver {', '.join(drivers)}" if drivers else "driver version not read"
        found = f"{len(gpus)} card{'s' if len(gpus) != 1 else ''}: {kinds}; {driver}"
        found += f" (read by {facts.gpu_source})" if facts.gpu_source else ""
    else:
        found = "no NVIDIA cards"
    if warnings:
        details, fixes = zip(*(split_fix(w) for w in warnings), strict=True)
        fix = next((f for f in fixes if f), "run `nvidia-smi` by hand and read its error")
        return Check("nvidia", "warn", f"{found}; {'; '.join(details)}", fix)
    return Check("nvidia", "ok", found)


def other_checks(facts: HostFacts) -> list[Check]:
    """Discovery warnings no check above speaks for, so none goes unreported."""
    known = ("CPU:", "disk:")
    rest = [w for w in facts.warnings if not w.startswith(known) and not is_gpu_warning(w)]
    out = []
    for w in rest:
        detail, fix = split_fix(w)
        out.append(Check("discovery", "warn", detail, fix or "see the agent's log around it"))
    return out


def hardware_checks(facts: HostFacts) -> list[Check]:
    """CPU, memory, each disk, and the NVIDIA cards, judged from discovery's facts."""
    return [
        cpu_check(facts),
        memory_check(facts),
        *disk_checks(facts),
        nvidia_check(facts),
        *other_checks(facts),
    ]


def parse_timedatectl(output: str) -> bool | None:
    value = output.strip().lower()
    return {"yes": True, "no": False}.get(value)


def parse_chronyc_tracking(output: str) -> bool | None:
    """Whether chronyd is synchronised, from ``chronyc tracking``'s Leap status line."""
    m = re.search(r"^Leap status\s*:\s*(.+)$", output, re.M)
    if m is None:
        return None
    return m[1].strip().lower() != "not synchronised"


def parse_ntpq_peers(output: str) -> bool | None:
    """Whether ntpd has a system peer: a ``*`` tally code in ``ntpq -pn``."""
    rows = [line for line in output.splitlines()[2:] if line.strip()]
    if not rows:
        return None
    return any(line.startswith("*") for line in rows)


def _run(args: Sequence[str]) -> tuple[int, str] | None:
    try:
        done = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=5,
            env={**os.environ, "LC_ALL": "C"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.returncode, done.stdout


_CLOCK_TOOLS: tuple[tuple[str, list[str], Callable[[str], bool | None]], ...] = (
    ("timedatectl", ["timedatectl", "show", "-p", "NTPSynchronized", "--value"], parse_timedatectl),
    ("chronyc", ["chronyc", "-n", "tracking"], parse_chronyc_tracking),
    ("ntpq", ["ntpq", "-pn"], parse_ntpq_peers),
)


def clock_check(run: Runner = _run, which: Callable[[str], str | None] = shutil.which) -> Check:
    """Whether the clock is kept in time: timedatectl, else chronyc, else ntpq.

    A tool that is missing or cannot answer (timedatectl in a container without
    systemd) hands over to the next; none answering is "could not tell", not a failure.
    """
    for tool, args, parse in _CLOCK_TOOLS:
        if which(tool) is None:
            continue
        answer = run(args)
        if answer is None or answer[0] != 0:
            continue
        synced = parse(answer[1])
        if synced is True:
            return Check("clock", "ok", f"clock synchronised ({tool})")
        if synced is False:
            return Check(
                "clock",
                "warn",
                f"clock not synchronised ({tool}); TLS certificates and token expiry depend on it",
                "turn time sync on: `timedatectl set-ntp true`, or install and start chrony",
            )
    return Check(
        "clock",
        "warn",
        "could not tell whether the clock is synchronised (no answer from timedatectl, "
        "chronyc or ntpq); TLS certificates and token expiry depend on it",
        "check that this node syncs its clock (chrony or systemd-timesyncd); in a "
        "container, the host's clock is the one to check",
    )
