"""The catalog's service without processes: what `serve` keeps, refuses and audits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw.config import SchedulingConfig
from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog.inspector import PickledWeights
from llmgw.server.catalog.service import ModelService
from llmgw.server.fleet.registry import NodeView
from llmgw.server.refusal import Refusal
from llmgw.server.requests import ServeRequest
from llmgw.server.schema import read
from llmgw.server.store import SQLiteStore

GIB = 1024**3
SHAPE = ModelShape(
    architecture="llama",
    parameters=1_000_000_000,
    file_bytes=2 * GIB,
    layers=16,
    embedding=2048,
    heads=16,
    kv_heads=4,
    head_size=128,
    trained_context=8192,
)


def ready_node(nid: str, memory: int) -> NodeView:
    return NodeView(
        id=nid,
        cert_serial=1,
        state="Ready",
        address="10.0.0.1",
        facts={"cpu_count": 8, "memory_total": memory, "memory_available": memory, "gpus": []},
        last_heartbeat=0.0,
        engines=[{"name": "llama.cpp", "path": "/x"}],
        engines_probed=True,
    )


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ModelService]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()

    async def inspect(source: str, allow_pickle: bool) -> ModelShape:
        if "pickled" in source and not allow_pickle:
            raise PickledWeights(f"{source}: refusing pickled weights (pytorch_model.bin)")
        if "unreadable" in source:
            raise OSError("the hub did not answer")
        return SHAPE

    cp: Any = SimpleNamespace(
        config=SimpleNamespace(scheduling=SchedulingConfig()),
        store=store,
        registry=SimpleNamespace(nodes={"a": ready_node("a", 16 * GIB)}),
        wanted_sources=set,
    )
    try:
        yield ModelService(cp, inspect)
    finally:
        await store.close()


def serve(service: ModelService, body: dict[str, Any]) -> Any:
    """``serve`` as the admin API calls it: the body read into its type first."""
    return service.serve(read(ServeRequest, body), "admin@test")


async def refusal(service: ModelService, body: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(Refusal) as refused:
        await serve(service, body)
    answer: dict[str, Any] = refused.value.as_json()["error"]
    answer["status"] = refused.value.status
    return answer


async def test_serve_keeps_the_model_with_its_figures_and_audits(service: ModelService) -> None:
    model = await serve(service, {"source": "hf:org/repo:Q4_K_M", "replicas": 2})
    assert model.name == "repo-q4_k_m" and model.engine == "llama.cpp"
    # Trained for 8192, and that fits the 16 GiB node beside 2 GiB of weights.
    assert model.context == 8192
    assert model.profiles[0].memory > model.weight_bytes == 2 * GIB
    kept = await service.cp.store.list_models()
    assert [r.name for r in kept] == ["repo-q4_k_m"]
    assert kept[0].spec["profiles"][0]["replicas"] == 2
    audit = await service.cp.store.audit_log()
    assert (audit[0]["actor"], audit[0]["action"]) == ("admin@test", "model.serve")


async def test_pickles_are_refused_even_with_memory_given(service: ModelService) -> None:
    answer = await refusal(
        service, {"source": "hf:org/pickled", "memory": 4 * GIB, "engine": "llama.cpp"}
    )
    assert answer["status"] == 400 and answer["field"] == "source"
    assert "pickle" in answer["message"]
    model = await serve(
        service,
        {
            "source": "hf:org/pickled",
            "memory": 4 * GIB,
            "allow_pickle": True,
            "engine": "llama.cpp",
        },
    )
    assert model.allow_pickle


async def test_an_unreadable_shape_needs_memory(service: ModelService) -> None:
    answer = await refusal(service, {"source": "hf:org/unreadable"})
    assert answer["type"] == "cannot_inspect" and "--memory" in answer["message"]
    assert "the hub did not answer" in answer["message"]
    model = await serve(
        service, {"source": "hf:org/unreadable", "memory": GIB, "engine": "llama.cpp"}
    )
    assert model.profiles[0].memory == GIB and model.context == 4096


async def test_a_second_model_of_the_same_name_and_one_too_big_are_refused(
    service: ModelService,
) -> None:
    await serve(service, {"source": "hf:org/repo:Q4_K_M", "name": "m"})
    answer = await refusal(service, {"source": "hf:org/other:Q4_K_M", "name": "m"})
    assert answer["status"] == 409 and answer["type"] == "exists"
    answer = await refusal(service, {"source": "hf:org/big:Q8_0", "memory": 64 * GIB})
    assert answer["status"] == 409 and answer["type"] == "does_not_fit"
    assert answer["verdicts"][0]["reasons"] == ["memory: needs 64.0 GiB, 16.0 GiB free"]
    assert [r.name for r in await service.cp.store.list_models()] == ["m"]
