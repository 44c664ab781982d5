"""The planner: shapes read over HTTP Range and from the hub, plans on synthetic fleets,
and GET /api/v1/plan."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from llmgw.config import SchedulingConfig
from llmgw.modelkit.files import NeedMore, gguf_header_length, shape_from_gguf_prefix
from llmgw.modelkit.sizing import GiB, cpu_tokens_per_second, read_gguf_header
from llmgw.server.api import Gate, build_app
from llmgw.server.api.plan import routes as plan_routes
from llmgw.server.catalog.inspector import Inspector, PickledWeights, PlanError
from llmgw.server.catalog.plan import plan
from llmgw.server.catalog.planner import Planner
from llmgw.server.catalog.room import Room
from llmgw.server.fleet.figures import LiveFigures
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.hardware import GPU
from llmgw.wire.messages import EngineInfo, Heartbeat
from llmgw.wire.states import NodeState
from tests.agent.weights.weights_fakehub import FakeHub, Served, start_hub
from tests.support import wiring
from tests.support.nodefacts import facts
from tests.support.plannodes import MODEL, SHAPE
from tests.support.plannodes import plan_node as node
from tests.support.tinymodel import write_tiny_model

PAD = 8 * 1024 * 1024


@pytest.fixture
async def hub() -> AsyncIterator[FakeHub]:
    fake, runner = await start_hub()
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny.gguf")


@pytest.fixture
def big(tiny: Path, tmp_path: Path) -> bytes:
    """The tiny model with 8 MiB after its tensors: a file much larger than its header."""
    return tiny.read_bytes() + b"\0" * PAD


def served_bytes(hub: FakeHub) -> int:
    return sum(r.sent for r in hub.downloads())


# ------------------------------------------------------------------- header reading


def test_header_length_asks_for_more_then_reads_as_the_whole_file(tiny: Path) -> None:
    data = tiny.read_bytes()
    with pytest.raises(NeedMore) as more:
        gguf_header_length(data[:100])
    assert more.value.needed > 100
    length = gguf_header_length(data)
    assert length < len(data)
    assert shape_from_gguf_prefix(data[:length], len(data)) == read_gguf_header(tiny)


async def test_url_gguf_read_by_ranges_fetches_only_its_header(
    hub: FakeHub, tiny: Path, big: bytes, tmp_path: Path
) -> None:
    hub.urls["big.gguf"] = Served(big)
    local = tmp_path / "big.gguf"
    local.write_bytes(big)
    # A small first read, so the reader has to grow its range to reach the tensor infos.
    inspector = Inspector(environ={}, first_read=1024)
    try:
        found = await inspector.inspect(f"{hub.endpoint}/files/big.gguf")
    finally:
        await inspector.close()
    assert found.format == "gguf"
    assert found.shape == read_gguf_header(local)
    assert found.weight_bytes == len(big)
    ranges = [r.headers.get("Range") for r in hub.downloads("big.gguf")]
    assert len(ranges) > 1 and all(r and r.startswith("bytes=") for r in ranges)
    assert served_bytes(hub) < len(big) // 100
    assert inspector.bytes_read < len(big) // 100


async def test_server_ignoring_range_is_read_only_as_far_as_needed(
    hub: FakeHub, big: bytes
) -> None:
    hub.urls["big.gguf"] = Served(big, ignore_range=True)
    inspector = Inspector(environ={})
    try:
        found = await inspector.inspect(f"{hub.endpoint}/files/big.gguf")
    finally:
        await inspector.close()
    assert found.weight_bytes == len(big)
    assert inspector.bytes_read < len(big) // 2


# ---------------------------------------------------------------------- the hub path


async def test_hub_quantisation_reads_the_chosen_gguf_header(
    hub: FakeHub, big: bytes, tmp_path: Path
) -> None:
    hub.add("org/model-GGUF", "model-Q4_K_M.gguf", big)
    hub.add("org/model-GGUF", "model-Q8_0.gguf", b"not read")
    hub.add("org/model-GGUF", "README.md", b"hi", lfs=False)
    (tmp_path / "m.gguf").write_bytes(big)
    inspector = Inspector(hub.endpoint, environ={}, first_read=64 * 1024)
    try:
        found = await inspector.inspect("hf:org/model-GGUF:q4_k_m")
        again = await inspector.inspect("hf:ORG/model-gguf:Q4_K_M")
    finally:
        await inspector.close()
    assert found.source == "hf:org/model-gguf:Q4_K_M"
    assert found.files == ("model-Q4_K_M.gguf",)
    assert found.shape == read_gguf_header(tmp_path / "m.gguf")
    assert again is found  # cached by the normal form: one listing, one header read
    assert len(hub.listings()) == 1
    assert not hub.downloads("Q8_0")
    assert served_bytes(hub) < len(big) // 10


async def test_a_vision_models_shape_is_its_model_files_not_its_projectors(
    hub: FakeHub, big: bytes, tmp_path: Path
) -> None:
    """The projector rides along for the engine; the model's shape and files are the
    model's own, and the projector's header is never read."""
    hub.add("org/eye-GGUF", "eye-Q4_K_M.gguf", big)
    hub.add("org/eye-GGUF", "mmproj-eye-F16.gguf", b"not a header that reads")
    (tmp_path / "m.gguf").write_bytes(big)
    inspector = Inspector(hub.endpoint, environ={}, first_read=64 * 1024)
    try:
        found = await inspector.inspect("hf:org/eye-GGUF:Q4_K_M")
    finally:
        await inspector.close()
    assert found.files == ("eye-Q4_K_M.gguf",)
    assert found.shape == read_gguf_header(tmp_path / "m.gguf")
    assert not hub.downloads("mmproj")


async def test_hub_safetensors_from_config_and_listed_sizes(hub: FakeHub) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "num_hidden_layers": 12,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    hub.add("org/st", "config.json", json.dumps(config).encode())
    hub.add("org/st", "model-00001-of-00002.safetensors", b"a" * 3000)
    hub.add("org/st", "model-00002-of-00002.safetensors", b"b" * 2000)
    hub.add("org/st", "training_args.bin", b"pickle")
    inspector = Inspector(hub.endpoint, environ={})
    try:
        found = await inspector.inspect("hf:org/st")
    finally:
        await inspector.close()
    assert found.format == "safetensors"
    assert found.weight_bytes == 5000
    assert found.shape.kv_heads == 4 and found.shape.layers == 12
    assert found.shape.trained_context == 4096
    # Only config.json was read; the weights were only listed.
    assert [r.path.rsplit("/", 1)[-1] for r in hub.downloads()] == ["config.json"]


async def test_pickle_only_repository_refused_unless_allowed(hub: FakeHub) -> None:
    hub.add("org/old", "config.json", json.dumps({"num_hidden_layers": 2}).encode())
    hub.add("org/old", "pytorch_model.bin", b"p" * 100)
    inspector = Inspector(hub.endpoint, environ={})
    try:
        with pytest.raises(PickledWeights, match="pickle"):
            await inspector.inspect("hf:org/old")
        found = await inspector.inspect("hf:org/old", allow_pickle=True)
    finally:
        await inspector.close()
    assert found.format == "pickle" and found.weight_bytes == 100


async def test_hub_errors_become_plan_errors(hub: FakeHub) -> None:
    inspector = Inspector(hub.endpoint, environ={})
    try:
        with pytest.raises(PlanError, match="not found"):
            await inspector.inspect("hf:org/missing:Q4_K_M")
        with pytest.raises(PlanError, match="accepted forms"):
            await inspector.inspect("ftp://x/y.gguf")
    finally:
        await inspector.close()


# ----------------------------------------------------------------------- local paths


async def test_local_path_read_here_else_asked_of_nodes(tiny: Path) -> None:
    asked: list[str] = []

    async def ask_node(source: str) -> dict[str, Any] | None:
        asked.append(source)
        if source == "/on/a/node.gguf":
            shape = read_gguf_header(tiny)
            from dataclasses import asdict

            return {**asdict(shape), "weight_bytes": shape.file_bytes, "format": "gguf"}
        return None

    inspector = Inspector(ask_node=ask_node, environ={})
    here = await inspector.inspect(str(tiny))
    assert here.shape == read_gguf_header(tiny) and asked == []
    there = await inspector.inspect("/on/a/node.gguf")
    assert there.shape == here.shape and asked == ["/on/a/node.gguf"]
    with pytest.raises(PlanError, match="no connected node holds it"):
        await inspector.inspect("/nowhere.gguf")
    await inspector.close()


# ------------------------------------------------------------------------------ plan


def card(index: int, total_gib: float, used_gib: float) -> GPU:
    return GPU(
        index=index,
        uuid=f"GPU-{index}",
        name="Card",
        memory_total=int(total_gib * GiB),
        memory_used=int(used_gib * GiB),
    )


FLEET = [
    node("gpu", gpus=[card(0, 24, 1)], memory_read_gbs=60.0, memory_read_one_core_gbs=12.0),
    node("cpu", memory_available=32 * GiB, memory_read_gbs=20.0, memory_read_one_core_gbs=8.0),
    node("small", memory_available=4 * GiB, gpus=[card(0, 8, 6)]),
    node("lost", state=NodeState.NOT_READY, reason="missed 3 heartbeats"),
    node("shut", cordoned=True),
]


def by_node(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["node"]: v for v in result["nodes"]}


def test_plan_places_on_card_cpu_and_says_why_not() -> None:
    result = plan(MODEL, FLEET, context=None)
    json.dumps(result)  # plain JSON all through
    assert result["context"] == 8192 and result["context_basis"] == "trained"
    memory = result["memory"]
    assert memory["weights"] == 8 * GiB
    assert memory["kv_cache"] == 32 * 8 * 256 * 2 * 8192  # layers x kv x (k+v) x f16 x ctx
    assert memory["total"] == sum(memory["per_card"])
    nodes = by_node(result)
    assert nodes["gpu"]["where"] == "cards"
    assert nodes["gpu"]["gpu"]["cards"][0]["uuid"] == "GPU-0"
    assert nodes["cpu"]["where"] == "cpu"
    assert not nodes["small"]["fits"]
    reasons = nodes["small"]["reasons"]
    assert reasons[0].startswith("on cards: needs 1 with 9.9 GiB free each, 0 have it")
    assert reasons[1].startswith("on the CPU: memory: needs 9.") and "4.0 GiB free" in reasons[1]
    # What the node itself refuses is said once, in the scheduler's words.
    assert nodes["lost"]["reasons"] == ["node not Ready: missed 3 heartbeats"]
    assert nodes["shut"]["reasons"] == ["node cordoned"]
    assert result["fits_on"] == ["cpu", "gpu"]


def test_cpu_speed_only_where_the_node_measured() -> None:
    nodes = by_node(plan(MODEL, FLEET, context=4096, cpu_cores=4))
    cpu = nodes["cpu"]["cpu"]
    expected = cpu_tokens_per_second(SHAPE, 20.0, threads=4, one_core_gbs=8.0)
    assert cpu["tokens_per_second"] == pytest.approx(expected, rel=0.01)
    assert cpu["memory_read_gbs"] == 20.0
    assert nodes["small"]["cpu"]["tokens_per_second"] is None
    assert "not measured" in nodes["small"]["cpu"]["note"]
    assert nodes["small"]["cpu"]["warning"] is None


def test_slow_cpu_warns() -> None:
    slow = [node("slow", memory_read_gbs=0.5, memory_read_one_core_gbs=0.5)]
    cpu = by_node(plan(MODEL, slow, context=2048))["slow"]["cpu"]
    assert cpu["tokens_per_second"] < 1
    assert "minutes" in cpu["warning"]


def test_trained_context_cut_to_what_fits() -> None:
    # 8 GiB of weights plus overhead leaves room for part of the 8192 tokens' KV cache.
    fleet = [node("tight", memory_available=int(9.6 * GiB))]
    result = plan(MODEL, fleet, context=None)
    assert result["context_basis"] == "cut to fit"
    assert 0 < result["context"] < 8192 and result["context"] % 256 == 0
    assert by_node(result)["tight"]["where"] == "cpu"
    assert "fits on no node" in result["warnings"][0]


def test_too_big_everywhere_keeps_trained_context_and_gives_reasons() -> None:
    fleet = [
        node("a", memory_available=2 * GiB),
        node("b", gpus=[card(0, 4, 0)], memory_available=GiB),
    ]
    result = plan(MODEL, fleet, context=None)
    assert result["context"] == 8192 and result["fits_on"] == []
    assert all(v["reasons"] for v in result["nodes"])


def test_kv_heads_and_card_counts_refused() -> None:
    with pytest.raises(PlanError, match="KV heads"):
        plan(MODEL, FLEET, context=2048, cards=3, engine="vllm")
    # llama.cpp splits layers, not tensors: any card count, whatever the KV heads.
    assert plan(MODEL, FLEET, context=2048, cards=3, engine="llama.cpp")["cards"] == 3
    with pytest.raises(PlanError, match="trained context of 8192"):
        plan(MODEL, FLEET, context=10_000)
    with pytest.raises(PlanError, match="unknown engine"):
        plan(MODEL, FLEET, context=2048, engine="nope")


def test_tensor_split_over_cards() -> None:
    fleet = [node("two", gpus=[card(0, 8, 0), card(1, 8, 0)], memory_available=GiB)]
    result = plan(MODEL, fleet, context=4096, cards=2, engine="vllm")
    assert result["split"] == "tensor" and len(result["memory"]["per_card"]) == 2
    verdict = by_node(result)["two"]
    assert verdict["where"] == "cards" and len(verdict["gpu"]["cards"]) == 2
    # Asked for cards, the CPU is not a place for it.
    assert verdict["cpu"]["reason"] == "2 card(s) asked"


# A node with one 8 GiB card: the 8B model (8 GiB of weights) fits on no one of them,
# but its layers cut over two nodes do.
SPAN_FLEET = [
    node("a", gpus=[card(0, 8, 0)], memory_available=16 * GiB),
    node("b", gpus=[card(0, 8, 0)], memory_available=16 * GiB),
    node("c", gpus=[card(0, 8, 4)], memory_available=16 * GiB),
    node("cpu", memory_available=64 * GiB),
]


def test_a_replica_spanning_nodes_is_planned_on_each_nodes_share() -> None:
    alone = plan(MODEL, SPAN_FLEET, context=4096, cards=1)
    assert alone["fits_on"] == [] and alone["spans"] is None and alone["replica_nodes"] == 1

    result = plan(MODEL, SPAN_FLEET, context=4096, cards=1, nodes_per_replica=2)
    json.dumps(result)
    assert result["replica_nodes"] == 2
    memory = result["memory"]
    # One card a node, two nodes: the layers cut in two shares, each under 8 GiB.
    assert (memory["cards"], memory["split"], len(memory["per_card"])) == (2, "layer", 2)
    assert memory["total"] == sum(memory["per_card"])  # each card's overhead its own
    share = max(memory["per_card"])
    assert share < 8 * GiB < memory["total"]
    nodes = by_node(result)
    for name in ("a", "b"):
        assert nodes[name]["where"] == "cards", nodes[name]
        assert nodes[name]["gpu"]["needed_per_card"] == [share]
    # c's card has 4 GiB free: less than half the model's 5 GiB a card.
    assert not nodes["c"]["fits"] and nodes["c"]["reasons"][0].startswith("on cards: needs 1")
    assert nodes["cpu"]["cpu"]["reason"] == "1 card(s) asked"
    # The sets it could go to, as placement judges them; it fits on the best one's nodes.
    (span,) = result["spans"]
    assert (span["kind"], span["ok"], span["needed"]) == ("ethernet", True, 2)
    assert sorted(span["fitting"]) == ["a", "b"]
    assert result["fits_on"] == span["chosen"] and sorted(span["chosen"]) == ["a", "b"]
    assert result["warnings"] == []


def test_a_replica_spanning_more_nodes_than_fit_says_so() -> None:
    result = plan(MODEL, SPAN_FLEET, context=4096, nodes_per_replica=3)
    assert result["cards"] == 1  # one card a node unless said
    # A third of the layers (3.6 GiB a card) fits on c's 4 GiB too.
    (span,) = result["spans"]
    assert span["ok"] and sorted(span["chosen"]) == ["a", "b", "c"]
    result = plan(MODEL, SPAN_FLEET, context=4096, nodes_per_replica=4)
    (span,) = result["spans"]
    assert not span["ok"] and span["reason"] == "3 node(s) fit, 4 needed"
    assert result["fits_on"] == []
    assert result["warnings"][-1].startswith("no set of 4 nodes joined by one wire")


def test_a_replica_spanning_nodes_is_refused_as_serve_refuses_it() -> None:
    with pytest.raises(PlanError, match="vllm spans nodes only on cards: give --gpus 1"):
        plan(MODEL, SPAN_FLEET, context=4096, cards=0, engine="vllm", nodes_per_replica=2)
    with pytest.raises(PlanError, match="nodes must be 1 to 64 per replica, not 65"):
        plan(MODEL, SPAN_FLEET, context=4096, nodes_per_replica=65)
    # llama.cpp spans nodes on their CPUs too: each node holds half on the CPU.
    cpus = plan(MODEL, SPAN_FLEET, context=4096, cards=0, nodes_per_replica=2)
    assert len(cpus["memory_cpu"]["per_card"]) == 2
    assert by_node(cpus)["cpu"]["cpu"]["needed"] == max(cpus["memory_cpu"]["per_card"])


# -------------------------------------------------------------------------- nodes


def test_heartbeat_keeps_memory_read_rates() -> None:
    registry = wiring.registry(cast(Any, None))
    registry.nodes["n1"] = NodeView(id="n1", cert_serial=1)
    assert registry.nodes["n1"].as_json()["memory_read_gbs"] is None
    registry.heartbeat("n1", Heartbeat(seq=1, memory_read_gbs=21.5, memory_read_one_core_gbs=9.0))
    registry.heartbeat("n1", Heartbeat(seq=2))  # absent figures keep the last ones
    shown = registry.nodes["n1"].as_json()
    assert shown["memory_read_gbs"] == 21.5 and shown["memory_read_one_core_gbs"] == 9.0


# ------------------------------------------------------------------------ the route


async def test_plan_route(tiny: Path) -> None:
    view = NodeView(id="n1", cert_serial=1, state=NodeState.READY)
    view.facts = facts(memory_available=8 * GiB, cpu_count=4)
    view.live = LiveFigures(memory_read_gbs=10.0, memory_read_one_core_gbs=5.0)
    view.engines, view.engines_probed = [EngineInfo(name="llama.cpp", path="/x")], True
    view.session = cast(Any, object())  # connected
    registry = wiring.registry(cast(Any, None))
    registry.nodes["n1"] = view

    inspector = Inspector(environ={})
    room = Room(wiring.reconciler(), registry, SchedulingConfig())
    gate = Gate("secret".__eq__, lambda: None)
    app = build_app(plan_routes(Planner(inspector, room, registry)), gate, body_timeout=10)
    transport = httpx.ASGITransport(app=app)
    auth = {"authorization": "Bearer secret"}
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
        ok = await client.get("/api/v1/plan", params={"source": str(tiny)}, headers=auth)
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert body["format"] == "gguf" and body["context"] == 512
        assert body["shape"]["kv_heads"] == 2
        (verdict,) = body["nodes"]
        assert verdict["where"] == "cpu" and verdict["cpu"]["tokens_per_second"] > 0
        assert (await client.get("/api/v1/plan", params={"source": str(tiny)})).status_code == 401
        bad = await client.get(
            "/api/v1/plan", params={"source": str(tiny), "context": "lots"}, headers=auth
        )
        assert bad.status_code == 400 and "whole number" in bad.json()["error"]["message"]
        past = await client.get(
            "/api/v1/plan", params={"source": str(tiny), "context": "9999"}, headers=auth
        )
        assert past.status_code == 400 and "trained context" in past.json()["error"]["message"]
        missing = await client.get("/api/v1/plan", headers=auth)
        assert missing.status_code == 400
        # --nodes: one replica over 2 nodes; with one node in the fleet no set fits.
        spread = await client.get(
            "/api/v1/plan", params={"source": str(tiny), "nodes": "2", "gpus": "0"}, headers=auth
        )
        assert spread.status_code == 200, spread.text
        body = spread.json()
        assert body["replica_nodes"] == 2 and body["fits_on"] == []
        assert [s["reason"] for s in body["spans"]] == ["1 node(s) fit, 2 needed"]
        zero = await client.get(
            "/api/v1/plan", params={"source": str(tiny), "nodes": "0"}, headers=auth
        )
        assert zero.status_code == 400 and "nodes" in zero.json()["error"]["message"]
    await inspector.close()
