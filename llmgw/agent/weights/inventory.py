"""What the node's weights cache holds, and removing what no model wants.

The control plane decides what is unwanted; the node decides what it will delete, and
checks every path again itself, because a control plane that is wrong, newer than the
agent, or tampered with must not be able to talk a node into deleting something. A
path is removed only when it is directly inside the cache directory (no ``..``, no
parent that is a link leaving it) and carries the cache name this package gives; a
source's directory goes whole; a link with our name is removed as a link and never
followed. Anything else is kept and said so, with the reason: refusing a path the node
cannot prove it fetched is this working, not failing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from llmgw.agent.weights.cache import (
    COMPLETE_MARKER,
    PART_SUFFIX,
    SOURCE_MARKER,
    CacheLocks,
    manifest_holds,
    read_manifest,
    read_source_marker,
)
from llmgw.agent.weights.errors import SourceError
from llmgw.modelkit.sources import cache_name, is_cache_name

_OURS = (SOURCE_MARKER, COMPLETE_MARKER)


@dataclass(frozen=True)
class CachedFile:
    """A file under a source's directory; ``partial`` for a ``.part`` still being fetched."""

    path: str
    size: int
    partial: bool = False


@dataclass(frozen=True)
class CachedSource:
    """One source's directory in the cache."""

    name: str
    source: str | None  # None when its marker is missing or unreadable
    path: str
    files: list[CachedFile]
    total_bytes: int
    complete: bool


@dataclass(frozen=True)
class CollectResult:
    """What a collection removed, what it kept (path, reason), and the bytes it freed."""

    removed: list[str]
    kept: list[tuple[str, str]]
    freed_bytes: int


@dataclass(frozen=True)
class _Verdict:
    path: Path | None = None  # what to remove, when allowed
    name: str = ""
    link: bool = False
    reason: str | None = None  # why not, when refused


class Inventory:
    """Listing and collecting over one cache directory. ``locks`` is shared with the
    fetcher so a directory being fetched is never removed under it."""

    def __init__(self, cache_dir: Path, locks: CacheLocks | None = None) -> None:
        self.cache_dir = Path(os.path.abspath(cache_dir))
        self._locks = locks if locks is not None else CacheLocks()

    async def list_cache(self) -> list[CachedSource]:
        """Every source directory in the cache, complete or partial, by name.

        Entries without the cache name are the operator's and not listed; links are not
        followed, so a link with our name is not listed either.
        """
        return await asyncio.to_thread(self._list)

    def _list(self) -> list[CachedSource]:
        try:
            entries = sorted(os.scandir(self.cache_dir), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        found: list[CachedSource] = []
        for entry in entries:
            if not is_cache_name(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            directory = Path(entry.path)
            files = _files(directory)
            manifest = read_manifest(directory)
            complete = (
                manifest is not None
                and manifest.name == entry.name
                and manifest_holds(directory, manifest)
            )
            source = manifest.source if manifest else read_source_marker(directory)
            found.append(
                CachedSource(
                    name=entry.name,
                    source=source,
                    path=str(directory),
                    files=files,
                    total_bytes=sum(f.size for f in files),
                    complete=complete,
                )
            )
        return found

    async def collect(self, unwanted: list[str]) -> CollectResult:
        """Remove each asked path this node can prove is a source directory it fetched."""
        removed: list[str] = []
        kept: list[tuple[str, str]] = []
        freed = 0
        for asked in dict.fromkeys(unwanted):
            verdict = await asyncio.to_thread(self._judge, asked)
            if verdict.reason is not None or verdict.path is None:
                kept.append((asked, verdict.reason or "refused"))
                continue
            if not self._locks.try_hold(verdict.name):
                kept.append((asked, "being fetched now: a model wants it again"))
                continue
            try:
                gone, reason = await asyncio.to_thread(_remove, verdict.path, verdict.link)
            finally:
                self._locks.release(verdict.name)
            freed += gone
            if reason is None:
                removed.append(asked)
            else:
                kept.append((asked, reason))
        return CollectResult(removed=removed, kept=kept, freed_bytes=freed)

    def _judge(self, asked: str) -> _Verdict:
        if not isinstance(asked, str) or not asked or "\x00" in asked:
            return _Verdict(reason="not a path")
        pure = PurePosixPath(asked)
        if ".." in pure.parts:
            return _Verdict(reason="holds '..': a path may not climb out of the cache")
        candidate = Path(pure) if pure.is_absolute() else self.cache_dir / pure
        # Lexically directly in the cache directory, and the directory it is in really
        # is the cache (not a link inside it that leads elsewhere).
        parent = os.path.normpath(candidate.parent)
        real_cache = os.path.realpath(self.cache_dir)
        if parent not in (str(self.cache_dir), real_cache):
            return _Verdict(
                reason=f"not a source directory directly inside the cache {self.cache_dir}"
            )
        if os.path.realpath(parent) != real_cache:
            return _Verdict(reason=f"its parent is a link leaving the cache {self.cache_dir}")
        name = candidate.name
        if not is_cache_name(name):
            return _Verdict(
                reason="does not carry the cache name this node gives what it fetches: "
                "left alone as someone else's"
            )
        try:
            st = candidate.lstat()
        except FileNotFoundError:
            return _Verdict(reason="no such path")
        except OSError as exc:
            return _Verdict(reason=f"cannot be read: {exc.strerror}")
        if stat.S_ISLNK(st.st_mode):
            return _Verdict(path=candidate, name=name, link=True)
        if not stat.S_ISDIR(st.st_mode):
            return _Verdict(reason="not a directory: this node fetches sources into directories")
        marked = read_source_marker(candidate)
        if marked is not None:
            try:
                matches = cache_name(marked) == name
            except SourceError:
                matches = False
            if not matches:
                return _Verdict(reason=f"its marker names another source ({marked!r})")
        return _Verdict(path=candidate, name=name)


def _files(directory: Path) -> list[CachedFile]:
    files: list[CachedFile] = []
    for root, _dirs, names in os.walk(directory):
        for name in names:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, directory)
            if rel in _OURS or name.startswith(".tmp-"):
                continue
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files.append(CachedFile(rel, st.st_size, partial=name.endswith(PART_SUFFIX)))
    return sorted(files, key=lambda f: f.path)


def _bytes_under(directory: Path) -> int:
    total = 0
    for root, _dirs, names in os.walk(directory):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _remove(path: Path, link: bool) -> tuple[int, str | None]:
    """Remove a source directory whole (or a link as a link): (bytes freed, error)."""
    if link:
        try:
            path.unlink()
        except OSError as exc:
            return 0, f"could not remove the link: {exc.strerror}"
        return 0, None
    before = _bytes_under(path)
    try:
        # rmtree unlinks links inside rather than following them, and refuses to start
        # on a link swapped in since the path was judged.
        shutil.rmtree(path)
    except OSError as exc:
        left = _bytes_under(path) if path.is_dir() and not path.is_symlink() else 0
        return before - left, f"removal failed part way: {exc}"
    return before, None
