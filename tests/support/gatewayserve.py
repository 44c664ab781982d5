"""A gateway served on a test server of its own, with a client session to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp.test_utils import RawTestServer

from llmgw.server.gateway import Gateway


@asynccontextmanager
async def served(gateway: Gateway) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """The gateway's URL and a client session to it; the session, the server and the
    gateway are closed after, in that order."""
    server = RawTestServer(gateway.handle)
    await server.start_server()
    http = aiohttp.ClientSession()
    try:
        yield str(server.make_url("")), http
    finally:
        await http.close()
        await server.close()
        await gateway.close()
