"""A TLS connection's read buffer gives its pages back between reads: a burst (a node's
Register with its cards) no longer stays resident for as long as the agent is connected.
Measured with ``mincore``: which of the buffer's pages are in memory."""

from __future__ import annotations

import asyncio
import ctypes
import ssl
from pathlib import Path

import pytest

from llmgw import pki
from llmgw.server.fleet.scratch import PAGE, ReadScratch

uvloop = pytest.importorskip("uvloop")

BURST = 200 * 1024
NEXT = b"n" * 12_000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)


def resident_pages(scratch: ReadScratch) -> int:
    pages = scratch.length // PAGE
    vec = ctypes.create_string_buffer(pages)
    assert _libc.mincore(scratch.start, scratch.length, vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec.raw)


def _contexts(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = pki.make_ca("t")
    server = pki.make_server_cert(ca, ["localhost", "127.0.0.1"])
    for name, data in (("ca", ca.cert_pem), ("cert", server.cert_pem), ("key", server.key_pem)):
        (tmp / name).write_bytes(data)
    serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving.load_cert_chain(tmp / "cert", tmp / "key")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(tmp / "ca")
    return serving, client


async def _burst_then_release(tmp: Path) -> tuple[int, int, int, bytes]:
    serving, client = _contexts(tmp)
    seen: dict[str, object] = {}
    done = asyncio.Event()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        scratch = ReadScratch.of(writer.transport)
        assert scratch is not None
        got = b""
        while len(got) < BURST:
            got += await reader.read(1 << 20)
        seen["after_burst"] = resident_pages(scratch)
        scratch.release()
        seen["released"] = resident_pages(scratch)
        # The buffer still works: the next read lands in it as the first did.
        seen["next"] = await reader.readexactly(len(NEXT))
        seen["after_next"] = resident_pages(scratch)
        writer.close()
        done.set()

    server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=serving)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client, server_hostname="localhost"
    )
    writer.write(b"x" * BURST)
    await writer.drain()
    while "released" not in seen:
        await asyncio.sleep(0.01)
    writer.write(NEXT)
    await writer.drain()
    await asyncio.wait_for(done.wait(), 10)
    writer.close()
    server.close()
    await server.wait_closed()
    return (
        int(seen["after_burst"]),  # type: ignore[call-overload]
        int(seen["released"]),  # type: ignore[call-overload]
        int(seen["after_next"]),  # type: ignore[call-overload]
        seen["next"],  # type: ignore[return-value]
    )


def test_a_burst_leaves_no_pages_resident_once_released(tmp_path: Path) -> None:
    loop = uvloop.new_event_loop()
    try:
        burst, released, after_next, data = loop.run_until_complete(_burst_then_release(tmp_path))
    finally:
        loop.close()
    # TLS records carry at most 16 KiB: the burst's reads wrote at least that much.
    assert burst >= 16 * 1024 // PAGE
    assert released == 0
    assert data == NEXT
    # The next read faults in only what it writes (the buffer's first page, before the
    # released range, takes its first bytes).
    assert 1 <= after_next <= len(NEXT) // PAGE + 1 < burst


def test_nothing_to_release_where_the_loop_is_not_uvloop() -> None:
    # asyncio's own TLS transport names no uvloop.sslproto: the scratch is None and the
    # connection reads as it always did.
    assert ReadScratch.of(asyncio.BaseTransport()) is None
