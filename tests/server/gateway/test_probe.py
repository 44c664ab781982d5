"""The control plane's probe of engines on silent nodes: an engine is vouched for only
when it answers the replica's own key, so a process that took a dead engine's port (and
answers its health route to anyone) is not taken for it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from llmgw import pki
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.gateway.probe import EngineProbe
from llmgw.server.gateway.router import Router
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import NodeState, ShardState

SECRET = b"cluster-secret"
RID = "tiny.default.a1b2c3d4"


async def engine(key: str) -> tuple[web.AppRunner, int]:
    """An engine answering /health to anyone and /v1/models to ``key`` alone."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response({"data": [{"id": "tiny"}]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, int(port)


def model_named(name: str) -> Model:
    profile = Profile(name="default", engine="llama.cpp", replicas=1)
    return Model(name=name, source="hf:a/b", engine="llama.cpp", profiles=(profile,), context=512)


def silent_node(port: int) -> Any:
    shard = ShardStatus(replica_id=RID, state=ShardState.READY, port=port)
    view = NodeView("a", 1, NodeState.NOT_READY, address="127.0.0.1", shards={RID: shard})
    return SimpleNamespace(nodes={"a": view}, version=1)


async def test_only_the_replicas_own_engine_is_vouched_for() -> None:
    own, own_port = await engine(pki.engine_key(SECRET, RID))
    stranger, stranger_port = await engine("someone else's key")
    try:
        async with aiohttp.ClientSession() as http:
            probe = EngineProbe(silent_node(own_port), SECRET)
            await probe.round(http)
            assert probe.answers(RID) and probe.version == 0

            # The engine died and another process took its port: healthy, not ours.
            probe.nodes = silent_node(stranger_port)
            await probe.round(http)
            assert not probe.answers(RID) and probe.version == 1
    finally:
        await own.cleanup()
        await stranger.cleanup()


async def test_a_replica_remembered_from_the_store_is_routed_to_once_its_engine_answers() -> None:
    """A control plane started while engines run: the replicas the store remembers of a
    node whose agent has not registered yet are routed to only once their engine has
    answered the probe with the replica's key; the agent's word takes over when it
    registers. A replica its agent reported is routed to until the probe finds it gone."""
    own, own_port = await engine(pki.engine_key(SECRET, RID))
    stranger, stranger_port = await engine("someone else's key")
    shard = ShardStatus(replica_id=RID, state=ShardState.READY, port=own_port)
    view = NodeView("a", 1, NodeState.NOT_READY, address="127.0.0.1", remembered={RID: shard})
    nodes: Any = SimpleNamespace(nodes={"a": view}, version=1)
    catalog: Any = SimpleNamespace(models={"tiny": model_named("tiny")}, version=1)
    try:
        async with aiohttp.ClientSession() as http:
            probe = EngineProbe(nodes, SECRET)
            router = Router(nodes, catalog, probe, SECRET)
            assert router.pick("tiny") is None  # not yet proven
            await probe.round(http)
            assert probe.proven(RID) and probe.version == 1
            picked = router.pick("tiny")
            assert picked is not None and picked.replica_id == RID and picked.vouched
            assert picked.key == pki.engine_key(SECRET, RID)

            # Its engine died and another process took its port: not used.
            view.remembered = {RID: replace(shard, port=stranger_port)}
            nodes.version = 2
            await probe.round(http)
            assert not probe.proven(RID) and router.pick("tiny") is None

            # Nothing listens there at all: the same.
            await stranger.cleanup()
            await probe.round(http)
            assert router.pick("tiny") is None

            # The agent registers and reports the replica: its word, no probe needed.
            view.state, view.remembered, view.shards = NodeState.READY, {}, {RID: shard}
            nodes.version = 3
            await probe.round(http)
            assert probe.targets() == []
            picked = router.pick("tiny")
            assert picked is not None and not picked.vouched

            # Its agent falls silent: reported Ready, it serves until a probe says not.
            view.state = NodeState.NOT_READY
            nodes.version = 4
            assert router.pick("tiny") is not None
    finally:
        await own.cleanup()
        await stranger.cleanup()


async def test_the_first_round_is_waited_for_and_bounded() -> None:
    probe = EngineProbe(SimpleNamespace(nodes={}, version=1), SECRET)
    waiting = asyncio.create_task(probe.first_round())
    await asyncio.sleep(0)
    assert not waiting.done()
    async with aiohttp.ClientSession() as http:
        await probe.round(http)
    await asyncio.wait_for(waiting, 1)
    assert probe.rounds == 1
