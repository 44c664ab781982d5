"""The admin pages over a registry held in this process (the recorded 64-node fleet of
``tests/support/fleet64.py``), served on loopback by aiohttp through the control plane's
own ASGI bridge (``server/front.py``), in a thread with its own event loop: what a real
browser needs to open pages over a fleet no agent could make.

Only what the fleet's pages read is real (the registry, ``FleetService``,
``FabricService`` over the fleet's maps); a page that reaches for anything else (the
catalog, the gateway, the store) fails with a 500, which the tests catch.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from starlette.applications import Starlette

from llmgw.server.access import Gate
from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.fleet.service import FleetService
from llmgw.server.front import AsgiBridge
from llmgw.server.pages import site
from llmgw.server.pages.frame import Services
from llmgw.server.sessions import Sessions

TOKEN_HASH = "pages-test"


@dataclass(frozen=True)
class Served:
    base: str
    # The value of a signed-in viewer's session cookie (``COOKIE``).
    session: str


def _app(maps: FabricMaps, sessions: Sessions) -> Starlette:
    registry = maps.registry
    absent = cast(Any, None)
    services = Services(
        registry=registry,
        gateway=absent,
        store=absent,
        keys=absent,
        serving=absent,
        models=absent,
        views=absent,
        fleet=FleetService(registry, b"pages-test-secret"),
        planner=absent,
        fabrics=FabricService(maps.watch, maps, registry),
        device_logins=absent,
        people=absent,
        orgs=absent,
        admin_token_ok=lambda token: False,
        # Pages only read here: nobody signs out.
        revocations=absent,
    )
    gate = Gate(lambda token: False, lambda: None, sessions)
    return Starlette(routes=site.routes(services, gate, lambda: None))


@contextmanager
def serving(maps: FabricMaps) -> Iterator[Served]:
    """The pages over ``maps.registry`` on a free loopback port, until the block ends."""
    sessions = Sessions(b"p" * 32, lambda: [TOKEN_HASH])
    bridge = AsgiBridge(_app(maps, sessions))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="pages-server", daemon=True)
    thread.start()

    async def start() -> tuple[asyncio.Server, web.Server]:
        handler = web.Server(bridge)
        return await loop.create_server(handler, "127.0.0.1", 0), handler

    server, handler = asyncio.run_coroutine_threadsafe(start(), loop).result(10)

    async def stop() -> None:
        server.close()
        await handler.shutdown(5)
        await server.wait_closed()

    try:
        port = server.sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        yield Served(base, sessions.open("viewer@test", "viewer", TOKEN_HASH))
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
