"""Length-prefixed msgpack frames: 4-byte big-endian length, then one msgpack map.

Pure functions and a push decoder, so both ends (and the tests) use it without sockets.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

# A Register from a large node with its file inventory is well under a megabyte; a frame
# past this is a broken or hostile peer, not a big message.
MAX_FRAME = 4 * 1024 * 1024

_HEADER = struct.Struct(">I")


class FrameError(ValueError):
    """The byte stream is not a sequence of valid frames; the stream must end."""


def encode_frame(payload: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(payload, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Feed bytes as they arrive; get back every complete frame as a dict."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out: list[dict[str, Any]] = []
        while len(self._buf) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buf)
            if length > self._max:
                raise FrameError(f"frame of {length} bytes exceeds the {self._max}-byte limit")
            end = _HEADER.size + length
            if len(self._buf) < end:
                break
            body = bytes(self._buf[_HEADER.size : end])
            del self._buf[:end]
            try:
                obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
            except Exception as exc:  # msgpack raises several unrelated types
                raise FrameError(f"frame is not valid msgpack: {exc}") from exc
            if not isinstance(obj, dict):
                raise FrameError(f"frame holds a {type(obj).__name__}, not a map")
            out.append(obj)
        return out

    @property
    def pending(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buf)
