"""The gateway's HTTP/1.1 client to engines and providers: one connection, the pool.

A request is one write of bytes built at once; the answer is parsed by hand as it
arrives: the status line and headers, then the body by Content-Length, in chunks, or
until the connection closes. Idle connections are pooled by origin, the most recently
used first, each at most POOL_KEEPALIVE seconds. aiohttp's client took about a third
of the gateway's CPU a request (``docs/performance.md``); the gateway sends one kind of
request and reads a few headers of the answer, so this is the least of a client.
No ``Accept-Encoding`` is sent: engines and providers answer in plain text, which the
gateway reads and passes on as it is.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import urllib.parse
from typing import cast

# Shorter than the engines' own keep-alive (llama.cpp's and uvicorn's 5 s), so the pool
# never offers a connection the engine is about to close.
POOL_KEEPALIVE = 4.0
CONNECT_TIMEOUT = 5.0
# The most of an answer's head (status line and headers) the gateway reads.
MAX_HEAD = 64 * 1024
# Reading from an engine pauses while this much of its answer waits for the client.
HIGH_WATER = 256 * 1024


class BadAnswer(Exception):
    """What came back is not an HTTP/1.1 answer the gateway can read."""


class Lost(ConnectionError):
    """The connection ended before the answer did; ``early``: before any byte of it."""

    def __init__(self, why: str, early: bool) -> None:
        super().__init__(why)
        self.early = early


# Where the parser is in an answer.
_IDLE, _HEAD, _LENGTH, _SIZE, _DATA, _CRLF, _TRAILER, _UNTIL_CLOSE, _DONE = range(9)
# A chunk's size, in hex, and any extensions (ignored), then CRLF.
_CHUNK_SIZE = re.compile(rb"([0-9a-fA-F]{1,15})[ \t]*(?:;[^\r\n]*)?\r\n").match


class EngineConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to an engine or a provider, one request at a time.

    The answer is parsed as it arrives: the status line and headers, then the body by
    Content-Length, in chunks, or until the connection closes; interim (1xx) answers
    skipped, trailers read and dropped. Anything else that is not HTTP/1.1 (no CRLF,
    folded or nameless headers, two lengths, a chunk size that is not hex, a head over
    MAX_HEAD) is a ``BadAnswer`` and the connection is not used again. The gateway sends
    one kind of request and reads a few headers of the answer, so this is the least of
    a client.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.waiter: asyncio.Future[None] | None = None
        self.error: Exception | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self.state = _IDLE
        self.started = False
        self.asked_close = False
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.keep_alive = False
        self.remaining = 0
        self.body: list[bytes] = []
        self.pending = 0

    # ----------------------------------------------------------- asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's is not a subclass of asyncio's, so no isinstance).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.state in (_IDLE, _DONE):
            # Nothing was asked: an engine that says more than it was asked is not
            # trusted with the next request.
            self.keep_alive = False
            self.close()
            return
        self.started = True
        try:
            self.buffer = self._parse(self.buffer + data if self.buffer else data)
        except BadAnswer as exc:
            self.error = exc
            self.keep_alive = False
            self.close()
        if self.pending > HIGH_WATER and not self.paused and not self.closed:
            assert self.transport is not None
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself; connection_lost says the rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.state == _UNTIL_CLOSE:
            self.state = _DONE
        elif self.state not in (_IDLE, _DONE) and self.error is None:
            why = str(exc) if exc else "the engine closed the connection"
            self.error = Lost(why, early=not self.started)
        self._wake()

    # ------------------------------------------------------------ the request

    def send(self, data: bytes, close: bool) -> None:
        """A request, whole (``close``: it said ``Connection: close``); its answer is
        read next."""
        self.state = _HEAD
        self.started = False
        self.asked_close = close
        self.status = 0
        self.headers = []
        self.keep_alive = False
        self.body = []
        self.pending = 0
        if self.closed or self.transport is None or self.transport.is_closing():
            self.error = Lost("the engine had closed the connection", early=True)
            return
        self.transport.write(data)

    async def head(self) -> None:
        """Until the answer's status and headers are in."""
        while self.state == _HEAD:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def chunk(self) -> bytes:
        """The body as it arrives: what came since the last call, b"" at its end."""
        while True:
            if self.body:
                body = self.body
                data = body[0] if len(body) == 1 else b"".join(body)
                self.body = []
                self.pending = 0
                if self.paused and self.transport is not None:
                    self.paused = False
                    self.transport.resume_reading()
                return data
            if self.state == _DONE:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait()

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while data := await self.chunk():
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @property
    def complete(self) -> bool:
        """The whole answer is in (what ``chunk`` has not yet returned aside)."""
        return self.state == _DONE

    def reusable(self, now: float) -> bool:
        """Whole, kept alive, not closing (an engine's FIN closes the transport before
        asyncio calls connection_lost) and not idle too long."""
        return (
            self.keep_alive
            and self.state == _DONE
            and not self.closed
            and self.error is None
            and not self.buffer
            and self.transport is not None
            and not self.transport.is_closing()
            and now - self.idle_since < POOL_KEEPALIVE
        )

    def header(self, name: str) -> str | None:
        """The last value of header ``name`` (lower case)."""
        for key, value in reversed(self.headers):
            if key.lower() == name:
                return value
        return None

    @property
    def content_type(self) -> str:
        value = self.header("content-type")
        return value.split(";", 1)[0].strip().lower() if value else ""

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    async def _wait(self) -> None:
        waiter = self.waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------ the answer

    def _parse(self, buf: bytes) -> bytes:
        """Consume what ``buf`` holds of the answer; return what must wait for more."""
        at, size = 0, len(buf)
        while at < size:
            state = self.state
            if state == _SIZE:
                # A chunk's size line; the chunk itself taken at once when it is all here
                # with its CRLF, as a stream's events mostly are.
                m = _CHUNK_SIZE(buf, at)
                if m is None:
                    if buf.find(b"\r\n", at) >= 0 or size - at > 1024:
                        raise BadAnswer(f"a chunk's size line is not one: {buf[at : at + 20]!r}")
                    break
                n = int(m[1], 16)
                at = m.end()
                if not n:
                    self.state = _TRAILER
                elif buf.startswith(b"\r\n", at + n):
                    self.body.append(buf[at : at + n])
                    self.pending += n
                    at += n + 2
                else:
                    self.remaining = n
                    self.state = _DATA
            elif state == _LENGTH or state == _DATA:
                n = self.remaining
                piece = buf[at : at + n] if at or size - at > n else buf
                self.body.append(piece)
                self.pending += len(piece)
                self.remaining = n = n - len(piece)
                at += len(piece)
                if n == 0:
                    self.state = _DONE if state == _LENGTH else _CRLF
            elif state == _HEAD:
                end = buf.find(b"\r\n\r\n", at)
                if end < 0:
                    if size - at > MAX_HEAD:
                        raise BadAnswer(f"an answer's head over {MAX_HEAD // 1024} KiB")
                    break
                self._head(buf[at:end])
                at = end + 4
            elif state == _CRLF:
                if size - at < 2:
                    break
                if buf[at : at + 2] != b"\r\n":
                    raise BadAnswer("a chunk does not end in CRLF")
                self.state = _SIZE
                at += 2
            elif state == _TRAILER:
                if buf[at : at + 2] == b"\r\n":
                    at += 2
                else:
                    end = buf.find(b"\r\n\r\n", at)
                    if end < 0:
                        if size - at > MAX_HEAD:
                            raise BadAnswer("trailers over 64 KiB")
                        break
                    at = end + 4
                self.state = _DONE
            elif state == _UNTIL_CLOSE:
                self.body.append(buf[at:] if at else buf)
                self.pending += size - at
                at = size
            else:  # _DONE: more than the answer: this connection is not used again
                self.keep_alive = False
                at = size
        return buf[at:] if at else buf

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        line = lines[0]
        if len(line) < 12 or not line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")):
            raise BadAnswer(f"not an HTTP/1.1 answer: {line[:40]!r}")
        code = line[9:12]
        if not code.isdigit() or (len(line) > 12 and line[12:13] != b" "):
            raise BadAnswer(f"no status in {line[:40]!r}")
        status = int(code)
        close = line[7:8] == b"0"  # HTTP/1.0 closes unless it says keep-alive
        length: int | None = None
        encoded = chunked = False
        headers = []
        for field in lines[1:]:
            name, colon, value = field.partition(b":")
            if not colon or not name or name[-1:] in b" \t" or field[:1] in b" \t":
                raise BadAnswer(f"a header that is not one: {field[:40]!r}")
            value = value.strip(b" \t")
            lower = name.lower()
            if lower == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise BadAnswer(f"a Content-Length that is not one: {value[:20]!r}")
                length = int(value)
            elif lower == b"transfer-encoding":
                encoded = True
                chunked = value.rsplit(b",", 1)[-1].strip(b" \t").lower() == b"chunked"
            elif lower == b"connection":
                tokens = {t.strip(b" \t").lower() for t in value.split(b",")}
                if b"close" in tokens:
                    close = True
                elif b"keep-alive" in tokens:
                    close = False
            headers.append((name.decode("latin-1"), value.decode("latin-1")))
        if status < 200:
            if status == 101 or status < 100:
                raise BadAnswer(f"status {status}")
            return  # an interim answer (100 Continue): the answer follows
        self.status = status
        self.headers = headers
        if status in (204, 304):
            self.state = _DONE
        elif encoded:
            # Chunked if that was the last coding; else its end is the connection's.
            self.state = _SIZE if chunked else _UNTIL_CLOSE
            close = close or not chunked
        elif length is not None:
            self.remaining = length
            self.state = _LENGTH if length else _DONE
        else:
            self.state = _UNTIL_CLOSE
            close = True
        self.keep_alive = not close and not self.asked_close


class Origin:
    """Where an endpoint's requests go: the host to connect to and what to send it."""

    __slots__ = ("key", "host", "port", "tls", "prefix", "authority")

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.key = (self.tls, self.host, self.port)
        self.prefix = urllib.parse.quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=~")
        authority = parts.netloc.rpartition("@")[2]
        if not authority.isascii():
            authority = self.host.encode("idna").decode() + (f":{parts.port}" if parts.port else "")
        self.authority = authority

    def request(self, path: str, key: str, body: bytes, close: bool) -> bytes:
        """The whole request, head and body, for one write."""
        if "\r" in key or "\n" in key:
            raise ValueError("the endpoint's key holds a line break")
        return (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.authority}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n"
        ).encode("latin-1") + body


class EnginePool:
    """Idle connections by origin, the most recently used first; each kept at most
    POOL_KEEPALIVE seconds, shorter than the engines keep theirs."""

    def __init__(self) -> None:
        self.idle: dict[tuple[bool, str, int], list[EngineConnection]] = {}
        self.origins: dict[str, Origin] = {}
        self._tls: ssl.SSLContext | None = None
        self._sweeping: asyncio.TimerHandle | None = None

    def origin(self, url: str) -> Origin:
        origin = self.origins.get(url)
        if origin is None:
            if len(self.origins) > 4096:
                self.origins.clear()  # endpoints come and go; a few re-parsed URLs cost little
            origin = self.origins[url] = Origin(url)
        return origin

    def take(self, origin: Origin) -> EngineConnection | None:
        idle = self.idle.get(origin.key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable(now):
                return conn
            conn.close()
        return None

    async def connect(self, origin: Origin) -> EngineConnection:
        loop = asyncio.get_running_loop()
        tls = None
        if origin.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        async with asyncio.timeout(CONNECT_TIMEOUT):
            _, conn = await loop.create_connection(
                lambda: EngineConnection(loop),
                origin.host,
                origin.port,
                ssl=tls,
                server_hostname=origin.host if tls else None,
            )
        return conn

    def give_back(self, origin: Origin, conn: EngineConnection) -> None:
        """A connection whose answer was read to its end: kept if it may be used again."""
        conn.idle_since = now = time.monotonic()
        if not conn.reusable(now):
            conn.close()
            return
        self.idle.setdefault(origin.key, []).append(conn)
        if self._sweeping is None:
            self._sweeping = asyncio.get_running_loop().call_later(POOL_KEEPALIVE, self.sweep)

    def sweep(self) -> None:
        """Close the connections idle too long; again while any are left."""
        self._sweeping = None
        now = time.monotonic()
        for key, idle in list(self.idle.items()):
            kept = []
            for conn in idle:
                if conn.reusable(now):
                    kept.append(conn)
                else:
                    conn.close()
            if kept:
                self.idle[key] = kept
            else:
                del self.idle[key]
        if self.idle:
            self._sweeping = asyncio.get_running_loop().call_later(POOL_KEEPALIVE / 2, self.sweep)

    def close(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None
        for idle in self.idle.values():
            for conn in idle:
                conn.close()
        self.idle = {}
