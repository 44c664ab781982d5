"""Where Slurm keeps its files on a node, from the one root the cluster names
(``ctl slurm setup --root``): the control plane writes these into slurm.conf and the
agent makes the directories before it starts a daemon, so both read them here.

An empty root is the system's own layout, as Debian's and the RPM packages have it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class SlurmPaths:
    state_save: str  # slurmctld's StateSaveLocation
    slurmd_spool: str  # SlurmdSpoolDir (configless slurmd caches slurm.conf in it)
    log_dir: str
    ctld_pid: str
    slurmd_pid: str

    @property
    def ctld_log(self) -> str:
        return str(PurePosixPath(self.log_dir) / "slurmctld.log")

    @property
    def slurmd_log(self) -> str:
        return str(PurePosixPath(self.log_dir) / "slurmd.log")


def slurm_paths(root: str) -> SlurmPaths:
    """The paths under ``root`` (absolute), or the system's for an empty root."""
    if not root:
        return SlurmPaths(
            state_save="/var/spool/slurmctld",
            slurmd_spool="/var/spool/slurmd",
            log_dir="/var/log/slurm",
            ctld_pid="/run/slurmctld.pid",
            slurmd_pid="/run/slurmd.pid",
        )
    base = PurePosixPath(root)
    if not base.is_absolute():
        raise ValueError(f"Slurm's root must be an absolute path, not {root!r}")
    return SlurmPaths(
        state_save=str(base / "slurmctld"),
        slurmd_spool=str(base / "slurmd"),
        log_dir=str(base / "log"),
        ctld_pid=str(base / "slurmctld.pid"),
        slurmd_pid=str(base / "slurmd.pid"),
    )
