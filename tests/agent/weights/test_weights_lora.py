"""A shard's LoRA adapters fetched with the weights, against a hub on loopback: into the
cache, resolved to what the engine loads, pickles refused as the model's, and what the
shard reports of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from weights_fakehub import FakeHub, Progress, blob

from llmgw.agent.engines import EngineError, adapter
from llmgw.agent.shard import Shard
from llmgw.agent.weights import PickleRefused, WeightStore, cache_name, lora
from llmgw.wire.messages import AdapterSpec, ShardSpec


def spec(
    *adapters: AdapterSpec, allow_pickle: bool = False, engine: str = "llama.cpp"
) -> ShardSpec:
    return ShardSpec(
        replica_id="m.default.00000000",
        engine=engine,
        source="hf:org/m:Q4_K_M",
        port=1,
        key="k",
        fingerprint="f",
        allow_pickle=allow_pickle,
        adapters=list(adapters),
    )


async def test_adapters_are_fetched_into_the_cache_and_resolved(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    sql = hub.add("org/sql-lora", "sql.gguf", blob(5_000, 1))
    hub.add("org/chat-lora", "chat-F16.gguf", blob(4_000, 2))
    hub.add("org/chat-lora", "README.md", b"a LoRA")
    asked = spec(
        AdapterSpec("sql", "hf:org/sql-lora:sql.gguf", 0.5),
        AdapterSpec("chat", "hf:org/chat-lora:F16"),
    )
    lora.check(asked)
    progress = Progress()
    got = await lora.fetch(store, asked, adapter("llama.cpp"), progress)
    first, second = got.adapters
    assert first.path == str(cache / cache_name("hf:org/sql-lora:sql.gguf") / "sql.gguf")
    assert Path(first.path).read_bytes() == sql.content
    assert second.path is not None and second.path.endswith("chat-F16.gguf")
    # Order, names and scales as asked; the rest of the spec as it was.
    assert [(a.name, a.scale) for a in got.adapters] == [("sql", 0.5), ("chat", 1.0)]
    assert (got.source, got.port, got.fingerprint) == (asked.source, asked.port, "f")
    # Reported without paths, sources in the cache's form: the control plane's to match.
    assert lora.reported(got) == [
        AdapterSpec("sql", "hf:org/sql-lora:sql.gguf", 0.5),
        AdapterSpec("chat", "hf:org/chat-lora:F16", 1.0),
    ]
    status = Shard(spec=got).status()
    assert status.adapters == lora.reported(got)
    assert Shard(spec=spec()).status().adapters is None


async def test_a_pickled_adapter_is_refused_unless_the_model_allows_pickles(
    hub: FakeHub, store: WeightStore
) -> None:
    named = spec(AdapterSpec("p", "hf:org/p:adapter_model.bin"))
    with pytest.raises(PickleRefused, match="LoRA adapter p: .*pickle"):
        lora.check(named)
    lora.check(spec(AdapterSpec("p", "hf:org/p:adapter_model.bin"), allow_pickle=True))
    # A repository that turns out to hold only pickles is refused on what was found.
    hub.add("org/peft", "adapter_config.json", b"{}")
    hub.add("org/peft", "adapter_model.bin", blob(1_000, 3))
    whole = spec(AdapterSpec("peft", "hf:org/peft"), engine="vllm")
    lora.check(whole)  # its name says nothing of pickles
    with pytest.raises(PickleRefused):
        await lora.fetch(store, whole, adapter("vllm"), Progress())
    trusting = spec(AdapterSpec("peft", "hf:org/peft"), engine="vllm", allow_pickle=True)
    got = await lora.fetch(store, trusting, adapter("vllm"), Progress())
    assert got.adapters[0].path is not None
    assert (Path(got.adapters[0].path) / "adapter_config.json").is_file()


async def test_a_local_adapter_is_used_where_it_is_if_the_engine_can_load_it(
    store: WeightStore, tmp_path: Path
) -> None:
    folder = tmp_path / "loras"
    folder.mkdir()
    (folder / "a.gguf").write_bytes(b"GGUF")
    asked = spec(AdapterSpec("a", str(folder)))
    got = await lora.fetch(store, asked, adapter("llama.cpp"), Progress())
    assert got.adapters[0].path == str(folder / "a.gguf")
    (folder / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(EngineError, match="one GGUF file"):
        await lora.fetch(store, asked, adapter("llama.cpp"), Progress())
