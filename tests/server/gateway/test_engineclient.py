"""The gateway's own HTTP/1.1 client: answers parsed however they are cut, pooled only
when whole and kept alive, and what is not HTTP refused (``engineclient.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.server.gateway.engineclient import BadAnswer, EngineConnection, Lost, Origin


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def chunked(*parts: bytes, extension: bytes = b"", trailer: bytes = b"") -> bytes:
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in parts)
    return body + b"0\r\n" + trailer + b"\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
ANSWERS: list[tuple[bytes, bytes, bool]] = [
    # (the answer, its body, kept alive)
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello", True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"", True),
    (
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b"data: a\n\n", b"data: [DONE]\n\n"),
        b"data: a\n\ndata: [DONE]\n\n",
        True,
    ),
    (
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b"x" * 300, extension=b";ext=1"),
        b"x" * 300,
        True,
    ),
    (
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b"ab", trailer=b"X-T: 1\r\n"),
        b"ab",
        True,
    ),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", b"ok", False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok", False),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", b"ok", True),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", b"", True),
    (b"HTTP/1.1 500 Internal\r\ncontent-length: 3\r\n\r\nbad", b"bad", True),
]


async def answer(data: bytes, cuts: list[int], close: bool = False) -> EngineConnection:
    conn = EngineConnection(asyncio.get_running_loop())
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.send(b"POST / HTTP/1.1\r\n\r\n", close)
    at = 0
    for cut in sorted({min(c, len(data)) for c in cuts}) + [len(data)]:
        if cut > at:
            conn.data_received(data[at:cut])
            at = cut
    return conn


@settings(max_examples=200, deadline=None)
@given(
    which=st.integers(0, len(ANSWERS) - 1),
    cuts=st.lists(st.integers(0, 400), max_size=12),
)
def test_an_answer_is_read_however_it_arrives(which: int, cuts: list[int]) -> None:
    data, body, alive = ANSWERS[which]

    async def run() -> None:
        conn = await answer(data, cuts)
        await conn.head()
        assert await conn.read() == body
        assert conn.complete and conn.keep_alive is alive
        assert conn.reusable(conn.idle_since) is alive

    asyncio.run(run())


async def test_headers_are_kept_in_order_and_found_by_name() -> None:
    conn = await answer(
        b"HTTP/1.1 429 Too Many\r\nRetry-After: 30\r\nContent-Type: application/json; "
        b"charset=utf-8\r\nContent-Length: 2\r\n\r\n{}",
        [],
    )
    await conn.head()
    assert conn.status == 429 and conn.header("retry-after") == "30"
    assert conn.content_type == "application/json"
    assert conn.headers[0] == ("Retry-After", "30")


async def test_a_connection_asked_to_close_is_never_reused() -> None:
    conn = await answer(ANSWERS[0][0], [], close=True)
    await conn.head()
    await conn.read()
    assert conn.complete and not conn.keep_alive


async def test_an_answer_without_a_length_ends_with_the_connection() -> None:
    conn = await answer(b"HTTP/1.1 200 OK\r\n\r\npart one ", [])
    await conn.head()
    assert await conn.chunk() == b"part one "
    conn.data_received(b"and two")
    conn.connection_lost(None)
    assert await conn.read() == b"and two" and conn.complete and not conn.keep_alive


async def test_a_connection_lost_before_any_byte_is_early_after_one_is_not() -> None:
    conn = await answer(b"", [])
    conn.connection_lost(ConnectionResetError("reset"))
    with pytest.raises(Lost) as early:
        await conn.head()
    assert early.value.early
    conn = await answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", [])
    await conn.head()
    assert await conn.chunk() == b"abc"
    conn.connection_lost(None)
    with pytest.raises(Lost) as late:
        await conn.chunk()
    assert not late.value.early and not conn.complete


@pytest.mark.parametrize(
    "data",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"HTTP/1.1 101 Switching\r\n\r\n",
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 70000,
    ],
    ids=range(10),
)
async def test_what_is_not_http_is_a_bad_answer(data: bytes) -> None:
    conn = await answer(data, [])
    with pytest.raises(BadAnswer):
        await conn.head()
        await conn.read()
    assert not conn.reusable(conn.idle_since)


async def test_more_than_the_answer_spoils_the_connection() -> None:
    conn = await answer(ANSWERS[0][0] + b"HTTP/1.1 200 OK\r\n", [])
    await conn.head()
    assert await conn.read() == b"hello" and not conn.reusable(conn.idle_since)


async def test_reading_pauses_while_a_slow_client_holds_the_answer_back() -> None:
    size = 1 << 20
    conn = await answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size, [])
    transport: Any = conn.transport
    conn.data_received(b"x" * (size // 2))
    assert transport.paused
    await conn.head()
    assert len(await conn.chunk()) == size // 2 and not transport.paused


def test_a_request_is_one_write_with_the_base_path_and_host() -> None:
    origin = Origin("http://[::1]:8080/openai/v1")
    assert origin.host == "::1" and origin.port == 8080 and not origin.tls
    message = origin.request("/chat/completions", "k", b"{}", close=False)
    assert message.startswith(b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: [::1]:8080\r\n")
    assert b"Authorization: Bearer k\r\n" in message and message.endswith(b"\r\n\r\n{}")
    # No Accept-Encoding: an answer compressed for the gateway would reach the client
    # compressed and unlabelled, its usage unread (aiohttp's client asked for gzip).
    assert b"accept-encoding" not in message.lower()
    assert b"Connection: close" in Origin("https://api.example.com").request("/x", "k", b"", True)
    assert Origin("https://api.example.com").port == 443
    with pytest.raises(ValueError):
        origin.request("/x", "k\r\nX-Evil: 1", b"", False)
