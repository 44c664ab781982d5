"""Images at the gateway, in one process in front of fake engines: /v1/models says which
models take images, an image reaches a vision model's engine, is refused for a model
whose replicas take none, and an allowed image URL reaches the engine as a data URL."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import RawTestServer

from llmgw.config import GatewayConfig
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.gateway import Gateway, key_hash
from llmgw.server.store import ApiKeyRecord, SQLiteStore
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.support.fakeengine import FakeEngine

KEY = "sk-llmgw-vision"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def model(name: str, *, urls: bool = False) -> Model:
    return Model(
        name=name,
        source=f"hf:a/{name}:Q4_K_M",
        engine="llama.cpp",
        profiles=(Profile(name="default", engine="llama.cpp"),),
        context=4096,
        allow_image_urls=urls,
    )


@dataclass
class Harness:
    eye: FakeEngine  # takes images, fetches URLs
    plain: FakeEngine  # its replica said: no images
    quiet: FakeEngine  # its replica said nothing (an older agent)
    url: str
    http: aiohttp.ClientSession
    picture: str  # where a picture is served, on loopback

    async def post(self, name: str, url: str) -> tuple[int, dict[str, Any]]:
        content = [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        body = {"model": name, "messages": [{"role": "user", "content": content}]}
        async with self.http.post(
            self.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as resp:
            return resp.status, json.loads(await resp.text())


def shard(rid: str, port: int, vision: bool | None) -> ShardStatus:
    return ShardStatus(replica_id=rid, state=ShardState.READY, port=port, vision=vision)


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Harness]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    eye, plain, quiet = [await FakeEngine(close_after_stream=False).start() for _ in range(3)]
    view = NodeView(id="a", cert_serial=1, state=NodeState.READY, address="127.0.0.1")
    view.shards = {
        "eye.default.00000000": shard("eye.default.00000000", eye.port, True),
        "plain.default.00000000": shard("plain.default.00000000", plain.port, False),
        "quiet.default.00000000": shard("quiet.default.00000000", quiet.port, None),
    }
    models = {"eye": model("eye", urls=True), "plain": model("plain"), "quiet": model("quiet")}
    gateway = Gateway(
        store,
        SimpleNamespace(nodes={"a": view}, version=1),
        SimpleNamespace(models=models, version=1),
        b"s" * 32,
        # The picture is on loopback: the operator allowed private addresses.
        GatewayConfig(start_wait=0.0, image_urls_private=True),
        lambda n, s: None,
    )
    gateway.keys.changed(ApiKeyRecord("k0", KEY, key_hash(KEY), models=()))
    server = RawTestServer(gateway.handle)
    await server.start_server()

    async def picture(_: web.BaseRequest) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    pictures = RawTestServer(picture)
    await pictures.start_server()
    http = aiohttp.ClientSession()
    try:
        yield Harness(
            eye, plain, quiet, str(server.make_url("")), http, str(pictures.make_url("/p.png"))
        )
    finally:
        await http.close()
        await pictures.close()
        await server.close()
        await gateway.close()
        for engine in (eye, plain, quiet):
            await engine.stop()
        await store.close()


DATA = "data:image/png;base64," + base64.b64encode(PNG).decode()


async def test_v1_models_says_which_models_take_images(gw: Harness) -> None:
    async with gw.http.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}) as r:
        listed = {m["id"]: m for m in (await r.json())["data"]}
    assert listed["eye"]["capabilities"] == ["vision"]
    assert "capabilities" not in listed["plain"] and "capabilities" not in listed["quiet"]


async def test_an_image_reaches_a_vision_models_engine_as_sent(gw: Harness) -> None:
    status, body = await gw.post("eye", DATA)
    assert status == 200, body
    (sent,) = gw.eye.requests
    assert sent["messages"][0]["content"][1] == {"type": "image_url", "image_url": {"url": DATA}}


async def test_a_model_whose_replicas_take_no_images_is_refused_them(gw: Harness) -> None:
    status, body = await gw.post("plain", DATA)
    assert status == 400
    assert body["error"]["code"] == "model_not_vision"
    assert "'plain' does not take images" in body["error"]["message"]
    # One whose replicas said nothing gets the image: its engine answers for itself.
    status, _ = await gw.post("quiet", DATA)
    assert status == 200 and len(gw.quiet.requests) == 1


async def test_an_image_url_is_fetched_for_a_model_that_allows_it(gw: Harness) -> None:
    status, body = await gw.post("eye", gw.picture)
    assert status == 200, body
    (sent,) = gw.eye.requests
    assert sent["messages"][0]["content"][1]["image_url"]["url"] == DATA


async def test_an_image_url_is_refused_for_a_model_that_does_not_allow_it(gw: Harness) -> None:
    status, body = await gw.post("quiet", gw.picture)
    assert status == 400 and body["error"]["code"] == "image_url_not_allowed"
    assert "--allow-image-urls" in body["error"]["message"]
    assert gw.quiet.requests == []
