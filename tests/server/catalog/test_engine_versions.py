"""The fleet's engine versions in placement: a node lacking the version is refused in
its own words (what installing it is doing), and the catalog neither refuses a model
nor a change while a version installs; a new version restarts its engine's models."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog import model as catalog
from llmgw.server.catalog.placement import GIB, NodeCapacity
from llmgw.server.catalog.reconciler import Track
from llmgw.server.catalog.scheduler import (
    Placement,
    Refusal,
    Request,
    explain,
    place,
    place_many,
    static_reasons,
)
from llmgw.server.catalog.service import ModelService
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal as Refused
from llmgw.server.requests import ExternalRequest, ServeRequest
from llmgw.server.schema import read
from llmgw.server.store import SQLiteStore
from llmgw.wire.messages import EngineInfo
from llmgw.wire.states import NodeState, ShardState
from tests.support import wiring
from tests.support.nodefacts import facts
from tests.support.wiring import ADMIN


def node(nid: str, versions: tuple[str, ...] = (), **kw: Any) -> NodeCapacity:
    base = NodeCapacity(
        id=nid,
        cpu_cores=16,
        memory_total=128 * GIB,
        memory_available=64 * GIB,
        disk_free=500 * GIB,
        engines_installed=frozenset({"llama.cpp"}),
        engine_versions={"llama.cpp": frozenset(versions)} if versions else {},
    )
    return replace(base, **kw)


def req(**kw: Any) -> Request:
    base = Request(
        model="m",
        profile="default",
        engine="llama.cpp",
        source="hf:m",
        memory=4 * GIB,
        engine_version="b6000",
    )
    return replace(base, **kw)


def test_a_node_lacking_the_version_is_refused_in_its_own_words() -> None:
    installing = node(
        "a", ("b5000",), engine_progress={"llama.cpp": "installing: downloading x (12 MB)"}
    )
    assert static_reasons(installing, req()) == [
        "engine: llama.cpp b6000 not on this node: installing: downloading x (12 MB)"
    ]
    failed = node("b", engine_progress={"llama.cpp": "install failed: HTTP 404"})
    assert static_reasons(failed, req()) == [
        "engine: llama.cpp b6000 not on this node: install failed: HTTP 404"
    ]
    # Silent about it: not there yet, said so.
    assert static_reasons(node("c", ("b5000",)), req()) == [
        "engine: llama.cpp b6000 not on this node: not installed yet"
    ]
    # Another engine's progress is not this one's.
    other = node("d", engine_progress={"vllm": "install failed: no uv"})
    assert static_reasons(other, req()) == [
        "engine: llama.cpp b6000 not on this node: not installed yet"
    ]
    result = place(req(), [installing, failed])
    assert isinstance(result, Refusal)
    assert [list(v.reasons) for v in result.verdicts] == [
        ["engine: llama.cpp b6000 not on this node: installing: downloading x (12 MB)"],
        ["engine: llama.cpp b6000 not on this node: install failed: HTTP 404"],
    ]


def test_neither_installed_nor_installable_says_that_not_the_version() -> None:
    bare = node("a", engines_installed=frozenset())
    assert static_reasons(bare, req()) == ["engine: llama.cpp neither installed nor installable"]


def test_a_node_with_the_version_or_its_own_engine_is_accepted() -> None:
    assert static_reasons(node("a", ("b5000", "b6000")), req()) == []
    # Named on purpose on the node: its operator's, whatever version it is.
    configured = node("b", engines_configured=frozenset({"llama.cpp"}))
    assert static_reasons(configured, req()) == []
    result = place(req(), [node("a", ("b5000",)), node("z", ("b6000",))])
    assert isinstance(result, Placement) and result.node == "z"
    result = place(req(), [node("a", ("b5000",)), configured])
    assert isinstance(result, Placement) and result.node == "b"


def test_a_request_asking_no_version_ignores_versions() -> None:
    r = req(engine_version=None)
    assert static_reasons(node("a"), r) == []
    assert static_reasons(node("b", ("b1",), engine_progress={"llama.cpp": "x"}), r) == []
    (verdict,) = explain(r, [node("a", ("b5000",))])
    assert verdict.ok


def test_a_refusal_for_one_version_never_stands_for_another() -> None:
    nodes = [node("old", ("b5000",)), node("new", ("b6000",))]
    results = place_many(
        [
            req(engine_version="b7000"),  # nowhere
            req(engine_version="b6000"),  # the same shape otherwise: must still place
            req(engine_version="b7000", memory=8 * GIB),  # asks more than a refused one
            req(engine_version="b5000", memory=8 * GIB),  # as much, another version
            req(engine_version=None, memory=16 * GIB),
        ],
        nodes,
    )
    assert isinstance(results[0], Refusal)
    assert [v.reasons for v in results[0].verdicts] == [
        ("engine: llama.cpp b7000 not on this node: not installed yet",),
        ("engine: llama.cpp b7000 not on this node: not installed yet",),
    ]
    assert isinstance(results[1], Placement) and results[1].node == "new"
    assert isinstance(results[2], Refusal)
    assert isinstance(results[3], Placement) and results[3].node == "old"
    assert isinstance(results[4], Placement)


def test_from_view_reads_versions_configured_engines_and_progress() -> None:
    view = NodeView(
        id="a",
        cert_serial=1,
        state=NodeState.READY,
        engines=[
            EngineInfo("llama.cpp", "/x", version="b5000", build="cpu", origin="installed"),
            EngineInfo("llama.cpp", "/x", version="b6000", build="cpu"),  # installed by default
            EngineInfo("vllm", "/x", version="0.11.0", build=None, origin="configured"),
            EngineInfo("sglang", "/x", version=None, origin="installed"),
        ],
        engines_probed=True,
        engine_progress={"sglang": "installing: uv"},
    )
    cap = NodeCapacity.from_view(view)
    assert cap.engine_versions == {"llama.cpp": frozenset({"b5000", "b6000"})}
    assert cap.engines_configured == frozenset({"vllm"})
    assert cap.engine_progress == {"sglang": "installing: uv"}
    assert static_reasons(cap, req(engine="vllm", engine_version="0.12.0")) == []
    assert static_reasons(cap, req(engine="sglang", engine_version="0.5.0")) == [
        "engine: sglang 0.5.0 not on this node: installing: uv"
    ]


# --- the catalog ------------------------------------------------------------------------

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


def installing_node(nid: str, memory: int) -> NodeView:
    """A Ready node with llama.cpp b5000 and vLLM 0.10, installing the fleet's b6000."""
    return NodeView(
        id=nid,
        cert_serial=1,
        state=NodeState.READY,
        address="10.0.0.1",
        facts=facts(cpu_count=8, memory_total=memory, memory_available=memory),
        last_heartbeat=0.0,
        engines=[
            EngineInfo("llama.cpp", "/x", version="b5000", build="cpu", origin="installed"),
            EngineInfo("vllm", "/x", version="0.10.0", build="cpu", origin="installed"),
        ],
        engines_probed=True,
        engine_progress={"llama.cpp": "installing: unpacking"},
    )


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ModelService]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()

    async def inspect(source: str, allow_pickle: bool) -> ModelShape:
        return SHAPE

    registry = wiring.registry(store, 1.0, 3)
    registry.nodes["a"] = installing_node("a", 16 * GIB)
    versions = {"llama.cpp": "b6000", "vllm": "0.11.0"}
    svc = wiring.model_service(store, registry, inspect, engine_version=versions.get)
    try:
        yield svc
    finally:
        await store.close()


async def serve(service: ModelService, body: dict[str, Any]) -> catalog.Model:
    return await service.serve(read(ServeRequest, body), ADMIN)


async def test_a_model_is_not_refused_while_its_engine_version_installs(
    service: ModelService,
) -> None:
    model = await serve(service, {"source": "hf:org/repo:Q4_K_M", "context": 4096})
    assert service.find(model.name) == model
    # Placement itself waits for it, and says why.
    (explained,) = service.explain(model)
    assert explained["verdicts"][0]["reasons"] == [
        "engine: llama.cpp b6000 not on this node: installing: unpacking"
    ]
    # What never fits is still refused, for its own reason only.
    with pytest.raises(Refused) as refused:
        await serve(service, {"source": "hf:org/big:Q8_0", "memory": 64 * GIB})
    assert refused.value.as_json()["error"]["type"] == "does_not_fit"
    reasons = refused.value.as_json()["error"]["verdicts"][0]["reasons"]
    assert reasons == ["memory: needs 64.0 GiB, 16.0 GiB free"]


async def test_follow_engine_restarts_only_that_engines_models(service: ModelService) -> None:
    a = await serve(service, {"source": "hf:org/a:Q4_K_M", "context": 4096})
    b = await serve(service, {"source": "hf:org/b:Q4_K_M", "context": 4096, "name": "b"})
    v = await serve(
        service,
        {"source": "hf:org/v", "engine": "vllm", "memory": 2 * GIB, "context": 4096},
    )
    ext = await service.add_external(
        read(
            ExternalRequest,
            {"name": "ext", "base_url": "https://api.example.com/v1", "keys": [{"key": "k"}]},
        ),
        ADMIN,
    )
    assert (a.engine, b.engine, v.engine) == ("llama.cpp", "llama.cpp", "vllm")
    # a runs now: its replica is replaced, and the room beside it is judged without the
    # version (still installing here), or the change would be refused as "no room".
    profile = a.profiles[0]
    running = catalog.fingerprint(a, profile)
    service.reconciler.tracks["r1"] = Track(
        replica_id="r1",
        model=a.name,
        profile=profile.name,
        node="a",
        fingerprint=running,
        state=ShardState.READY,
        moved_at=0.0,
    )
    moved = await service.follow_engine(
        "llama.cpp", "llama.cpp b5000 -> b6000", Principal.system("engines")
    )
    assert sorted(moved) == sorted([a.name, b.name])
    assert service.find(a.name).restart == a.restart + 1
    assert running in service.find(a.name).replaced
    assert service.find(b.name).restart == b.restart + 1
    assert service.find(v.name) == v
    assert service.find(ext.name) == ext
    audit = (await service.store.audit_log())[:2]
    assert {(e["actor"], e["action"], e["target"], e["detail"]) for e in audit} == {
        ("engines", "model.restart", a.name, "llama.cpp b5000 -> b6000"),
        ("engines", "model.restart", b.name, "llama.cpp b5000 -> b6000"),
    }

    assert await service.follow_engine(
        "vllm", "vllm 0.10.0 -> 0.11.0", Principal.system("engines")
    ) == [v.name]
    assert service.find(v.name).restart == v.restart + 1
    assert await service.follow_engine("sglang", "sglang 0.5", Principal.system("engines")) == []


async def test_follow_engine_skips_a_model_whose_change_is_refused(
    service: ModelService,
) -> None:
    small = await serve(
        service, {"source": "hf:org/small:Q4_K_M", "memory": GIB, "context": 1024, "name": "small"}
    )
    big = await serve(
        service, {"source": "hf:org/big:Q8_0", "memory": 12 * GIB, "context": 1024, "name": "big"}
    )
    # The node shrank since: big fits it no more, so it keeps what it runs.
    service.registry.nodes["a"] = installing_node("a", 4 * GIB)
    assert small.engine == big.engine == "llama.cpp"
    moved = await service.follow_engine("llama.cpp", "b6000", Principal.system("engines"))
    assert moved == ["small"]
    assert service.find("small").restart == small.restart + 1
    assert service.find("big") == big
