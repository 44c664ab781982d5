"""LoRA adapters at the gateway, in one process in front of fake engines: what a name
means, where it goes, what each engine is sent, /v1/models, keys' allowlists, usage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from llmgw.config import GatewayConfig
from llmgw.server.catalog.model import Adapter, Model, Profile
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.gateway import Gateway, key_hash
from llmgw.server.gateway.adapters import AdapterBook, Asked
from llmgw.server.gateway.router import Endpoint
from llmgw.server.store import ApiKeyRecord, SQLiteStore
from llmgw.wire.messages import AdapterSpec, ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.support.fakeengine import FakeEngine
from tests.support.gatewayserve import served

KEYS = {
    "sk-llmgw-all": (),  # every model and adapter
    "sk-llmgw-base": ("m",),  # the model, none of its adapters
    "sk-llmgw-sql": ("m", "sql"),  # the model and one adapter
    "sk-llmgw-adapter-only": ("chat",),  # one adapter, not its model
}
LLAMA = Model(
    name="m",
    source="hf:a/m:Q4_K_M",
    engine="llama.cpp",
    profiles=(Profile(name="default", engine="llama.cpp", replicas=2),),
    context=4096,
    adapters=(Adapter("sql", "hf:a/sql:sql.gguf", 0.5), Adapter("chat", "hf:a/chat:c.gguf", 2.0)),
)
VLLM = Model(
    name="v",
    source="hf:a/v",
    engine="vllm",
    profiles=(Profile(name="default", engine="vllm", replicas=1),),
    context=4096,
    adapters=(Adapter("vsql", "hf:a/vsql"),),
)


@dataclass
class Harness:
    gateway: Gateway
    # The llama.cpp replica that loaded both adapters, one started before they were
    # added (it said nothing of adapters), and the vLLM replica.
    loaded: FakeEngine
    old: FakeEngine
    vllm: FakeEngine
    url: str
    http: aiohttp.ClientSession
    catalog: Any

    async def post(
        self, model: str, key: str = "sk-llmgw-all", **extra: Any
    ) -> tuple[int, dict[str, Any]]:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
        async with self.http.post(
            self.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as resp:
            text = await resp.text()
            return resp.status, {"stream": text} if extra.get("stream") else json.loads(text)

    async def models(self, key: str) -> dict[str, dict[str, Any]]:
        async with self.http.get(
            self.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}
        ) as resp:
            assert resp.status == 200
            return {m["id"]: m for m in (await resp.json())["data"]}


def status(rid: str, port: int, adapters: list[str] | None) -> ShardStatus:
    said = None if adapters is None else [AdapterSpec(a, f"hf:a/{a}") for a in adapters]
    return ShardStatus(replica_id=rid, state=ShardState.READY, port=port, adapters=said)


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Harness]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    loaded, old, vllm = [await FakeEngine(close_after_stream=False).start() for _ in range(3)]
    view = NodeView(id="a", cert_serial=1, state=NodeState.READY, address="127.0.0.1")
    view.shards = {
        "m.default.00000000": status("m.default.00000000", loaded.port, ["sql", "chat"]),
        "m.default.00000001": status("m.default.00000001", old.port, None),
        "v.default.00000000": status("v.default.00000000", vllm.port, ["vsql"]),
    }
    nodes = SimpleNamespace(nodes={"a": view}, version=1)
    catalog = SimpleNamespace(models={"m": LLAMA, "v": VLLM}, version=1)
    wanted: list[tuple[str, bool]] = []
    gateway = Gateway(
        store,
        nodes,
        catalog,
        b"s" * 32,
        GatewayConfig(start_wait=0.0),
        lambda n, s: wanted.append((n, s)),
    )
    for i, (key, models) in enumerate(KEYS.items()):
        gateway.keys.changed(ApiKeyRecord(f"k{i}", key, key_hash(key), models=models))
    try:
        async with served(gateway) as (url, http):
            yield Harness(gateway, loaded, old, vllm, url, http, catalog)
    finally:
        for engine in (loaded, old, vllm):
            await engine.stop()
        await store.close()


async def test_llama_cpp_is_sent_the_base_and_the_adapters_place_in_its_order(
    gw: Harness,
) -> None:
    for name in ("m:chat", "chat", "m:sql", "sql"):
        status, body = await gw.post(name)
        assert status == 200, body
    # Only the replica that loaded them; each request in its own words.
    assert gw.old.requests == []
    sent = [(r["model"], r["lora"]) for r in gw.loaded.requests]
    assert sent == [
        ("m", [{"id": 1, "scale": 2.0}]),
        ("m", [{"id": 1, "scale": 2.0}]),
        ("m", [{"id": 0, "scale": 0.5}]),
        ("m", [{"id": 0, "scale": 0.5}]),
    ]
    # A stream too, and the model's own name still goes to every replica, untouched.
    status, _ = await gw.post("chat", stream=True)
    assert status == 200 and gw.loaded.requests[-1]["lora"] == [{"id": 1, "scale": 2.0}]
    for _ in range(4):
        status, _ = await gw.post("m")
        assert status == 200
    base = [r for e in (gw.loaded, gw.old) for r in e.requests if "lora" not in r]
    assert len(base) == 4 and {r["model"] for r in base} == {"m"}
    # The older replica still serves the model's own name.
    assert len(gw.gateway.router.endpoints_of("m")) == 2
    # Usage (and the request metrics) are counted under the adapter's own name.
    pending = gw.gateway.usage.pending
    assert pending[("k0", "chat", "m.default.00000000")][0] == 3
    assert pending[("k0", "sql", "m.default.00000000")][0] == 2
    assert sum(v[0] for (_, model, _), v in pending.items() if model == "m") == 4


async def test_vllm_is_sent_the_adapters_name(gw: Harness) -> None:
    for name in ("v:vsql", "vsql"):
        status, body = await gw.post(name)
        assert status == 200, body
    assert [(r["model"], "lora" in r) for r in gw.vllm.requests] == [
        ("vsql", False),
        ("vsql", False),
    ]


async def test_unknown_adapters_and_a_clients_own_lora_are_refused(gw: Harness) -> None:
    for name in ("m:nope", "nope", "v:sql", "m:", ":sql", "m:sql:x"):
        status, body = await gw.post(name)
        assert status == 404, name
        assert body["error"]["code"] == "model_not_found", name
    # No index may reach an adapter past the allowlist: only the gateway sets lora.
    status, body = await gw.post("m", "sk-llmgw-base", lora=[{"id": 0, "scale": 1.0}])
    assert status == 400 and body["error"]["param"] == "lora"
    assert gw.loaded.requests == gw.old.requests == []


async def test_keys_use_an_adapter_only_where_its_own_name_is_allowed(gw: Harness) -> None:
    assert set(await gw.models("sk-llmgw-all")) == {"m", "v", "sql", "chat", "vsql"}
    listed = await gw.models("sk-llmgw-all")
    assert listed["chat"] == {
        "id": "chat",
        "object": "model",
        "created": 0,
        "owned_by": "llmgw",
        "parent": "m",
        "root": "m",
    }
    # Allowed the model alone: none of its adapters, by either name.
    assert set(await gw.models("sk-llmgw-base")) == {"m"}
    for name in ("m:sql", "sql", "m:chat"):
        status, body = await gw.post(name, "sk-llmgw-base")
        assert status == 404 and body["error"]["code"] == "model_not_found", name
    assert (await gw.post("m", "sk-llmgw-base"))[0] == 200
    # Allowed one adapter by name: that one, by either name, and not the other.
    assert set(await gw.models("sk-llmgw-sql")) == {"m", "sql"}
    assert (await gw.post("m:sql", "sk-llmgw-sql"))[0] == 200
    assert (await gw.post("sql", "sk-llmgw-sql"))[0] == 200
    assert (await gw.post("chat", "sk-llmgw-sql"))[0] == 404
    # An adapter allowed without its model: the adapter only.
    assert set(await gw.models("sk-llmgw-adapter-only")) == {"chat"}
    assert (await gw.post("m:chat", "sk-llmgw-adapter-only"))[0] == 200
    assert (await gw.post("m", "sk-llmgw-adapter-only"))[0] == 404


async def test_an_adapter_no_replica_loaded_yet_has_no_replica(gw: Harness) -> None:
    """Added a moment ago: its replicas are still being replaced, and no older one
    answers for it (it would answer as the base model)."""
    more = (*LLAMA.adapters, Adapter("fresh", "hf:a/fresh:f.gguf"))
    gw.catalog.models = {**gw.catalog.models, "m": replace(LLAMA, adapters=more)}
    gw.catalog.version += 1
    status, body = await gw.post("m:fresh")
    assert status == 503 and body["error"]["code"] == "no_replica"
    assert gw.loaded.requests == gw.old.requests == []
    # An on-demand model is wanted for its adapter's request as for its own.
    demanded = replace(LLAMA, adapters=more, on_demand=True)
    gw.catalog.models = {**gw.catalog.models, "m": demanded}
    gw.catalog.version += 1
    book = AdapterBook(gw.catalog)
    wanted: list[tuple[str, bool]] = []
    book.demand_of(lambda n, s: wanted.append((n, s)))("fresh", True)
    assert wanted == [("m", True)]


def test_the_body_each_engine_reads() -> None:
    asked = Asked(LLAMA, LLAMA.adapters[1])
    raw = json.dumps({"model": "chat", "prompt": "x"}).encode()
    llama = Endpoint("m.default.0", "http://x/v1", "k", 0, engine="llama.cpp")
    llama.adapters = ("x", "y", "chat")
    assert json.loads(asked.body_for(llama, raw)) == {
        "model": "m",
        "prompt": "x",
        "lora": [{"id": 2, "scale": 2.0}],
    }
    vllm = Endpoint("m.default.1", "http://y/v1", "k", 0, engine="vllm", adapters=("chat",))
    assert json.loads(asked.body_for(vllm, raw)) == {"model": "chat", "prompt": "x"}
    # Never the base model's answer for an adapter it did not load.
    for missing in (None, ("sql",)):
        with pytest.raises(LookupError):
            asked.body_for(replace(llama, adapters=missing), raw)


def test_a_freed_slot_is_room_for_the_model_and_each_of_its_adapters() -> None:
    """They share the replicas: the queue's lines of each are told a request ended."""
    book = AdapterBook(SimpleNamespace(models={"m": LLAMA, "v": VLLM}, version=1))
    woken: list[str] = []
    released = book.released_to(woken.append)
    released("sql")
    assert woken == ["m", "sql", "chat"]
    woken.clear()
    released("v")
    assert woken == ["v", "vsql"]
    woken.clear()
    released("external-thing")
    assert woken == ["external-thing"]
