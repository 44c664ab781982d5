"""What Slurm's own commands print, read into typed records: pure, no IO.

- ``slurmd -C``: the node as slurmd sees it (``SlurmdFacts``); its ``UpTime=`` line and
  a ``Found gpu:... with Autodetect=...`` line are not the node's shape and are skipped.
- ``scontrol show node NAME``, multi-line or ``-o`` (one line): ``SlurmNodeRecord``.
  Values hold spaces ("OS=Linux 6.1 #1 SMP PREEMPT_DYNAMIC ...", "Reason=llmgw:
  reclaimed [root@2026-...]"), so a record is cut only where a key scontrol prints
  begins, never at every space; the reason loses its "[user@time]" tail.
- ``squeue -h -o '%i|%j|%u|%T|%e'`` (``SQUEUE_FORMAT``): ``SlurmJob``s, the end as epoch
  seconds read in the node's local time (squeue prints local ISO time); "N/A",
  "Unknown" and "NONE" (no limit) are None.
- ``slurmd -V`` ("slurm-wlm 22.05.8", "slurm 23.11.4"): the version, and whether it is
  new enough (22.05, the first with cgroup v2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from llmgw.wire.messages import SlurmdFacts, SlurmJob

# The oldest Slurm llmgw runs: 22.05 is the first whose cgroup/v2 plugin confines jobs.
MIN_VERSION = (22, 5)
SQUEUE_FORMAT = "%i|%j|%u|%T|%e"

# Every key ``scontrol show node`` prints, 22.05 to 26.05: a record is cut only where
# one of these starts after whitespace (a value may hold spaces, and "=" in a reason).
NODE_KEYS = frozenset(
    """NodeName Arch CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures
    ActiveFeatures Gres GresDrain GresUsed NodeAddr NodeHostName Port Version OS
    RealMemory AllocMem FreeMem Sockets Boards CoreSpecCount CPUSpecList MemSpecLimit
    State ThreadsPerCore TmpDisk Weight Owner MCS_label Partitions BootTime
    SlurmdStartTime LastBusyTime ResumeAfterTime SuspendTime CfgTRES AllocTRES CapWatts
    CurrentWatts AveWatts LowestJoules ConsumedJoules ExtSensorsJoules ExtSensorsWatts
    ExtSensorsTemp Reason Comment Extra NextState InstanceId InstanceType TresWeights
    TopologyBlock Topology ReservationName""".split()
)
_KEY = re.compile(r"(?:^|\s)(" + "|".join(sorted(NODE_KEYS, key=len, reverse=True)) + r")=")
# "llmgw: reclaimed [root@2026-12-06T06:53:12]": who set it and when, not the reason.
_REASON_TAIL = re.compile(r"\s*\[[^\[\]@]*@[^\[\]]*\]\s*$")
_VERSION = re.compile(r"\b(\d+)\.(\d+)(?:\.(\d+))?\b")
_NO_TIME = frozenset({"N/A", "Unknown", "NONE", "INFINITE", "(null)", ""})


class SlurmReadError(ValueError):
    """Slurm printed something not in the shape its command prints."""


@dataclass(frozen=True)
class SlurmNodeRecord:
    """One node as ``scontrol show node`` says it; absent fields are None."""

    name: str
    state: str | None = None
    reason: str | None = None
    gres: str | None = None
    version: str | None = None
    address: str | None = None
    hostname: str | None = None
    cpus: int | None = None
    real_memory: int | None = None
    partitions: tuple[str, ...] = ()

    @property
    def flags(self) -> tuple[str, ...]:
        """State's parts: "IDLE+DRAIN+NOT_RESPONDING" is IDLE, DRAIN, NOT_RESPONDING."""
        return tuple(self.state.split("+")) if self.state else ()

    @property
    def drained(self) -> bool:
        """Drained or draining (Slurm places nothing new here)."""
        return any(f in ("DRAIN", "DRAINED", "DRAINING") for f in self.flags)


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _pairs(text: str) -> dict[str, str]:
    """``Key=value`` pairs, each value running to where the next known key starts."""
    flat = " ".join(line.strip() for line in text.splitlines())
    marks = list(_KEY.finditer(flat))
    out: dict[str, str] = {}
    for i, mark in enumerate(marks):
        stop = marks[i + 1].start() if i + 1 < len(marks) else len(flat)
        out.setdefault(mark.group(1), flat[mark.end() : stop].strip())
    return out


def _absent(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "N/A") else value


def parse_slurmd_c(text: str) -> SlurmdFacts:
    """``slurmd -C``'s NodeName line."""
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue  # UpTime=..., "Found gpu:... with Autodetect=..."
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        cpus = _int(fields.get("CPUs"))
        if cpus is None:
            raise SlurmReadError(f"slurmd -C printed no CPUs= on its NodeName line: {line!r}")
        return SlurmdFacts(
            cpus=cpus,
            boards=_int(fields.get("Boards")),
            sockets_per_board=_int(fields.get("SocketsPerBoard")),
            cores_per_socket=_int(fields.get("CoresPerSocket")),
            threads_per_core=_int(fields.get("ThreadsPerCore")),
            real_memory=_int(fields.get("RealMemory")),
            gres=_absent(fields.get("Gres")),
        )
    raise SlurmReadError("slurmd -C printed no NodeName= line")


def _record(text: str) -> SlurmNodeRecord:
    fields = _pairs(text)
    name = fields.get("NodeName")
    if not name:
        raise SlurmReadError(f"not a scontrol node record: {text[:80]!r}")
    reason = _absent(fields.get("Reason"))
    if reason is not None:
        reason = _REASON_TAIL.sub("", reason) or None
    parts = _absent(fields.get("Partitions"))
    return SlurmNodeRecord(
        name=name.split()[0],
        state=_absent(fields.get("State")),
        reason=reason,
        gres=_absent(fields.get("Gres")),
        version=_absent(fields.get("Version")),
        address=_absent(fields.get("NodeAddr")),
        hostname=_absent(fields.get("NodeHostName")),
        cpus=_int(fields.get("CPUTot")),
        real_memory=_int(fields.get("RealMemory")),
        partitions=tuple(p for p in (parts or "").split(",") if p),
    )


def parse_nodes(text: str) -> list[SlurmNodeRecord]:
    """Every record of ``scontrol show node(s)``, in either form: a record starts at
    each line that starts with ``NodeName=``."""
    chunks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("NodeName="):
            chunks.append([line])
        elif chunks and line.strip():
            chunks[-1].append(line)
    return [_record("\n".join(chunk)) for chunk in chunks]


def parse_node(text: str) -> SlurmNodeRecord:
    """``scontrol show node NAME``: its one record."""
    nodes = parse_nodes(text)
    if not nodes:
        raise SlurmReadError(f"scontrol printed no node record: {text.strip()[:120]!r}")
    return nodes[0]


def parse_end(value: str) -> float | None:
    """squeue's ``%e``: local ISO time as epoch seconds; None for no known end."""
    value = value.strip()
    if value in _NO_TIME:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def parse_squeue(text: str) -> list[SlurmJob]:
    """``squeue -h -o SQUEUE_FORMAT``, one job a line. A job's name may hold "|": the
    fields around it are counted from both ends."""
    jobs: list[SlurmJob] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 5:
            raise SlurmReadError(f"squeue printed a line not in {SQUEUE_FORMAT!r}: {line!r}")
        job_id, name = parts[0].strip(), "|".join(parts[1:-3])
        user, state, end = parts[-3], parts[-2], parts[-1]
        jobs.append(
            SlurmJob(
                id=job_id,
                name=name or None,
                user=user or None,
                state=state or None,
                end=parse_end(end),
            )
        )
    return jobs


def parse_version(text: str) -> str | None:
    """``slurmd -V`` (or any Slurm command's ``-V``): "22.05.8"; None if not there."""
    for line in text.splitlines():
        if line.lower().startswith("slurm"):
            found = _VERSION.search(line)
            if found:
                return found.group(0)
    return None


def version_tuple(version: str) -> tuple[int, ...]:
    found = _VERSION.search(version)
    if found is None:
        raise SlurmReadError(f"not a Slurm version: {version!r}")
    return tuple(int(g) for g in found.groups() if g is not None)


def version_ok(version: str) -> bool:
    """22.05 or newer (cgroup v2)."""
    return version_tuple(version)[:2] >= MIN_VERSION
