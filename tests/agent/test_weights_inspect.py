"""``weights.inspect``: the agent reads the shape of a model it holds, and says when not."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.runtime import NodeRuntime, RuntimeOptions
from llmgw.agent.weights.cache import FileRecord, Manifest, prepare_directory, write_manifest
from llmgw.modelkit.sizing import read_gguf_header
from llmgw.modelkit.sources import cache_name
from llmgw.wire.messages import Message, Request, Response
from tests.support.tinymodel import write_tiny_model


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[NodeRuntime]:
    rt = NodeRuntime(
        RuntimeOptions(
            state_dir=tmp_path / "state",
            weights_dir=tmp_path / "weights",
            release_source="unused",
            measure_memory=False,
        )
    )
    try:
        yield rt
    finally:
        await rt.close()


async def ask(rt: NodeRuntime, source: str) -> Response:
    sent: list[Message] = []
    rt.attach(sent.append)
    await rt.handle(Request(id="r1", kind="weights.inspect", args={"source": source}))
    # The one answer (the stream's other reports, SlurmStatus, may come meanwhile).
    (answer,) = [m for m in sent if isinstance(m, Response)]
    assert isinstance(answer, Response) and answer.id == "r1"
    return answer


async def test_local_gguf(runtime: NodeRuntime, tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    answer = await ask(runtime, str(model))
    assert answer.ok
    result: dict[str, Any] = answer.result
    shape = read_gguf_header(model)
    assert result["format"] == "gguf"
    assert result["weight_bytes"] == model.stat().st_size
    assert result["kv_heads"] == shape.kv_heads and result["trained_context"] == 512
    json.dumps(result)


async def test_local_safetensors_directory(runtime: NodeRuntime, tmp_path: Path) -> None:
    model = tmp_path / "st"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512})
    )
    (model / "model.safetensors").write_bytes(b"x" * 1234)
    answer = await ask(runtime, str(model))
    assert answer.ok
    assert answer.result["format"] == "safetensors"
    assert answer.result["weight_bytes"] == 1234 and answer.result["layers"] == 4


async def test_source_in_the_cache(runtime: NodeRuntime, tmp_path: Path) -> None:
    source = "hf:org/repo:Q4_K_M"
    name = cache_name(source)
    directory = runtime.weights.cache_dir / name
    prepare_directory(directory, source)
    model = write_tiny_model(directory / "repo-Q4_K_M.gguf")
    size = model.stat().st_size
    write_manifest(
        directory,
        Manifest(source, name, "repo-Q4_K_M.gguf", [FileRecord("repo-Q4_K_M.gguf", size)]),
    )
    answer = await ask(runtime, "hf:ORG/repo:q4_k_m")
    assert answer.ok and answer.result["weight_bytes"] == size


async def test_not_held_is_refused_with_a_reason(runtime: NodeRuntime, tmp_path: Path) -> None:
    for source in ("hf:org/absent:Q4_K_M", str(tmp_path / "missing.gguf")):
        answer = await ask(runtime, source)
        assert not answer.ok and "not on this node" in (answer.error or "")
    answer = await ask(runtime, "not a source")
    assert not answer.ok and "accepted forms" in (answer.error or "")
