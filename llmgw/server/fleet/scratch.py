"""Giving back the pages of a TLS connection's read buffer between reads.

uvloop reads each TLS connection into a 256 KiB buffer of its own (``SSLProtocol``),
allocated once and kept for the connection's life. Only the pages a read writes become
memory, but they stay memory: one burst at a stream's start (a node's Register with its
cards, its first whole heartbeat, its cards' health) leaves its size resident for as
long as the agent is connected, at 5,000 agents tens of megabytes that nothing reads.
What the buffer holds is dead as soon as the read's callback returns (uvloop hands the
bytes to OpenSSL's memory BIO at once), so its whole pages can be given back to the
kernel (``madvise(MADV_DONTNEED)``) between reads: the next read faults in what it
writes, as the first did.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import mmap
from collections.abc import Callable
from typing import cast

MADV_DONTNEED = 4
PAGE = mmap.PAGESIZE


def _madvise() -> Callable[[int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return cast("Callable[[int, int, int], int]", fn)


_MADVISE = _madvise()


class ReadScratch:
    """The whole pages of one connection's TLS read buffer, where uvloop has one."""

    __slots__ = ("start", "length")

    def __init__(self, start: int, length: int) -> None:
        self.start = start
        self.length = length

    @classmethod
    def of(cls, transport: asyncio.BaseTransport) -> ReadScratch | None:
        if _MADVISE is None:
            return None
        proto = transport.get_extra_info("uvloop.sslproto")
        get_buffer = getattr(proto, "get_buffer", None)
        if get_buffer is None:
            return None
        try:
            view = get_buffer(0)
            address = ctypes.addressof(ctypes.c_char.from_buffer(view))
            size = len(view)
        except (TypeError, ValueError, BufferError):
            return None
        start = -(-address // PAGE) * PAGE
        end = (address + size) // PAGE * PAGE
        if end - start < PAGE:
            return None
        return cls(start, end - start)

    def release(self) -> None:
        """Give the buffer's pages back; call between reads only."""
        if _MADVISE is not None:
            _MADVISE(self.start, self.length, MADV_DONTNEED)
