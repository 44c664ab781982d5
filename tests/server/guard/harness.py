"""A gateway in process before a fake engine (``m``, which records what it was sent)
and a judge engine (``judge``: answers what the test says, or stalls until its client
hangs up), with the real GuardService over a SQLite store, and keys with policies."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from llmgw.config import GatewayConfig
from llmgw.server.audittrail import AuditTrail
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.gateway import Gateway, key_hash
from llmgw.server.guard.judge import Judge
from llmgw.server.guard.policies import PolicyAdd
from llmgw.server.guard.service import GuardService
from llmgw.server.principal import Principal
from llmgw.server.store import ApiKeyRecord, SQLiteStore
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.support.fakeengine import FakeEngine
from tests.support.gatewayserve import served

KEY = "sk-llmgw-guarded"
PLAIN = "sk-llmgw-plain"
ADMIN = Principal.system("admin@test")


class JudgeEngine:
    """An engine that answers each chat with ``say``, or, with ``stall``, answers
    nothing until its client hangs up (counted in ``gone``)."""

    def __init__(self) -> None:
        self.say = "SAFE"
        self.stall = False
        self.asked: list[dict[str, Any]] = []
        self.gone = 0
        self.port = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> JudgeEngine:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                self.asked.append(json.loads(await reader.readexactly(length)))
                if self.stall:
                    if not await reader.read(1):
                        self.gone += 1
                    return
                body = json.dumps(
                    {"choices": [{"index": 0, "message": {"content": self.say}}]}
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@dataclass
class Harness:
    gateway: Gateway
    guard: GuardService
    engine: FakeEngine
    judge: JudgeEngine
    store: SQLiteStore
    url: str
    http: aiohttp.ClientSession

    async def post(self, body: dict[str, Any], key: str = KEY) -> tuple[int, Any, str | None]:
        async with self.http.post(
            self.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as resp:
            text = await resp.text()
            answer: Any = text
            with contextlib.suppress(ValueError):
                answer = json.loads(text)
            return resp.status, answer, resp.headers.get("x-llmgw-guard")

    async def policy(self, name: str = "p", **fields: Any) -> None:
        await self.guard.add(PolicyAdd(name, **fields), ADMIN)


def _model(name: str) -> Model:
    profile = Profile(name="default", engine="llama.cpp", replicas=1)
    return Model(name=name, source="hf:a/b", engine="llama.cpp", profiles=(profile,), context=4096)


@contextlib.asynccontextmanager
async def harness(tmp_path: Path, policies: tuple[str, ...] = ("p",)) -> AsyncIterator[Harness]:
    """KEY names ``policies``; PLAIN names none."""
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    engine = await FakeEngine().start()
    judge = await JudgeEngine().start()
    view = NodeView(id="a", cert_serial=1, state=NodeState.READY, address="127.0.0.1")
    catalog = SimpleNamespace(models={"m": _model("m"), "judge": _model("judge")}, version=1)
    replicas = (("m.default.00000000", engine.port), ("judge.default.00000001", judge.port))
    for rid, port in replicas:
        view.shards[rid] = ShardStatus(replica_id=rid, state=ShardState.READY, port=port)
    nodes = SimpleNamespace(nodes={"a": view}, version=1)
    made: list[Gateway] = []
    guard = GuardService(
        store,
        lambda: catalog.models,
        Judge(lambda: made[0].router, lambda: made[0].upstream.pool),
        AuditTrail(store.audit_many),
    )
    gateway = Gateway(
        store,
        nodes,
        catalog,
        b"s" * 32,
        GatewayConfig(start_wait=0.0),
        lambda name, start: None,
        guard=guard,
    )
    made.append(gateway)
    gateway.keys.load(
        [
            ApiKeyRecord("k1", "guarded", key_hash(KEY), guard=policies),
            ApiKeyRecord("k2", "plain", key_hash(PLAIN)),
        ]
    )
    try:
        async with served(gateway) as (url, http):
            yield Harness(gateway, guard, engine, judge, store, url, http)
    finally:
        await engine.stop()
        await judge.stop()
        await store.close()
