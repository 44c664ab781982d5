"""LoRA adapters on each engine's command line: llama.cpp loads every adapter at scale
0 in the spec's order, vLLM serves each under its name; what each loads them from; an
engine llmgw gives no adapters refuses a spec with some."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.engines import EngineError, adapter
from llmgw.wire.messages import AdapterSpec, ShardSpec

SQL = AdapterSpec("sql", "hf:org/sql:sql.gguf", 0.5, "/w/sql/sql.gguf")
CHAT = AdapterSpec("chat", "hf:org/chat:c.gguf", 2.0, "/w/chat/c.gguf")


def spec(engine: str, adapters: list[AdapterSpec], **kw: object) -> ShardSpec:
    return ShardSpec(
        replica_id="m.default.00000000",
        engine=engine,
        source="hf:org/m",
        port=8123,
        key="k",
        fingerprint="fp",
        model="m",
        args=["--ctx-size", "4096"],
        adapters=adapters,
        **kw,  # type: ignore[arg-type]
    )


def test_llamacpp_loads_every_adapter_unapplied_in_the_specs_order() -> None:
    argv = adapter("llama.cpp").command(
        "/bin/llama-server", spec("llama.cpp", [SQL, CHAT]), "/w/m.gguf", "0.0.0.0"
    )
    at = argv.index("--lora-scaled")
    # One flag (a repeated one is deprecated), each file at scale 0: a request without
    # `lora` gets none of them, even where --lora-init-without-apply is not honoured.
    assert argv[at : at + 3] == [
        "--lora-scaled",
        "/w/sql/sql.gguf:0,/w/chat/c.gguf:0",
        "--lora-init-without-apply",
    ]
    assert argv[-2:] == ["--ctx-size", "4096"]  # the profile's arguments stay last
    plain = adapter("llama.cpp").command(
        "/bin/llama-server", spec("llama.cpp", []), "/w/m.gguf", "h"
    )
    assert not any("lora" in a for a in plain)


def test_vllm_serves_each_adapter_under_its_name() -> None:
    argv = adapter("vllm").command("/env/bin/vllm", spec("vllm", [SQL, CHAT]), "/w/m", "0.0.0.0")
    at = argv.index("--enable-lora")
    assert argv[at : at + 4] == [
        "--enable-lora",
        "--lora-modules",
        "sql=/w/sql/sql.gguf",
        "chat=/w/chat/c.gguf",
    ]
    assert argv[-2:] == ["--ctx-size", "4096"]
    plain = adapter("vllm").command("/env/bin/vllm", spec("vllm", []), "/w/m", "h")
    assert not any("lora" in a for a in plain)


@pytest.mark.parametrize("engine", ["llama.cpp", "vllm"])
def test_an_adapter_not_fetched_is_never_started(engine: str) -> None:
    unfetched = AdapterSpec("sql", "hf:org/sql:sql.gguf")
    with pytest.raises(EngineError, match="sql .* was not fetched"):
        adapter(engine).command("/bin/x", spec(engine, [unfetched]), "/w/m", "h")


def test_sglang_refuses_a_spec_with_adapters() -> None:
    sglang = adapter("sglang")
    sglang.check(spec("sglang", []))
    with pytest.raises(EngineError, match="not given LoRA adapters"):
        sglang.check(spec("sglang", [SQL]))


def test_what_each_engine_loads_an_adapter_from(tmp_path: Path) -> None:
    llama, vllm = adapter("llama.cpp"), adapter("vllm")
    gguf = tmp_path / "one" / "lora.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    assert llama.lora_path(gguf) == str(gguf)
    assert llama.lora_path(gguf.parent) == str(gguf)  # the one GGUF a repository held
    (gguf.parent / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(EngineError, match="holds 2: name the file"):
        llama.lora_path(gguf.parent)
    odd = tmp_path / "a,b.gguf"
    odd.write_bytes(b"GGUF")
    with pytest.raises(EngineError, match="holds ',' or ':'"):
        llama.lora_path(odd)
    peft = tmp_path / "peft"
    peft.mkdir()
    with pytest.raises(EngineError, match="adapter_config.json"):
        vllm.lora_path(peft)
    (peft / "adapter_config.json").write_text("{}")
    assert vllm.lora_path(peft) == str(peft)
    with pytest.raises(EngineError, match="adapter_config.json"):
        vllm.lora_path(gguf)
