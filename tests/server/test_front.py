"""The HTTP listener's own limits, in one process: the connection cap (the idle evicted
first, 503 when every connection is busy), the header deadline, a body the app never
asks for, and the ASGI bridge's JSON answer to its own failure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from llmgw.server.front import AsgiBridge, Listener, connection_cap, raise_file_limit
from tests.e2e.cluster import free_port


@contextlib.asynccontextmanager
async def listening(cap: int, header_timeout: float = 5.0) -> AsyncIterator[tuple[Listener, Any]]:
    release = asyncio.Event()

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/busy":
            await release.wait()
        return web.Response(text="ok")

    listener = Listener(
        f"127.0.0.1:{free_port()}", handler, handler, cap=cap, header_timeout=header_timeout
    )
    await listener.start()
    try:
        yield listener, release
    finally:
        release.set()
        await listener.stop()


async def open_conn(listener: Listener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = listener.address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def get(listener: Listener, path: str) -> bytes:
    reader, writer = await open_conn(listener)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_past_the_cap_the_longest_idle_connection_makes_room() -> None:
    async with listening(cap=3) as (listener, _):
        idle = [await open_conn(listener) for _ in range(3)]
        answer = await get(listener, "/")  # a fourth: the oldest idle one goes
        assert answer.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(idle[0][0].read(), 5) == b""  # closed by the listener
        assert listener.counts()["evicted"] >= 1 and listener.counts()["open"] <= 3
        for _, writer in idle:
            writer.close()


async def test_with_every_connection_busy_a_new_one_is_answered_503() -> None:
    async with listening(cap=2) as (listener, release):
        busy = [await open_conn(listener) for _ in range(2)]
        for _, writer in busy:
            writer.write(b"GET /busy HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
        for _ in range(100):  # both requests reach the handler
            if listener.server and all(h.busy for h in listener.server.open):
                break
            await asyncio.sleep(0.02)
        answer = await get(listener, "/")
        assert answer.startswith(b"HTTP/1.1 503")
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["code"] == "too_many_connections"
        assert listener.counts()["refused"] == 1
        release.set()
        for reader, writer in busy:
            assert (await asyncio.wait_for(reader.read(1024), 5)).startswith(b"HTTP/1.1 200")
            writer.close()


async def test_a_connection_without_its_headers_in_time_is_closed() -> None:
    async with listening(cap=10, header_timeout=0.3) as (listener, _):
        reader, writer = await open_conn(listener)
        writer.write(b"GET / HTTP/1.1\r\nHost")  # and nothing more
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert listener.counts()["header_timeouts"] == 1
        writer.close()


async def test_a_request_aiohttp_cannot_read_is_answered_in_json() -> None:
    async with listening(cap=10) as (listener, _):
        answer = await get(listener, "/" + "a" * 9000)  # past aiohttp's 8 KiB line
        status, body = answer.split(b"\r\n", 1)[0], answer.split(b"\r\n\r\n", 1)[1]
        assert status.endswith(b" 400 Bad Request")
        error = json.loads(body)["error"]
        assert error["type"] == "invalid_request_error" and error["message"]


async def test_the_bridge_answers_its_apps_failure_in_json() -> None:
    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    bridge = AsgiBridge(broken)
    async with listening(cap=10) as (listener, _):
        listener.other = bridge
        answer = await get(listener, "/api/v1/anything")
        assert answer.startswith(b"HTTP/1.1 500")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "internal_error"


def test_the_cap_follows_the_file_limit_unless_set() -> None:
    assert connection_cap(0, 1024) == (1024 - 256) // 2
    assert connection_cap(500, 1024) == 500
    assert connection_cap(0, 100) == 16
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert raise_file_limit() == hard or hard == resource.RLIM_INFINITY
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# Run apart: mallopt changes the whole process. A freed 1 MiB block raises glibc's
# mapping threshold; the 256 KiB blocks after it are mapped apart only when it is held
# (all but those a free stretch of the heap happens to fit).
_MAPPED = """
import ctypes, ctypes.util, sys
from llmgw.server.front import hold_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
big = bytearray(1 << 20)
del big
held = hold_mmap_threshold() if sys.argv[1] == "hold" else None
before = libc.mallinfo2().hblks
keep = [bytearray(256 * 1024) for _ in range(16)]
print(held, libc.mallinfo2().hblks - before)
"""


def _mapped(mode: str, env: dict[str, str] | None = None) -> str:
    import os
    import subprocess
    import sys

    run_env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    run_env.update(env or {})
    done = subprocess.run(
        [sys.executable, "-c", _MAPPED, mode],
        capture_output=True,
        text=True,
        check=True,
        env=run_env,
    )
    return done.stdout.strip()


def test_held_mmap_threshold_maps_the_tls_sized_blocks_apart() -> None:
    # Unheld, glibc's threshold rose with the freed 1 MiB block: 256 KiB comes from the heap.
    assert _mapped("free") == "None 0"
    held, mapped = _mapped("hold").split()
    assert held == "True" and int(mapped) >= 12


def test_an_operators_mmap_threshold_is_left_alone() -> None:
    assert _mapped("hold", {"MALLOC_MMAP_THRESHOLD_": "1048576"}) == "False 0"
