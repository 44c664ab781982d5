"""A model's files read for its shape: a GGUF header from its first bytes, a GGUF file
or set of split files on disk, a safetensors directory's config.json and sizes.

Shared by both roles: the agent answers ``weights.inspect`` for what it holds, the
control plane's planner reads local paths and the first bytes of remote files. The
figures themselves come from :mod:`llmgw.modelkit.sizing`, so a header read over HTTP and the
same file read on disk give the same shape.
"""

from __future__ import annotations

import json
import struct
import tempfile
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from llmgw.modelkit.hub import split_key
from llmgw.modelkit.sizing import ModelShape, read_gguf_header, shape_from_config
from llmgw.modelkit.sources import PICKLE_SUFFIXES

GGUF_MAGIC = b"GGUF"

# GGUF metadata value types (gguf.GGUFValueType) and the bytes of the fixed-size ones.
_STRING = 8
_ARRAY = 9
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
# A header is a few MiB (the vocabulary dominates); past this it is not a header.
MAX_HEADER_BYTES = 512 * 1024 * 1024


class ShapeError(ValueError):
    """A model's files do not say its shape; the message names the file and why."""


class NeedMore(Exception):  # noqa: N818 - a signal to read on, not a failure
    """The buffer ends inside the header; at least ``needed`` bytes are wanted."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"the GGUF header needs at least {needed} bytes")
        self.needed = needed


class _Cursor:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise NeedMore(end)
        if end > MAX_HEADER_BYTES:
            raise ShapeError(f"the GGUF header runs past {MAX_HEADER_BYTES} bytes")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def skip_string(self) -> None:
        self.take(self.u64())

    def skip_value(self, kind: int) -> None:
        if kind in _FIXED:
            self.take(_FIXED[kind])
        elif kind == _STRING:
            self.skip_string()
        elif kind == _ARRAY:
            item, count = self.u32(), self.u64()
            if item in _FIXED:
                self.take(_FIXED[item] * count)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ShapeError(f"unknown GGUF value type {kind} at byte {self.pos}")


def gguf_header_length(buf: bytes) -> int:
    """Bytes from the file's start to the end of its tensor infos: what a reader of the
    shape needs. Raises :class:`NeedMore` when ``buf`` ends first."""
    cur = _Cursor(buf)
    if cur.take(4) != GGUF_MAGIC:
        raise ShapeError("not a GGUF file (its first bytes are not 'GGUF')")
    version = cur.u32()
    if version & 0xFFFF == 0:
        raise ShapeError("a big-endian GGUF file; llmgw reads little-endian ones")
    if version not in (2, 3):
        raise ShapeError(f"GGUF version {version} is not one llmgw reads (2 or 3)")
    tensors, kvs = cur.u64(), cur.u64()
    for _ in range(kvs):
        cur.skip_string()
        cur.skip_value(cur.u32())
    for _ in range(tensors):
        cur.skip_string()
        dims = cur.u32()
        cur.take(8 * dims + 4 + 8)
    return cur.pos


def shape_from_gguf_prefix(prefix: bytes, file_size: int) -> ModelShape:
    """The shape of a GGUF file of ``file_size`` bytes from its first bytes (at least
    the whole header). Blocking: call it through ``asyncio.to_thread``.

    The gguf package reads a file, not a buffer; so the header goes into a sparse
    file of the real size (no disk spent past the header) and is read there by the same
    code that reads whole files.
    """
    length = gguf_header_length(prefix)
    if file_size < length:
        raise ShapeError(f"the file is {file_size} bytes, shorter than its own header")
    with tempfile.TemporaryDirectory(prefix="llmgw-gguf-") as tmp:
        path = Path(tmp) / "header.gguf"
        with path.open("wb") as fh:
            fh.write(prefix[:length])
            fh.truncate(file_size)
        try:
            return read_gguf_header(path)
        except (ValueError, IndexError, KeyError) as exc:
            raise ShapeError(f"the GGUF header does not read: {exc}") from None


def combine_parts(parts: list[ModelShape], sizes: list[int]) -> ModelShape:
    """One shape for a split GGUF: the first part's metadata, every part's tensors."""
    first = parts[0]
    parameters = sum(p.parameters or 0 for p in parts)
    experts = sum(p.expert_bytes or 0 for p in parts)
    return replace(
        first,
        file_bytes=sum(sizes),
        parameters=parameters or None,
        expert_bytes=experts or None,
    )


def shape_to_json(shape: ModelShape) -> dict[str, object]:
    return asdict(shape)


def shape_from_json(data: dict[str, Any]) -> ModelShape:
    """A shape from its JSON form; unknown keys are ignored, missing ones refused."""
    known = {f.name for f in fields(ModelShape)}
    try:
        return ModelShape(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise ShapeError(f"not a model shape: {exc}") from None


# --------------------------------------------------------------------------- on disk


def _split_siblings(path: Path) -> list[Path]:
    """Every part of a split GGUF (``-00001-of-00003.gguf``), first first; else [path]."""
    key = split_key(path.name)
    if key is None:
        return [path]
    stem, _, count = key
    parts = [path.with_name(f"{stem}-{n:05d}-of-{count:05d}.gguf") for n in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ShapeError(f"{path}: split GGUF lacks part(s) {', '.join(missing)}")
    return parts


def inspect_gguf_file(path: Path) -> tuple[ModelShape, list[Path]]:
    parts = _split_siblings(path)
    try:
        shapes = [read_gguf_header(p) for p in parts]
    except (ValueError, IndexError, KeyError, OSError) as exc:
        raise ShapeError(f"{path}: the GGUF header does not read: {exc}") from None
    return combine_parts(shapes, [p.stat().st_size for p in parts]), parts


def inspect_local(path: Path, *, allow_pickle: bool = False) -> dict[str, object]:
    """The shape of a model file or directory on this machine, as plain fields:
    ModelShape's, ``weight_bytes``, ``format`` (gguf, safetensors, pickle) and ``files``.

    Blocking; call it through ``asyncio.to_thread``.
    """
    if not path.exists():
        raise ShapeError(f"{path}: no such file or directory")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ShapeError(
                f"{path}: only a .gguf file is read alone; give a safetensors model as "
                "its directory (with config.json)"
            )
        shape, parts = inspect_gguf_file(path)
        return _answer(shape, "gguf", [str(p) for p in parts])
    files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
    weights = [p for p in files if p.suffix == ".safetensors"]
    fmt = "safetensors"
    if not weights:
        ggufs = [p for p in files if p.suffix.lower() == ".gguf" and "mmproj" not in p.name]
        firsts = sorted({_split_siblings(p)[0] for p in ggufs})
        if len(firsts) == 1:
            shape, parts = inspect_gguf_file(firsts[0])
            return _answer(shape, "gguf", [str(p) for p in parts])
        if len(firsts) > 1:
            names = ", ".join(p.name for p in firsts[:6])
            raise ShapeError(f"{path} holds several GGUF models ({names}); name one file")
        weights = [p for p in files if p.suffix.lower() in PICKLE_SUFFIXES]
        fmt = "pickle"
        if not weights:
            raise ShapeError(f"{path}: no .safetensors or .gguf files in the directory")
        if not allow_pickle:
            raise ShapeError(
                f"{path} holds only pickled weights ({weights[0].name}, ...): a pickle runs "
                "what it holds when loaded; use safetensors or GGUF, or allow pickles"
            )
    config = path / "config.json"
    try:
        data = json.loads(config.read_text())
    except FileNotFoundError:
        raise ShapeError(f"{path}: no config.json beside the weights") from None
    except (OSError, ValueError) as exc:
        raise ShapeError(f"{config}: not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ShapeError(f"{config}: not a JSON object")
    size = sum(p.stat().st_size for p in weights)
    return _answer(shape_from_config(data, size), fmt, [str(p) for p in weights])


def _hidden(p: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in p.relative_to(root).parts)


def _answer(shape: ModelShape, fmt: str, files: list[str]) -> dict[str, object]:
    return {
        **shape_to_json(shape),
        "weight_bytes": shape.file_bytes,
        "format": fmt,
        "files": files,
    }
