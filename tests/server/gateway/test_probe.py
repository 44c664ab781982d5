"""The control plane's probe of engines on silent nodes: an engine is vouched for only
when it answers the replica's own key, so a process that took a dead engine's port (and
answers its health route to anyone) is not taken for it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from llmgw import pki
from llmgw.server.gateway.probe import EngineProbe
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


def silent_node(port: int) -> Any:
    shard = ShardStatus(replica_id=RID, state=ShardState.READY, port=port)
    view = SimpleNamespace(state=NodeState.NOT_READY, address="127.0.0.1", shards={RID: shard})
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
