"""A real control plane (its admin API and pages, its SQLite store, ``SlurmService`` and
its keeper) with fake agents (``tests/server/slurm/fleet.py``'s ``Plane``), served on a
free loopback port from a thread with its own event loop: what a real browser, or the
console's synchronous client, needs to reach it from a test that runs no loop itself.

``served(root, prepare)`` makes the data dir, runs ``prepare(plane)`` on the control
plane's loop (register nodes, report what Slurm says, set Slurm up, lend), then serves
until the block ends; ``Served.run`` runs more on that loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
from aiohttp import web

from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.front import AsgiBridge
from llmgw.server.store import open_store
from tests.server.slurm.fleet import Plane

T = TypeVar("T")


@dataclass
class Served:
    base: str
    # The cluster's admin token.
    token: str
    plane: Plane
    loop: asyncio.AbstractEventLoop

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` on the control plane's loop, its result here."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(30)


@contextmanager
def served(root: Path, prepare: Callable[[Plane], Awaitable[None]]) -> Iterator[Served]:
    data_dir = root / "data"
    _, token = init(data_dir, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="slurm-plane", daemon=True)
    thread.start()

    async def start() -> tuple[Plane, asyncio.Server, web.Server]:
        data = DataDir(data_dir)
        config = data.load_config()
        store = await open_store(config, data_dir)
        cp = ControlPlane(data, config, store)
        await cp.load()
        # The callers reach it over HTTP: no in-process test client is needed.
        plane = Plane(cp, cast(httpx.AsyncClient, None), data_dir)
        await prepare(plane)
        handler = web.Server(AsgiBridge(cp.admin_app()))
        return plane, await loop.create_server(handler, "127.0.0.1", 0), handler

    plane, server, handler = asyncio.run_coroutine_threadsafe(start(), loop).result(60)

    async def stop() -> None:
        server.close()
        await handler.shutdown(5)
        await server.wait_closed()
        await plane.cp.gateway.close()
        await plane.cp.inspector.close()
        await plane.cp.store.close()

    try:
        port = server.sockets[0].getsockname()[1]
        yield Served(f"http://127.0.0.1:{port}", token, plane, loop)
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
