"""The control plane's HTTP listener: aiohttp's server in front of everything.

``/v1/`` goes straight to the gateway, written against aiohttp's request and response
so a request costs as little as it can (Hypercorn under an ASGI app measured 1,500
proxied requests a second here, aiohttp's server 3,100). Every other path (the admin
API, enrollment, the admin pages) is the Starlette app, reached through a small ASGI
bridge: those requests are few, and Starlette keeps them easy to write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from llmgw.config import parse_hostport

log = logging.getLogger("llmgw.http")

# Past the gateway's own limit (32 MiB), so it is the gateway that says no, in its words.
MAX_BODY = 64 * 1024 * 1024

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Asgi = Callable[..., Awaitable[None]]


class AsgiBridge:
    """Run an ASGI app for one aiohttp request: the body read whole (admin requests
    are small), the answer written as the app sends it (so a followed log streams)."""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": f"{request.version.major}.{request.version.minor}",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.raw_path.split("?", 1)[0].encode(),
            "query_string": request.query_string.encode("latin-1"),
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.raw_headers],
            "client": tuple(peer[:2]) if peer else None,
            "server": tuple(sock[:2]) if sock else None,
        }
        delivered = False
        finished = asyncio.Event()
        response: web.StreamResponse | None = None

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
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
        finally:
            finished.set()
        if response is None:
            return web.Response(status=500, text="the app sent no answer")
        return response


class Listener:
    """One address served by aiohttp: ``/v1/`` to ``gateway``, the rest to ``other``."""

    def __init__(self, address: str, gateway: Handler | None, other: Handler) -> None:
        self.address = address
        self.gateway = gateway
        self.other = other
        self.runner: web.ServerRunner | None = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if self.gateway is not None and request.path.startswith("/v1/"):
            return await self.gateway(request)
        return await self.other(request)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def request(
            message: Any, payload: Any, protocol: Any, writer: Any, task: Any
        ) -> web.BaseRequest:
            # aiohttp's default refuses bodies over 1 MiB; the gateway judges size itself.
            return web.BaseRequest(
                message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY
            )

        server = web.Server(
            self.handle, request_factory=request, access_log=None, handler_cancellation=True
        )
        self.runner = web.ServerRunner(server, shutdown_timeout=3.0)
        await self.runner.setup()
        host, port = parse_hostport(self.address)
        site = web.TCPSite(self.runner, host, port, backlog=1024)
        await site.start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
