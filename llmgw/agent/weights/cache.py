"""The cache's layout on disk, its markers, and who holds a cache directory right now.

::

    CACHE_DIR/
      hf--org--repo--q4_k_m--0123456789abcdef/   one directory a source (its cache name)
        .llmgw-source.json      the source, written before the first byte is fetched
        model-Q4_K_M.gguf.part  a file still being fetched (resumed from its size)
        model-Q4_K_M.gguf       a file, under its final name only once verified
        .llmgw-complete.json    the source is whole: files, sizes, sha256

The directory's name is a hash of the source, so the control plane can compute the
wanted set from the catalog; the source marker lets the node prove a directory it is
asked to delete is one it fetched. Functions here are blocking; callers run them
through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from llmgw.jsonvalue import JSON, JSONObject, as_list, as_object

SOURCE_MARKER = ".llmgw-source.json"
COMPLETE_MARKER = ".llmgw-complete.json"
PART_SUFFIX = ".part"


@dataclass(frozen=True)
class FileRecord:
    """One file of a complete source. ``verified``: its sha256 matched the hub's."""

    path: str
    size: int
    sha256: str | None = None
    verified: bool = False


@dataclass(frozen=True)
class Manifest:
    """What ``.llmgw-complete.json`` holds; ``entry`` is the file given to the engine
    (``""`` for the directory)."""

    source: str
    name: str
    entry: str
    files: list[FileRecord]


def write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    """Write a file that is either absent or whole, even across a crash."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_json(path: Path) -> JSONObject | None:
    try:
        with path.open() as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _number(value: JSON) -> int | float | str:
    """What ``int()`` takes; TypeError, as ``int()`` raises, for the rest."""
    if not isinstance(value, int | float | str):
        raise TypeError(f"expected a size, got {type(value).__name__}")
    return value


def _text(value: JSON) -> str | None:
    return value if isinstance(value, str) else None


def read_source_marker(directory: Path) -> str | None:
    data = _read_json(directory / SOURCE_MARKER)
    source = data.get("source") if data else None
    return source if isinstance(source, str) else None


def write_source_marker(directory: Path, source: str) -> None:
    write_json_atomic(directory / SOURCE_MARKER, {"source": source})


def read_manifest(directory: Path) -> Manifest | None:
    """The complete marker, or None when absent or not one we could have written."""
    data = _read_json(directory / COMPLETE_MARKER)
    if data is None:
        return None
    try:
        files = [
            FileRecord(
                path=str(f["path"]),
                size=int(_number(f["size"])),
                sha256=_text(f.get("sha256")),
                verified=bool(f.get("verified", False)),
            )
            for f in map(as_object, as_list(data["files"]))
        ]
        return Manifest(
            source=str(data["source"]),
            name=str(data["name"]),
            entry=str(data["entry"]),
            files=files,
        )
    except (KeyError, TypeError, ValueError):
        return None


def write_manifest(directory: Path, manifest: Manifest) -> None:
    write_json_atomic(directory / COMPLETE_MARKER, asdict(manifest))


def manifest_holds(directory: Path, manifest: Manifest) -> bool:
    """Whether every file the marker names is still there, with its size.

    Cheap on purpose (a stat a file): a second fetch after a restart costs nothing. A
    file removed or truncated by hand makes the source incomplete again.
    """
    for record in manifest.files:
        try:
            st = (directory / record.path).lstat()
        except OSError:
            return False
        # lstat: a link put in a file's place is not the file we verified.
        if not stat.S_ISREG(st.st_mode) or st.st_size != record.size:
            return False
    return True


def load_complete(directory: Path, name: str) -> Manifest | None:
    """The manifest of a source still whole in the cache, else None."""
    manifest = read_manifest(directory)
    if manifest is None:
        return None
    if manifest.name == name and manifest_holds(directory, manifest):
        return manifest
    # Something was removed or changed by hand: fetch again what is missing.
    (directory / COMPLETE_MARKER).unlink(missing_ok=True)
    return None


def prepare_directory(directory: Path, source: str) -> None:
    """Make a source's directory, marked with its source before any byte is fetched."""
    directory.mkdir(parents=True, exist_ok=True)
    write_source_marker(directory, source)


def is_whole(final: Path, size: int) -> bool:
    """Whether a file under its final name is there with its size (a link is not)."""
    try:
        st = final.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


def resume_point(part: Path, size: int | None, hasher: hashlib._Hash) -> int:
    """Bytes of ``part`` to keep (hashed into ``hasher``); a part longer than the file
    is not a prefix of it and is dropped. A file at its final name whose size is not
    known is moved back to a part, to be checked against the server."""
    final = part.with_name(part.name[: -len(PART_SUFFIX)])
    if size is None and final.is_file() and not part.exists():
        os.replace(final, part)
    elif final.is_file() or final.is_symlink():
        final.unlink()  # the wrong size, or a link: not ours to trust
    try:
        have = part.stat().st_size
    except OSError:
        return 0
    if size is not None and have > size:
        part.unlink()
        return 0
    with part.open("rb") as fh:
        while block := fh.read(1 << 20):
            hasher.update(block)
    return have


def open_part(part: Path, offset: int) -> IO[bytes]:
    """A part file open for writing at ``offset`` (truncated there; emptied at 0)."""
    part.parent.mkdir(parents=True, exist_ok=True)
    if offset:
        fh = part.open("r+b")
        fh.truncate(offset)
        fh.seek(offset)
        return fh
    return part.open("wb")


def append_block(fh: IO[bytes], hasher: hashlib._Hash, data: bytes) -> None:
    fh.write(data)
    hasher.update(data)


def drop_part(fh: IO[bytes], part: Path) -> None:
    """Close and delete a part that is not a prefix of the file (bad sum, too long)."""
    fh.close()
    part.unlink(missing_ok=True)


def publish(part: Path, final: Path) -> None:
    """Give a verified part its final name."""
    # Flushed before the rename, so a file under its final name is never a torn one.
    with part.open("rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(part, final)


class CacheLocks:
    """Which cache directories a fetch or a collection holds: never both at once.

    A fetch waits for a collection of its directory to end (then fetches anew); a
    collection refuses a directory a fetch holds rather than waiting, since the fetch
    means the source is wanted again.
    """

    def __init__(self) -> None:
        self._held: dict[str, asyncio.Event] = {}

    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def try_hold(self, name: str) -> bool:
        if name in self._held:
            return False
        self._held[name] = asyncio.Event()
        return True

    async def hold(self, name: str) -> None:
        while name in self._held:
            await self._held[name].wait()
        self._held[name] = asyncio.Event()

    def release(self, name: str) -> None:
        event = self._held.pop(name, None)
        if event is not None:
            event.set()
