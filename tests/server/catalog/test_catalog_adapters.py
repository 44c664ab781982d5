"""LoRA adapters in the catalog without processes: what is kept, refused and audited,
the namespace they share with the models, and what adding or removing one changes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog import adapters
from llmgw.server.catalog.model import (
    Adapter,
    CatalogError,
    Model,
    Profile,
    check_model,
    fingerprint,
    shard_spec,
)
from llmgw.server.catalog.service import ModelService
from llmgw.server.refusal import Refusal
from llmgw.server.requests import AdapterRequest, ServeRequest
from llmgw.server.schema import read
from llmgw.server.store import SQLiteStore
from llmgw.wire.messages import EngineInfo, ShardSpec, from_map, to_map
from tests.server.catalog.test_service import SHAPE, ready_node
from tests.support import wiring
from tests.support.wiring import ADMIN

GIB = 1024**3


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ModelService]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()

    async def inspect(source: str, allow_pickle: bool) -> ModelShape:
        return SHAPE

    registry = wiring.registry(store, 1.0, 3)
    registry.nodes["a"] = ready_node("a", 64 * GIB)
    try:
        yield wiring.model_service(store, registry, inspect)
    finally:
        await store.close()


async def serve(service: ModelService, name: str, **body: Any) -> Model:
    ask = read(ServeRequest, {"source": f"hf:org/{name}:Q4_K_M", "name": name, **body})
    return await service.serve(ask, ADMIN)


async def add(service: ModelService, model: str, name: str, source: str, **kw: Any) -> Model:
    ask = read(AdapterRequest, {"name": name, "source": source, **kw})
    return await service.add_adapter(service.find(model), ask, ADMIN)


async def refused(service: ModelService, model: str, name: str, source: str) -> Refusal:
    with pytest.raises(Refusal) as caught:
        await add(service, model, name, source)
    return caught.value


async def test_an_adapter_is_kept_with_its_model_and_changes_its_replicas(
    service: ModelService,
) -> None:
    base = await serve(service, "qwen")
    old = fingerprint(base, base.profiles[0])
    changed = await add(service, "qwen", "sql", "hf:org/sql-lora:sql.gguf", scale=0.5)
    assert changed.adapters == (Adapter("sql", "hf:org/sql-lora:sql.gguf", 0.5),)
    new = fingerprint(changed, changed.profiles[0])
    # Every replica restarts with it, one by one, as for any other change.
    assert new != old and old in changed.replaced
    # Kept in the store with the model, and read back the same.
    (record,) = await service.store.list_models()
    assert record.spec["adapters"] == [
        {"name": "sql", "source": "hf:org/sql-lora:sql.gguf", "scale": 0.5}
    ]
    assert Model.from_spec(record.spec) == changed
    # What a node is sent: every adapter, in order, and no path (that is the node's).
    second = await add(service, "qwen", "chat", "https://example.com/chat.gguf")
    spec = shard_spec(second, second.profiles[0], "qwen.default.00000000", 42100, [], "k")
    assert [(a.name, a.source, a.scale, a.path) for a in spec.adapters] == [
        ("sql", "hf:org/sql-lora:sql.gguf", 0.5, None),
        ("chat", "https://example.com/chat.gguf", 1.0, None),
    ]
    assert from_map(ShardSpec, to_map(spec)) == spec
    # Removing one moves the replicas on again; its audit says what changed.
    removed = await service.remove_adapter(service.find("qwen"), "sql", ADMIN)
    assert [a.name for a in removed.adapters] == ["chat"]
    assert fingerprint(second, second.profiles[0]) in removed.replaced
    # Back to no adapter at all: the first fingerprint is wanted again, so it is no
    # longer one to move away from (its new replicas would be replaced without end).
    bare = await service.remove_adapter(service.find("qwen"), "chat", ADMIN)
    assert fingerprint(bare, bare.profiles[0]) == old
    assert old not in bare.replaced and new in bare.replaced
    actions = [(e["action"], e["detail"]) for e in await service.store.audit_log()]
    assert ("model.adapter.add", "sql from hf:org/sql-lora:sql.gguf, scale 0.5") in actions
    assert ("model.adapter.remove", "sql") in actions


async def test_adapter_names_share_the_model_namespace(service: ModelService) -> None:
    await serve(service, "qwen")
    await serve(service, "llama")
    await add(service, "qwen", "sql", "hf:org/sql-lora:sql.gguf")
    for model, name in (("qwen", "llama"), ("qwen", "qwen"), ("qwen", "sql"), ("llama", "sql")):
        refusal = await refused(service, model, name, "hf:org/x:x.gguf")
        assert refusal.status == 409 and refusal.field == "name", (model, name)
    said = (await refused(service, "llama", "sql", "hf:org/x:x.gguf")).message
    assert "already the name of an adapter of qwen" in said
    said = (await refused(service, "qwen", "llama", "hf:org/x:x.gguf")).message
    assert "a model's name" in said
    # Nor may a new model take an adapter's name, served or external.
    with pytest.raises(Refusal) as caught:
        await serve(service, "sql")
    assert caught.value.status == 409 and "an adapter of qwen" in caught.value.message
    assert [m.name for m in (await service.store.list_models())] == ["llama", "qwen"]
    # A name is found as MODEL:ADAPTER or as the adapter's own; nothing else is one.
    models = service.models
    found = adapters.find(models, "qwen:sql")
    assert found is not None and found[0].name == "qwen" and found[1].name == "sql"
    assert adapters.find(models, "sql") == found
    assert adapters.find(models, "llama:sql") is None
    assert adapters.find(models, "qwen") is None and adapters.find(models, "qwen:") is None
    assert adapters.request_names(models) == ["llama", "qwen", "qwen:sql", "sql"]


async def test_sources_pickles_and_engines_are_judged_as_the_models(
    service: ModelService,
) -> None:
    await serve(service, "qwen")
    bad = await refused(service, "qwen", "p", "hf:org/lora:adapter_model.bin")
    assert bad.status == 400 and bad.field == "source" and "pickle" in bad.message
    assert "adapter p" in bad.message
    bad = await refused(service, "qwen", "q", "ftp://example.com/x.gguf")
    assert bad.status == 400 and bad.field == "source"
    # A model that allows pickles allows them in its adapters.
    await serve(service, "trusting", allow_pickle=True)
    allowed = await add(service, "trusting", "p", "hf:org/lora:adapter_model.bin")
    assert allowed.adapters[0].source == "hf:org/lora:adapter_model.bin"
    # SGLang is given no adapters; nor is an external provider.
    service.registry.nodes["a"].engines.append(EngineInfo(name="sglang", path="/s"))
    await serve(service, "fast", engine="sglang")
    bad = await refused(service, "fast", "f", "hf:org/lora")
    assert bad.status == 400 and "sglang" in bad.message
    with pytest.raises(Refusal) as caught:
        await service.add_adapter(
            replace(service.find("qwen"), external={"base_url": "https://x"}),
            read(AdapterRequest, {"name": "e", "source": "hf:org/e:e.gguf"}),
            ADMIN,
        )
    assert caught.value.status == 400
    with pytest.raises(Refusal) as caught:
        await service.remove_adapter(service.find("qwen"), "nope", ADMIN)
    assert caught.value.status == 404


def test_check_model_refuses_what_no_engine_could_load() -> None:
    model = Model(
        name="m",
        source="hf:org/m:Q4_K_M",
        engine="vllm",
        profiles=(Profile("default", "vllm", cards=1, nodes=2),),
        context=4096,
        adapters=(Adapter("a", "hf:org/a"),),
    )
    with pytest.raises(CatalogError) as caught:
        check_model(model, SHAPE)
    assert caught.value.field == "adapters" and "spans 2 nodes" in str(caught.value)
    twice = replace(
        model,
        profiles=(Profile("default", "vllm", cards=1),),
        adapters=(Adapter("a", "hf:org/a"), Adapter("a", "hf:org/b")),
    )
    with pytest.raises(CatalogError, match="already a name of m"):
        check_model(twice, SHAPE)
    for scale in (float("nan"), 101.0):
        with pytest.raises(CatalogError, match="scale"):
            check_model(replace(twice, adapters=(Adapter("a", "hf:org/a", scale),)), SHAPE)
    kept = check_model(replace(twice, adapters=(Adapter("a", "hf:Org/A"),)), SHAPE)
    assert kept.adapters == (Adapter("a", "hf:org/a"),)  # in normal form


def test_a_model_without_adapters_keeps_its_fingerprint() -> None:
    """Replicas started before adapters existed are not restarted by the upgrade."""
    model = Model("m", "hf:org/m:Q4_K_M", "llama.cpp", (Profile("default", "llama.cpp"),), 4096)
    # The print of such a model before adapters came in.
    assert fingerprint(model, model.profiles[0]) == "170847f7959264e1"
    assert shard_spec(model, model.profiles[0], "r", 1, [], "k").adapters == []
