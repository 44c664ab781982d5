"""Disk discovery: directory to mount, one entry per filesystem, shared apart."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TypeVar

import psutil
import pytest

from llmgw.agent.discovery import Mount, disk_totals, is_shared, mount_of, scan_disks
from llmgw.wire.hardware import Disk

GiB = 1 << 30
T = TypeVar("T")


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """Directories standing for a local disk (two dirs on it) and an NFS export."""
    root = Path(os.path.realpath(tmp_path))
    dirs = {
        "weights": root / "local" / "weights",
        "engines": root / "local" / "engines",
        "nfs": root / "nfs",
        "shared_weights": root / "nfs" / "weights",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def fake_fs(root: Path) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    local, nfs = str(root / "local"), str(root / "nfs")
    devices = {local: 1, nfs: 2}
    sizes = {local: (100 * GiB, 40 * GiB), nfs: (1000 * GiB, 700 * GiB)}
    return devices, sizes


def lookup(table: dict[str, T]) -> Callable[[str], T]:
    """A stand-in for statvfs or st_dev: the entry of the deepest directory above path."""

    def find(path: str) -> T:
        best = max((p for p in table if path == p or path.startswith(p + "/")), key=len)
        return table[best]

    return find


def test_two_dirs_on_one_disk_are_one_pool_and_nfs_is_shared(
    layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = layout["nfs"].parent
    devices, sizes = fake_fs(root)
    parts = [
        SimpleNamespace(device="/dev/vda1", mountpoint="/", fstype="ext4", opts="rw"),
        SimpleNamespace(
            device="/dev/nvme0n1", mountpoint=str(root / "local"), fstype="xfs", opts="rw"
        ),
        SimpleNamespace(
            device="srv:/export", mountpoint=str(root / "nfs"), fstype="nfs4", opts="rw"
        ),
    ]
    monkeypatch.setattr(psutil, "disk_partitions", lambda all=False: parts)

    found = scan_disks(
        [layout["weights"], layout["engines"], layout["shared_weights"], root / "missing"],
        statvfs=lookup(sizes),
        device=lookup(devices),
    )

    assert found == [
        Disk(path=str(root / "local"), fstype="xfs", total=100 * GiB, free=40 * GiB),
        Disk(path=str(root / "nfs"), fstype="nfs4", total=1000 * GiB, free=700 * GiB, shared=True),
    ]
    totals = disk_totals(found)
    assert (totals.local_total, totals.local_free) == (100 * GiB, 40 * GiB)
    assert (totals.shared_total, totals.shared_free) == (1000 * GiB, 700 * GiB)


def test_missing_directory_is_skipped_not_zero(tmp_path: Path) -> None:
    calls: list[str] = []

    def statvfs(path: str) -> tuple[int, int]:
        calls.append(path)
        return 10 * GiB, 5 * GiB

    found = scan_disks([tmp_path / "not-yet"], table=[Mount("/", "ext4")], statvfs=statvfs)
    assert found == []
    assert calls == []


def test_real_filesystem_of_a_real_directory(tmp_path: Path) -> None:
    (disk,) = scan_disks([tmp_path, tmp_path])
    real = os.path.realpath(tmp_path)
    assert real == disk.path or real.startswith(disk.path.rstrip("/") + "/")
    assert disk.total > 0 and 0 <= disk.free <= disk.total


def test_mount_of_takes_the_longest_whole_component_prefix() -> None:
    table = [Mount("/", "ext4"), Mount("/data", "xfs"), Mount("/data/models", "nfs")]
    assert mount_of("/data2/x", table) == Mount("/", "ext4")
    assert mount_of("/data", table) == Mount("/data", "xfs")
    assert mount_of("/data/models/llama", table) == Mount("/data/models", "nfs")
    # A later mount on the same point hides the earlier one.
    assert mount_of("/data/x", [*table, Mount("/data", "tmpfs")]) == Mount("/data", "tmpfs")
    assert mount_of("/x", []) is None


def test_directory_outside_any_known_mount_keeps_its_own_path(tmp_path: Path) -> None:
    (disk,) = scan_disks([tmp_path], table=[], statvfs=lambda p: (8 * GiB, 2 * GiB))
    assert disk == Disk(
        path=os.path.realpath(tmp_path), fstype="unknown", total=8 * GiB, free=2 * GiB
    )


@pytest.mark.parametrize(
    ("fstype", "shared"),
    [
        ("nfs", True),
        ("nfs4", True),
        ("cifs", True),
        ("lustre", True),
        ("gpfs", True),
        ("beegfs", True),
        ("ceph", True),
        ("fuse.sshfs", True),
        ("fuse.glusterfs", True),
        ("fuse.juicefs", True),
        ("9p", True),
        ("virtiofs", True),
        ("ext4", False),
        ("xfs", False),
        ("overlay", False),
        ("tmpfs", False),
        ("fuseblk", False),
        ("fuse.ntfs-3g", False),
    ],
)
def test_shared_filesystem_types(fstype: str, shared: bool) -> None:
    assert is_shared(fstype) is shared
