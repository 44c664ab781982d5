"""NVIDIA IMEX on this node: whether ``nvidia-imex`` runs, and how many channels it has.

IMEX (Internode Memory Exchange) lets the cards of a multi-node NVLink domain (a GB200
NVL72 rack's trays) map each other's memory; without it running on every tray of the
domain, a job spanning trays cannot share memory over NVLink. Workloads reach it through
channel device nodes, ``/dev/nvidia-caps-imex-channels/channel<N>``.

``read_imex`` is cheap and does not run anything: it looks for a process named
``nvidia-imex`` in ``/proc`` (its ``comm``, skipping zombies) and counts the channel
nodes. A node with no sign of IMEX at all (no such process, no channels directory, no
``/etc/nvidia-imex``, no ``nvidia-imex`` binary in the usual places) answers None: not
a node that uses IMEX, so nothing to report, rather than "not running". ``root`` is the
filesystem root the paths are read under, for tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROCESS = "nvidia-imex"
CHANNELS = "dev/nvidia-caps-imex-channels"
# Where IMEX's package puts its configuration and daemon: any of them means "set up".
SIGNS = ("etc/nvidia-imex", "usr/bin/nvidia-imex", "usr/sbin/nvidia-imex")


@dataclass(frozen=True)
class Imex:
    """What was read; ``channels`` is None when the channels directory could not be read."""

    running: bool
    channels: int | None


def _running(proc: Path) -> bool | None:
    """Whether a live process named nvidia-imex is in ``proc``; None when it is unreadable."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            if (proc / entry / "comm").read_text().strip() != PROCESS:
                continue
            stat = (proc / entry / "stat").read_text()
        except OSError:
            continue  # gone since listed, or not ours to read
        # "pid (comm) S ...": the state follows the last ')'; Z is a zombie, X dead.
        state = stat.rpartition(")")[2].split()[:1]
        if state not in (["Z"], ["X"]):
            return True
    return False


def _channels(root: Path) -> int | None:
    try:
        names = os.listdir(root / CHANNELS)
    except FileNotFoundError:
        return 0
    except OSError:
        return None
    return sum(1 for n in names if n.startswith("channel") and n[7:].isdigit())


def read_imex(root: Path = Path("/")) -> Imex | None:
    """IMEX on the node under ``root``; None where there is no sign of it, or ``/proc``
    cannot be read."""
    running = _running(root / "proc")
    if running is None:
        return None
    set_up = running or (root / CHANNELS).is_dir() or any((root / s).exists() for s in SIGNS)
    if not set_up:
        return None
    return Imex(running=running, channels=_channels(root))
