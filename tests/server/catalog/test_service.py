"""The catalog's service without processes: what `serve` keeps, refuses and audits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog.inspector import Inspection, PickledWeights
from llmgw.server.catalog.plan import plan, plan_nodes
from llmgw.server.catalog.service import ModelService
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.refusal import Refusal
from llmgw.server.requests import ContextRequest, ReplicasRequest, ServeRequest
from llmgw.server.schema import read
from llmgw.server.store import SQLiteStore
from llmgw.wire.hardware import GPU, Disk, HostFacts
from llmgw.wire.messages import EngineInfo
from llmgw.wire.states import NodeState
from tests.support import wiring
from tests.support.nodefacts import facts
from tests.support.wiring import ADMIN

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
        state=NodeState.READY,
        address="10.0.0.1",
        facts=facts(cpu_count=8, memory_total=memory, memory_available=memory),
        last_heartbeat=0.0,
        engines=[EngineInfo(name="llama.cpp", path="/x")],
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

    registry = wiring.registry(store, 1.0, 3)
    registry.nodes["a"] = ready_node("a", 16 * GIB)
    try:
        yield wiring.model_service(store, registry, inspect)
    finally:
        await store.close()


def serve(service: ModelService, body: dict[str, Any]) -> Any:
    """``serve`` as the admin API calls it: the body read into its type first."""
    return service.serve(read(ServeRequest, body), ADMIN)


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
    kept = await service.store.list_models()
    assert [r.name for r in kept] == ["repo-q4_k_m"]
    assert kept[0].spec["profiles"][0]["replicas"] == 2
    audit = await service.store.audit_log()
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


async def test_engine_variables_are_kept_or_refused_naming_the_variable(
    service: ModelService,
) -> None:
    answer = await refusal(
        service, {"source": "hf:org/repo:Q4_K_M", "env": {"LLMGW_STATE_DIR": "/tmp/x"}}
    )
    assert answer["status"] == 400
    assert "LLMGW_STATE_DIR is the agent's own setting" in answer["message"]
    answer = await refusal(service, {"source": "hf:org/repo:Q4_K_M", "env": {"A": "../../etc"}})
    assert answer["status"] == 400 and "A=../../etc names a path outside" in answer["message"]
    model = await serve(service, {"source": "hf:org/repo:Q4_K_M", "env": {"NCCL_DEBUG": "INFO"}})
    assert model.profiles[0].env == {"NCCL_DEBUG": "INFO"}
    kept = await service.store.list_models()
    assert kept[0].spec["profiles"][0]["env"] == {"NCCL_DEBUG": "INFO"}


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
    assert [r.name for r in await service.store.list_models()] == ["m"]


def varied_fleet() -> dict[str, NodeView]:
    """Nodes that each refuse or take a replica for a different reason."""

    def at(nid: str, memory: int, **kw: Any) -> NodeView:
        view = ready_node(nid, memory)
        for key, value in kw.items():
            setattr(view, key, value)
        return view

    card = GPU(index=0, uuid="GPU-0", name="Card", memory_total=24 * GIB)

    def host(memory: int) -> HostFacts:
        shown = ready_node("x", memory).facts
        assert shown is not None
        return shown

    return {
        "big": at("big", 64 * GIB),
        "small": at("small", GIB),
        "gpu": at(
            "gpu",
            8 * GIB,
            facts=replace(host(2 * GIB), gpus=[replace(card, memory_used=GIB)]),
        ),
        "gpu-full": at(
            "gpu-full",
            8 * GIB,
            facts=replace(host(2 * GIB), gpus=[replace(card, uuid="GPU-1", memory_used=23 * GIB)]),
        ),
        "cordoned": at("cordoned", 64 * GIB, cordoned=True),
        "draining": at("draining", 64 * GIB, draining=True),
        "lost": at("lost", 64 * GIB, state=NodeState.NOT_READY, reason="missed 3 heartbeats"),
        "no-engine": at("no-engine", 64 * GIB, engines=[]),
        "full-disk": at(
            "full-disk",
            64 * GIB,
            facts=replace(
                host(64 * GIB), disks=[Disk(path="/", fstype="ext4", total=100 * GIB, free=GIB)]
            ),
        ),
        "for-embeddings": at("for-embeddings", 64 * GIB, labels={"llmgw.role": "embed"}),
    }


@pytest.mark.parametrize("gpus", [0, 1])
async def test_plan_and_explain_agree_node_by_node(service: ModelService, gpus: int) -> None:
    """One judge of fit: `ctl model plan` and `ctl explain` say the same of every node."""
    service.registry.nodes.clear()
    service.registry.nodes.update(varied_fleet())
    model = await serve(
        service, {"source": "hf:org/repo:Q4_K_M", "gpus": gpus, "context": 4096, "slots": 2}
    )
    (explained,) = service.explain(model)
    inspection = Inspection(model.source, "gguf", SHAPE, model.weight_bytes, ("m.gguf",))
    planned = plan(
        inspection,
        plan_nodes(service.registry.nodes, service.room.fleet(at_rest=False)),
        context=model.context,
        slots=model.slots,
        cards=gpus,
        engine=model.engine,
    )
    judged = {v["node"]: v["ok"] for v in explained["verdicts"]}
    assert {v["node"]: v["fits"] for v in planned["nodes"]} == judged
    fits = {n for n, ok in judged.items() if ok}
    assert fits == ({"gpu"} if gpus else {"big"})
    # Where it does not fit, both say why; what the node itself refuses, in one wording.
    reasons = {v["node"]: v["reasons"] for v in explained["verdicts"]}
    for verdict in planned["nodes"]:
        if not verdict["fits"]:
            assert verdict["reasons"] and reasons[verdict["node"]]
    said = {v["node"]: v["reasons"][0] for v in planned["nodes"] if not v["fits"]}
    assert said["cordoned"] == "node cordoned" == reasons["cordoned"][0]
    assert said["lost"] == "node not Ready: missed 3 heartbeats"
    assert said["no-engine"] == reasons["no-engine"][0]
    assert said["for-embeddings"] == reasons["for-embeddings"][0]


async def test_the_operators_changes_are_the_services_own(service: ModelService) -> None:
    """Routes hand typed requests to the service; it refuses, changes and audits."""
    model = await serve(service, {"source": "hf:org/repo:Q4_K_M", "context": 4096})
    with pytest.raises(Refusal, match="give context, slots or max_output"):
        await service.set_context(model, read(ContextRequest, {}), ADMIN)
    # A longest answer past a shorter context is cut to it, unless asked for.
    model = await service.set_context(model, read(ContextRequest, {"max_output": 4096}), ADMIN)
    model = await service.set_context(model, read(ContextRequest, {"context": 2048}), ADMIN)
    assert (model.context, model.max_output) == (2048, 2048)
    model = await service.set_replicas(
        model, read(ReplicasRequest, {"replicas": 3, "profile": "spare"}), ADMIN
    )
    assert [(p.name, p.replicas) for p in model.profiles] == [("default", 1), ("spare", 3)]
    stopped = await service.stop(model, ADMIN)
    assert stopped.stopped and service.find(model.name).stopped
    started = await service.start(stopped, ADMIN)
    assert not started.stopped and started.parked is None
    actions = [a["action"] for a in await service.store.audit_log()][:5]
    assert actions == [
        "model.start",
        "model.stop",
        "model.replicas",
        "model.context",
        "model.context",
    ]
