"""The control plane's HTTP listener: aiohttp's server in front of everything.

``/v1/`` goes straight to the gateway, written against aiohttp's request and response
so a request costs as little as it can (Hypercorn under an ASGI app measured 1,500
proxied requests a second here, aiohttp's server 3,100). Every other path (the admin
API, enrollment, the admin pages) is the Starlette app, reached through a small ASGI
bridge that hands the app the body only as it asks for it: the app's gate refuses a
caller without a token, or a body too large, before it is read.

No client can hold the listener: a request's headers must arrive within
``header_timeout`` of its first byte (or of the connection), an idle keep-alive
connection is closed after ``keepalive_timeout``, and at most ``max_connections`` are
open at once. Past that cap the connection idle longest (no request in flight: a
client that connected and sent nothing, or half its headers) is closed to make room,
and only when none is idle is the new one answered 503. The process raises its own file
limit to the hard limit at start, so the cap, not the file limit, is what binds.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import logging
import os
import platform
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from starlette.types import ASGIApp, Message, Scope

from llmgw.config import parse_hostport
from llmgw.server.handover import BACKLOG, bind, duplicate

log = logging.getLogger("llmgw.http")


class _NoMalformed(logging.Filter):
    """aiohttp logs a traceback for every request it cannot parse (a NUL in a header,
    a bad request line); the client got its 400, and a log a stranger can fill is a
    log nobody reads."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, HttpProcessingError)


# What aiohttp's connections log goes here.
protocol_log = logging.getLogger("llmgw.http.protocol")
protocol_log.addFilter(_NoMalformed())

# aiohttp's own cap on what it buffers of a body; each route judges size itself first.
MAX_BODY = 1 << 30
# File descriptors kept for what is not a client connection: engines' connections,
# agents' streams, the store, the admin listener.
RESERVED_FILES = 256
# What aiohttp reads and discards of a body left unread (a refused one) before it
# closes the connection.
LINGER = 2.0
# A handover's drain (``Listener.drain``): how long the connections open may take to end,
# and how long one must have been idle to be closed (a keep-alive one a client is about
# to reuse is, by then, rarely the one it picks).
DRAIN = 10.0
DRAIN_IDLE = 1.0

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed, else None (asyncio's own): the zipapp
    may run where uvloop's wheel is not. Measured on this listener: a streamed request to
    an engine that closes after each stream (a connection each) costs a quarter less
    CPU on uvloop, and others a little less (``docs/performance.md``)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def raise_file_limit() -> int:
    """The soft limit on open files raised to the hard one; returns the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open file limit from %d to %d: %s", soft, hard, exc)
    return int(soft)


# mallopt's parameter number for glibc's mapping threshold (malloc.h: M_MMAP_THRESHOLD).
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024


def hold_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mapping threshold at ``threshold`` bytes; True when it was set.

    Every agent stream is a TLS connection: uvloop gives each a 256 KiB receive buffer,
    and each ``ssl`` read allocates a 256 KiB bytes object and shrinks it. glibc maps
    blocks of 128 KiB and more apart at first but raises that threshold each time such a
    block is freed, so after the first read every 256 KiB block is carved from the heap,
    where freed tails and long-lived small objects interleave and the heap cannot shrink.
    Held at 128 KiB, 1,000 agents with 8 cards took 252 MB of control plane where they
    took 292 (``docs/performance.md``), and a ``/metrics`` scrape's large blocks go back
    at once. False where the C library is not glibc, or where the operator chose a
    threshold (``MALLOC_MMAP_THRESHOLD_``)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError) as exc:
        log.debug("mallopt unavailable: %s", exc)
        return False


def connection_cap(configured: int, files: int) -> int:
    """Client connections a listener holds at once: as configured, or half of what the
    file limit leaves (each connection may have an engine's beside it)."""
    if configured:
        return configured
    return max(16, (files - RESERVED_FILES) // 2)


class AsgiBridge:
    """Run an ASGI app for one aiohttp request; the body reaches the app as it reads
    it, the answer is written as the app sends it (so a followed log streams)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await self._call(request)
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return _json(500, "internal_error", "the control plane failed; its log says why")

    async def _call(self, request: web.BaseRequest) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": f"{request.version.major}.{request.version.minor}",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.raw_path.split("?", 1)[0].encode("latin-1", "replace"),
            # As sent (percent-encoded ASCII); the decoded text may hold any character.
            "query_string": request.rel_url.raw_query_string.encode("latin-1", "replace"),
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.raw_headers],
            "client": tuple(peer[:2]) if peer else None,
            "server": tuple(sock[:2]) if sock else None,
        }
        body_done = False
        finished = asyncio.Event()
        response: web.StreamResponse | None = None

        async def receive() -> Message:
            nonlocal body_done
            if not body_done:
                chunk = await request.content.readany()
                body_done = not chunk or request.content.at_eof()
                return {"type": "http.request", "body": chunk, "more_body": not body_done}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal response
            if message["type"] == "http.response.start":
                response = web.StreamResponse(status=message["status"])
                for key, value in message.get("headers", []):
                    response.headers.add(key.decode("latin-1"), value.decode("latin-1"))
                await response.prepare(request)
            elif message["type"] == "http.response.body":
                assert response is not None
                chunk = message.get("body", b"")
                if chunk:
                    await response.write(chunk)
                if not message.get("more_body", False):
                    await response.write_eof()

        try:
            await self.app(scope, receive, send)
        except Exception:
            if response is None:
                raise  # answered in __call__, in the same shape as every other error
            log.exception("%s %s failed after its answer began", request.method, request.path)
        finally:
            finished.set()
        if response is None:
            return _json(500, "internal_error", "the app sent no answer")
        return response


def _json(status: int, kind: str, message: str) -> web.Response:
    body = {"error": {"type": kind, "message": message, "code": kind, "param": None}}
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/json"
    )


_FULL = json.dumps(
    {
        "error": {
            "message": "the control plane holds as many connections as it may, all busy; "
            "try again shortly",
            "type": "service_unavailable",
            "param": None,
            "code": "too_many_connections",
        }
    }
).encode()
_FULL_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nRetry-After: 1\r\nContent-Length: "
    + str(len(_FULL)).encode()
    + b"\r\n\r\n"
    + _FULL
)


class _Guarded(RequestHandler):
    """aiohttp's connection, with when it began waiting for a request's headers."""

    def __init__(self, guard: Guard, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.busy = 0
        self.idle_since = time.monotonic()
        # Since when this connection owes the headers of a request: from the connection,
        # and from each new request's first byte; None while one is being answered and
        # while idle between requests (aiohttp's keep-alive limit covers that).
        self.waiting_since: float | None = self.idle_since

    def data_received(self, data: bytes) -> None:
        if not self.busy and self.waiting_since is None:
            self.waiting_since = time.monotonic()  # a request's first byte
        super().data_received(data)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not read (a request line past 8 KiB, a NUL in a
        header) answered in JSON, in the shape both the admin API's and OpenAI's clients
        read; logged only when it was our failure."""
        if request.writer.output_size > 0:
            raise ConnectionError("the answer had begun; no error can follow it")
        if status >= 500:
            self.log_exception("failed on a request from %s", request.remote, exc_info=exc)
            words = "the control plane failed on this request; its log says why"
        else:
            words = f"the request could not be read: {(message or str(exc or ''))[:200]}"
        kind = "invalid_request_error" if status < 500 else "api_error"
        body = {"error": {"message": words, "type": kind, "param": None, "code": "bad_http"}}
        answer = web.Response(
            status=status, body=json.dumps(body).encode(), content_type="application/json"
        )
        answer.force_close()
        return answer


class Guard(web.Server):
    """aiohttp's server with the connection cap and the header deadline. The deadline is
    kept by one sweep a listener, not a timer a request: the hot path only notes a time."""

    def __init__(self, handler: Handler, cap: int, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.cap = cap
        self.header_timeout = header_timeout
        self.open: dict[_Guarded, None] = {}
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0
        self._sweeping: asyncio.TimerHandle | None = None

    def sweep(self) -> None:
        """Close each connection whose headers are late; again in a moment."""
        now = time.monotonic()
        late = [
            h
            for h in self.open
            if not h.busy
            and h.waiting_since is not None
            and now - h.waiting_since > self.header_timeout
        ]
        for handler in late:
            self.timed_out += 1
            self.open.pop(handler, None)
            handler.force_close()
        every = min(1.0, self.header_timeout / 4)
        self._sweeping = asyncio.get_running_loop().call_later(every, self.sweep)

    def stop_sweeping(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None

    def __call__(self) -> RequestHandler:
        return _Guarded(self, self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        assert isinstance(handler, _Guarded)
        if len(self.open) >= self.cap:
            victim = min(
                (h for h in self.open if not h.busy), key=lambda h: h.idle_since, default=None
            )
            if victim is None:
                self.refused += 1
                transport.write(_FULL_ANSWER)
                transport.close()
                return
            self.evicted += 1
            self.open.pop(victim, None)
            victim.force_close()
        self.open[handler] = None

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.open.pop(handler, None)  # type: ignore[call-overload]
        super().connection_lost(handler, exc)


class Listener:
    """One address served by aiohttp: ``/v1/`` and ``/mcp`` to ``gateway``, ``/mirror/``
    to ``mirror`` (when set), the rest to ``other``."""

    def __init__(
        self,
        address: str,
        gateway: Handler | None,
        other: Handler,
        *,
        cap: int = 1024,
        header_timeout: float = 10.0,
        keepalive_timeout: float = 75.0,
        mirror: Handler | None = None,
    ) -> None:
        self.address = address
        self.gateway = gateway
        self.other = other
        # offline.mirror: /mirror/ to the mirror's files (server/mirror.py).
        self.mirror = mirror
        self.cap = cap
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.runner: web.ServerRunner | None = None
        self.server: Guard | None = None
        # The listening sockets: bound here, or handed over by the program before.
        self.sockets: list[socket.socket] = []
        self.sites: list[web.SockSite] = []
        # Handing over (``drain``): every answer closes its connection after it.
        self.draining = False

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        proto = request.protocol
        conn = proto if isinstance(proto, _Guarded) else None
        if conn is not None:
            conn.busy += 1
            conn.waiting_since = None
        try:
            path = request.path
            if self.gateway is not None and (path.startswith("/v1/") or path == "/mcp"):
                answer = await self.gateway(request)
            elif self.mirror is not None and path.startswith("/mirror/"):
                answer = await self.mirror(request)
            else:
                answer = await self.other(request)
            if self.draining:
                if not answer.prepared:
                    answer.force_close()  # said to the client: `Connection: close`
                proto.close()  # and closed once it is written
            return answer
        finally:
            if conn is not None:
                conn.busy -= 1
                conn.idle_since = time.monotonic()

    def counts(self) -> dict[str, int]:
        server = self.server
        if server is None:
            return {}
        return {
            "open": len(server.open),
            "cap": server.cap,
            "refused": server.refused,
            "evicted": server.evicted,
            "header_timeouts": server.timed_out,
        }

    async def start(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve ``sockets`` (handed over, ``handover.py``), or bind the address."""
        loop = asyncio.get_running_loop()

        def request(
            message: RawRequestMessage,
            payload: StreamReader,
            protocol: RequestHandler,
            writer: AbstractStreamWriter,
            task: asyncio.Task[None],
        ) -> web.BaseRequest:
            # Each route judges a body's size itself, before and while reading it.
            return web.BaseRequest(
                message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY
            )

        self.server = Guard(
            self.handle,
            self.cap,
            self.header_timeout,
            request_factory=request,
            access_log=None,
            handler_cancellation=True,
            keepalive_timeout=self.keepalive_timeout,
            lingering_time=LINGER,
            logger=protocol_log,
        )
        self.server.sweep()
        self.runner = web.ServerRunner(self.server, shutdown_timeout=3.0)
        await self.runner.setup()
        self.sockets = sockets or bind(parse_hostport(self.address))
        for sock in self.sockets:
            site = web.SockSite(self.runner, sock, backlog=BACKLOG)
            await site.start()
            self.sites.append(site)

    def hand_over(self) -> list[int]:
        """Descriptors of the listening sockets that stay open once this listener stops,
        for the program started again in this one's place: clients wait in the backlog."""
        return duplicate(self.sockets)

    async def drain(self, within: float = DRAIN) -> None:
        """Before a handover: stop taking connections (the sockets, handed over, stay
        listening: new clients wait in the backlog for the next program), answer what
        each open connection asks with ``Connection: close``, and close a connection
        idle ``DRAIN_IDLE`` seconds (one closed the moment its client sends is the one
        loss HTTP/1.1 allows: the longer the idle, the rarer); up to ``within`` seconds."""
        self.draining = True
        for site in self.sites:
            await site.stop()
        self.sites = []
        server = self.server
        if server is None:
            return
        deadline = time.monotonic() + within
        while server.open and time.monotonic() < deadline:
            now = time.monotonic()
            for conn in list(server.open):
                if not conn.busy and now - conn.idle_since >= DRAIN_IDLE:
                    server.open.pop(conn, None)
                    conn.force_close()
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.stop_sweeping()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
