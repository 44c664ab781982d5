"""Unpacking a release archive (zip or tar, any compression tarfile reads) so that
nothing lands outside the install directory.

Three layers, because each catches what the one before cannot:

1. Before a byte is written, every member is read: an absolute path, a ``..``
   component, a link whose target leaves the directory (read from where the link
   sits), a device or FIFO, a duplicate name in a zip, or a total size past the limit
   refuses the whole archive, with the member named.
2. While writing, each path is resolved through the links already written (tarfile's
   ``data`` filter; our own check for zip), since links that each stay inside can
   still chain outside (``x -> .`` then ``y -> x/..``).
3. After writing, every link in the tree is resolved once more.

Blocking; the installer calls ``unpack`` through ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path

# A llama.cpp CPU archive unpacks to ~50 MB, a CUDA one to ~1 GB; far past either is a
# bomb, not a release.
MAX_UNPACKED = 8 << 30


class ArchiveError(ValueError):
    """An archive refused; the message names the member and why."""


def _check_name(name: str) -> str:
    """The member's path, normalised, or ArchiveError when it would leave the directory."""
    path = name.replace("\\", "/")
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        raise ArchiveError(f"member {name!r} has an absolute path")
    if ".." in path.split("/"):
        raise ArchiveError(f"member {name!r} has a '..' component")
    return posixpath.normpath(path) if path else "."


def _is_top(name: str) -> bool:
    """``./``, which ``tar -C dir .`` puts first: the install directory itself."""
    return _check_name(name) == "."


def _check_link(name: str, target: str, *, hard: bool = False) -> None:
    """A link must point inside: a symlink from the directory it sits in, a hard link
    (tar names its target from the archive's root) from the root."""
    kind = "hard link" if hard else "symlink"
    if not target or target.startswith("/"):
        raise ArchiveError(f"{kind} {name!r} points to the absolute path {target!r}")
    base = "" if hard else posixpath.dirname(name)
    resolved = posixpath.normpath(posixpath.join(base, target))
    if resolved == ".." or resolved.startswith("../"):
        raise ArchiveError(f"{kind} {name!r} -> {target!r} leaves the install directory")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _untar(archive: Path, dest: Path, max_bytes: int) -> None:
    with tarfile.open(archive) as tf:
        members = tf.getmembers()
        total = 0
        members = [m for m in members if not (m.isdir() and _is_top(m.name))]
        for m in members:
            name = _check_name(m.name)
            if name == ".":
                raise ArchiveError(f"member {m.name!r} names the install directory itself")
            if m.issym():
                _check_link(name, m.linkname)
            elif m.islnk():
                _check_link(name, m.linkname, hard=True)
            elif not (m.isreg() or m.isdir()):
                raise ArchiveError(f"member {m.name!r} is a device, FIFO or other special file")
            total += m.size
        if total > max_bytes:
            raise ArchiveError(f"the archive unpacks to {total} bytes, past {max_bytes}")
        root = os.path.realpath(dest)
        for m in members:
            _check_written_path(m.name, root)
            try:
                if hasattr(tarfile, "data_filter"):
                    tf.extract(m, dest, set_attrs=not m.isdir(), filter="data")
                else:  # Python before 3.11.4: our own checks stand alone
                    tf.extract(m, dest, set_attrs=not m.isdir())
            except tarfile.TarError as exc:  # the data filter's refusals derive from it
                raise ArchiveError(f"unpacking refused: {exc}") from exc
            if m.issym():
                _check_link_written(m.name, root)


def _check_written_path(name: str, root: str) -> None:
    """The member's directory, resolved through the links written so far, is inside."""
    parent = os.path.dirname(os.path.join(root, _check_name(name)))
    if not _inside(os.path.realpath(parent), root):
        raise ArchiveError(f"member {name!r} would be written through a link")


def _check_link_written(name: str, root: str) -> None:
    path = os.path.join(root, _check_name(name))
    if not _inside(os.path.realpath(path), root):
        os.unlink(path)
        raise ArchiveError(f"symlink {name!r} resolves outside the install directory")


def _unzip(archive: Path, dest: Path, max_bytes: int) -> None:
    root = os.path.realpath(dest)
    with zipfile.ZipFile(archive) as zf:
        infos = [i for i in zf.infolist() if not (i.is_dir() and _is_top(i.filename))]
        seen: set[str] = set()
        links: dict[str, str] = {}
        for info in infos:
            name = _check_name(info.filename)
            if name == ".":
                raise ArchiveError(f"member {info.filename!r} names the install directory itself")
            if name in seen:
                raise ArchiveError(f"member {info.filename!r} appears twice")
            seen.add(name)
            if stat.S_ISLNK(info.external_attr >> 16):
                links[info.filename] = zf.read(info).decode("utf-8", "replace")
                _check_link(name, links[info.filename])
        if sum(i.file_size for i in infos) > max_bytes:
            raise ArchiveError(f"the archive unpacks to more than {max_bytes} bytes")
        for info in infos:
            name = _check_name(info.filename)
            target = os.path.join(root, name)
            parent = os.path.dirname(target)
            _check_written_path(info.filename, root)
            mode = info.external_attr >> 16
            if info.is_dir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(parent, exist_ok=True)
            if info.filename in links:
                os.symlink(links[info.filename], target)
                _check_link_written(info.filename, root)
                continue
            # Zip keeps the Unix mode in the high bits when made on Unix; keep the execute
            # bits (llama-server needs them) and drop set-id bits and others' write.
            perms = (mode & 0o755) if mode & 0o777 else 0o644
            # O_NOFOLLOW: never write through a link planted at this name.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, perms)
            with os.fdopen(fd, "wb") as out, zf.open(info) as src:
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(target, perms)


def _check_tree(dest: Path) -> None:
    root = os.path.realpath(dest)
    for dirpath, dirnames, filenames in os.walk(dest):
        for entry in (*dirnames, *filenames):
            path = os.path.join(dirpath, entry)
            if os.path.islink(path) and not _inside(os.path.realpath(path), root):
                rel = os.path.relpath(path, dest)
                raise ArchiveError(f"link {rel!r} resolves outside the install directory")


def unpack(archive: Path, dest: Path, max_bytes: int = MAX_UNPACKED) -> None:
    """Unpack ``archive`` into ``dest`` (created), refusing anything that would leave it.
    On refusal ``dest`` may hold part of the archive; the caller removes it."""
    dest.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        _unzip(archive, dest, max_bytes)
    elif tarfile.is_tarfile(archive):
        _untar(archive, dest, max_bytes)
    else:
        raise ArchiveError(f"{archive.name} is neither a zip nor a tar archive")
    _check_tree(dest)
