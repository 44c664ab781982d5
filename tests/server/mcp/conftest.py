"""The MCP gateway's parts over a real SQLite store, ``/mcp`` served by aiohttp on a
port of its own (the gateway's key check in front, as ``Gateway._handle`` does), and
the official SDK's client through it."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx2
import pytest
from aiohttp import web
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from llmgw.server.audittrail import AuditTrail
from llmgw.server.gateway.limits import Key, KeyBook, Usage, key_hash
from llmgw.server.mcp.parts import McpParts, mcp_parts
from llmgw.server.mcp.tools import BuiltinServer, ToolGuard
from llmgw.server.principal import Principal
from llmgw.server.store import ApiKeyRecord, SQLiteStore
from tests.support.ports import free_port

ADMIN = Principal("admin@10.0.0.5", "admin", "token")
SECRET = b"s" * 32


@dataclass
class Door:
    """``/mcp`` on a port: the parts, the keys, the store, and the address."""

    parts: McpParts
    keys: KeyBook
    store: SQLiteStore
    url: str
    session: aiohttp.ClientSession
    made: list[str] = field(default_factory=list)

    def key(self, name: str, tools: tuple[str, ...] | None, guard: tuple[str, ...] = ()) -> str:
        """A key granted ``tools`` (as part A's store will keep them), its secret back.
        Grants here are set on the record; the e2e sets them through the API."""
        secret = f"sk-llmgw-test-{name}"
        record = ApiKeyRecord(f"k-{name}", name, key_hash(secret), tools=tools, guard=guard)
        self.keys.load([*self.keys.records(), record])
        return secret

    def key_of(self, secret: str) -> Key:
        found = self.keys.authorise(f"Bearer {secret}")
        assert isinstance(found, Key)
        return found

    async def post(self, secret: str, body: bytes | object) -> tuple[int, dict[str, object]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.session.post(
            self.url,
            data=io.BytesIO(data),
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        ) as answer:
            text = await answer.read()
            return answer.status, (json.loads(text) if text else {})

    async def call(
        self, secret: str, name: str, arguments: dict[str, object] | None = None
    ) -> dict[str, object]:
        _, body = await self.post(
            secret,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": name, "arguments": arguments or {}},
            },
        )
        return body


@asynccontextmanager
async def door(
    tmp_path: Path,
    builtins: Sequence[BuiltinServer] = (),
    guard: ToolGuard | None = None,
) -> AsyncIterator[Door]:
    store = SQLiteStore(tmp_path / "mcp.db")
    await store.open()
    session = aiohttp.ClientSession()
    trail = AuditTrail(store.audit_many)
    parts = mcp_parts(store, trail, SECRET, lambda: session, builtins, guard)
    await parts.registry.load()
    keys = KeyBook(Usage(store))

    async def handle(request: web.Request) -> web.StreamResponse:
        key = keys.authorise(request.headers.get("Authorization", ""))
        if isinstance(key, web.Response):
            return key
        return await parts.gateway.handle(request, key)

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/mcp", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield Door(parts, keys, store, f"http://127.0.0.1:{port}/mcp", session)
    finally:
        await runner.cleanup()
        await session.close()
        await store.close()


@asynccontextmanager
async def sdk_client(url: str, secret: str) -> AsyncIterator[Client]:
    """The SDK's client (auto mode: discover, then initialize) with a gateway key."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {secret}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Door]:
    async with door(tmp_path) as d:
        yield d
