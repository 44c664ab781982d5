"""A real control plane's admin API and pages, served on loopback in this process: its
SQLite store in a data dir made by ``server init``, ``ControlPlane.admin_app()`` behind
the control plane's own ASGI bridge (``server/front.py``) on aiohttp, in a thread with
its own event loop. So a ``ctl`` command, run by ``llmgw.cli.main`` in the test's thread,
talks to it over HTTP exactly as it does to a control plane elsewhere; no agent, no
engine, no listener but this one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.front import AsgiBridge
from llmgw.server.people.asks import NewPerson, NewToken
from llmgw.server.principal import Principal, Role
from llmgw.server.store import open_store

T = TypeVar("T")


@dataclass(frozen=True)
class Served:
    base: str
    # The data dir's admin token.
    token: str
    cp: ControlPlane
    loop: asyncio.AbstractEventLoop

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` run on the control plane's loop, its answer here."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(30)

    def person(self, login: str, role: Role | None = None) -> str:
        """A person (made by an admin) and a personal token of theirs."""
        admin = Principal.system("test")

        async def make() -> str:
            person = await self.cp.people.create(NewPerson(login=login, role=role), admin)
            acting = self.cp.directory.principal(person, "token")
            assert acting is not None
            _, token = await self.cp.people.new_token(login, NewToken(name="test"), acting)
            return token

        return self.run(make())


@contextmanager
def serving(root: Path) -> Iterator[Served]:
    """A control plane initialised in ``root``, served on a free loopback port."""
    _, token = init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="admin-server", daemon=True)
    thread.start()

    async def start() -> tuple[ControlPlane, asyncio.Server, web.Server]:
        data = DataDir(root)
        config = data.load_config()
        cp = ControlPlane(data, config, await open_store(config, root))
        await cp.load()
        handler = web.Server(AsgiBridge(cp.admin_app()))
        return cp, await loop.create_server(handler, "127.0.0.1", 0), handler

    cp, server, handler = asyncio.run_coroutine_threadsafe(start(), loop).result(30)

    async def stop() -> None:
        server.close()
        await handler.shutdown(5)
        await server.wait_closed()
        await cp.gateway.close()
        await cp.inspector.close()
        await cp.store.close()

    try:
        port = server.sockets[0].getsockname()[1]
        yield Served(f"http://127.0.0.1:{port}", token, cp, loop)
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
