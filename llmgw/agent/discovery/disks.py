"""The filesystems under the agent's directories: size, free space, and whether shared.

Each directory the agent uses (weights, engines, state, logs) is resolved to the mount
that holds it, and every filesystem is reported once however many directories it holds,
so two directories on one disk are one pool of space. Network and host-shared
filesystems are marked ``shared``: their space is not this node's own, and a weights
directory on one can serve several nodes.

Everything here blocks (statvfs on a hung NFS mount can block for good), so the agent
runs it through ``asyncio.to_thread`` with a timeout.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import psutil

from llmgw.wire.hardware import Disk

# Filesystems whose space is shared with other machines. 9p and virtiofs count too: they
# are the host's (or Windows') disk seen from a VM or WSL, so the space is not this
# node's own and other guests may see the same pool. Unknown fuse.* types count as
# local: most fuse filesystems (ntfs-3g, exfat, overlays) are.
SHARED_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "glusterfs",
        "ceph",
        "cephfs",
        "ocfs2",
        "gfs2",
        "afs",
        "panfs",
        "wekafs",
        "orangefs",
        "pvfs2",
        "9p",
        "virtiofs",
    }
)
SHARED_FUSE = frozenset(
    {
        "sshfs",
        "glusterfs",
        "ceph",
        "ceph-fuse",
        "cephfs",
        "s3fs",
        "rclone",
        "gcsfuse",
        "juicefs",
        "mfs",
        "lizardfs",
        "beegfs",
        "goofys",
        "blobfuse",
        "blobfuse2",
        "davfs",
        "weka",
    }
)


@dataclass(frozen=True)
class Mount:
    """One mount table row: where it is mounted and what filesystem it is."""

    mountpoint: str
    fstype: str


@dataclass(frozen=True)
class DiskTotals:
    """Bytes summed apart: the node's own disks, and shared filesystems it can reach."""

    local_total: int
    local_free: int
    shared_total: int
    shared_free: int


def is_shared(fstype: str) -> bool:
    fs = fstype.lower()
    if fs in SHARED_FSTYPES:
        return True
    prefix, _, sub = fs.partition(".")
    return prefix == "fuse" and sub in SHARED_FUSE


def mounts() -> list[Mount]:
    """The mount table. ``all=True`` because psutil otherwise drops nfs, fuse and 9p."""
    try:
        parts = psutil.disk_partitions(all=True)
    except OSError:
        return []
    return [Mount(p.mountpoint, p.fstype) for p in parts]


def mount_of(path: str, table: Sequence[Mount]) -> Mount | None:
    """The mount holding ``path`` (already resolved): the longest mount point prefix.

    A later row of the same mount point wins, as the kernel's last mount hides earlier
    ones there.
    """
    best: Mount | None = None
    for m in table:
        mp = m.mountpoint.rstrip("/") or "/"
        inside = mp == "/" or path == mp or path.startswith(mp + "/")
        if inside and (best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/")):
            best = m
    return best


def _statvfs(path: str) -> tuple[int, int]:
    st = os.statvfs(path)
    # f_bavail, not f_bfree: the space an unprivileged writer can use, leaving the
    # root reserve aside, which is what a download can count on.
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def _device(path: str) -> int:
    return os.stat(path).st_dev


def scan_disks(
    directories: Iterable[str | os.PathLike[str]],
    table: Sequence[Mount] | None = None,
    statvfs: Callable[[str], tuple[int, int]] = _statvfs,
    device: Callable[[str], int] = _device,
) -> list[Disk]:
    """One Disk per filesystem holding any of ``directories``, in the order first met.

    A directory that does not exist (or cannot be read) is skipped: reporting it as
    zero bytes would read as a full disk. Filesystems are told apart by st_dev, which
    also folds two mount points of one filesystem (bind mounts) into one.
    """
    if table is None:
        table = mounts()
    seen: set[int] = set()
    found: list[Disk] = []
    for directory in directories:
        path = os.path.realpath(os.fspath(directory))
        try:
            if not os.path.isdir(path):
                continue
            dev = device(path)
            if dev in seen:
                continue
            total, free = statvfs(path)
        except OSError:
            continue
        seen.add(dev)
        mount = mount_of(path, table)
        if mount is None:
            found.append(Disk(path=path, fstype="unknown", total=total, free=free))
            continue
        found.append(
            Disk(
                path=mount.mountpoint,
                fstype=mount.fstype,
                total=total,
                free=free,
                shared=is_shared(mount.fstype),
            )
        )
    return found


def disk_totals(disks: Iterable[Disk]) -> DiskTotals:
    """Sum the node's own disks apart from shared ones.

    The node's own capacity excludes shared filesystems: counting an NFS export once per
    node that mounts it would multiply the cluster's storage by its node count.
    """
    lt = lf = st = sf = 0
    for d in disks:
        if d.shared:
            st += d.total
            sf += d.free
        else:
            lt += d.total
            lf += d.free
    return DiskTotals(local_total=lt, local_free=lf, shared_total=st, shared_free=sf)
