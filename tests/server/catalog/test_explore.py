"""The model explorer against a hub stand-in answering a trending hundred in the hub
API's shapes (``tests/support/hubstandin.py``), judged against the recorded 64-node GPU
fleet (``tests/support/fleet64.py``) and a CPU node: each verdict is the planner's own
answer over every node, the sizes are the hub's figures, and a hub that stalls or
answers garbage is a clear refusal that is not kept."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from llmgw.modelkit.hublist import repo_from_json
from llmgw.server.catalog.explore import ExploreService
from llmgw.server.catalog.explorejudge import FP8_CAPABILITY, inspection_of
from llmgw.server.catalog.exploresets import Candidate, NotJudged, headline
from llmgw.server.catalog.plan import plan, plan_nodes
from llmgw.server.catalog.scheduler import NodeCapacity
from llmgw.server.fleet.figures import LiveFigures
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.refusal import Refusal
from llmgw.server.requests import ExploreQuery
from llmgw.wire.admin import ExploreJson
from llmgw.wire.messages import EngineInfo
from llmgw.wire.states import NodeState
from tests.support import fleet64
from tests.support.hubstandin import TRENDING, HubStandIn
from tests.support.nodefacts import facts
from tests.support.shapes import check

GIB = 2**30
BY_ID = {r["id"]: r for r in TRENDING}
KINDS = [
    "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
    "unsloth/Llama-3.3-70B-Instruct-GGUF",
    "unsloth/DeepSeek-R1-GGUF",
    "Qwen/Qwen3-8B",
    "google/gemma-3-27b-it",
    "openai/gpt-oss-20b",
    "Qwen/Qwen3-30B-A3B-FP8",
    "Qwen/Qwen2.5-7B-Instruct-AWQ",
    "deepseek-ai/DeepSeek-V3",
    "mlx-community/Qwen3-8B-4bit",
]


def node(
    node_id: str, *, memory: int = 64 * GIB, gpus: list[dict[str, Any]] | None = None
) -> NodeView:
    """A node with llama.cpp, its memory read rate measured (40 GB/s)."""
    return NodeView(
        id=node_id,
        cert_serial=1,
        state=NodeState.READY,
        facts=facts(
            cpu_count=32, memory_total=memory + GIB, memory_available=memory, gpus=gpus or []
        ),
        live=LiveFigures(memory_read_gbs=40.0, memory_read_one_core_gbs=8.0),
        engines=[EngineInfo(name="llama.cpp", path="/x")],
        engines_probed=True,
        installable=["vllm", "sglang"],
    )


def fleet(*extra: NodeView) -> dict[str, NodeView]:
    views = dict(fleet64.views(problems=False))
    views["cpu-1"] = node("cpu-1")
    views.update({v.id: v for v in extra})
    return views


def service(views: Mapping[str, NodeView], url: str, **kw: Any) -> ExploreService:
    def capacities() -> list[NodeCapacity]:
        return [NodeCapacity.from_view(v) for v in views.values()]

    return ExploreService(lambda: views, capacities, lambda: url, environ={}, **kw)


def planner_says(c: Candidate, views: Mapping[str, NodeView]) -> dict[str, Any]:
    """The planner over every node one by one, read as the explorer reads a verdict."""
    nodes = plan_nodes(views, [NodeCapacity.from_view(v) for v in views.values()])
    if c.fp8:
        nodes = [
            n
            for n in nodes
            if any(
                float(g.compute_capability or 0) >= FP8_CAPABILITY
                for g in views[n.id].figures().gpus
            )
        ]
    planned = plan(inspection_of(c), nodes, context=None)
    fitting = [v for v in planned["nodes"] if v["fits"]]
    cards = [len(v["gpu"]["cards"]) for v in fitting if v["where"] == "cards" and v["gpu"]]
    rates = [v["cpu"]["tokens_per_second"] for v in fitting if v["where"] == "cpu"]
    return {
        "fits": bool(fitting),
        "where": ("cards" if cards else "cpu") if fitting else None,
        "cards": min(cards) if cards else None,
        "nodes": len(fitting),
        "tokens_per_second": max((r for r in rates if r is not None), default=None)
        if fitting and not cards
        else None,
    }


async def test_each_verdict_is_the_planners_own_over_every_node() -> None:
    views = fleet()
    async with HubStandIn() as hub:
        found = await service(views, hub.url).explore(ExploreQuery())
    check(ExploreJson, found)
    assert found["listed"] == 100 and len(found["repos"]) == 100
    assert found["judged_by"] == {
        "nodes": 65,
        "largest_card": {
            "node": "nvl-01",
            "name": "NVIDIA GB200",
            "memory": found["judged_by"]["largest_card"]["memory"],  # type: ignore[index]
            "capability": "10.0",
        },
        "best_capability": "10.0",
        "most_ram": {"node": "a-01", "memory": 2 * 1024 * GIB},
    }
    rows = {r["repo"]: r for r in found["repos"]}
    # Each kind (GGUF small and huge, BF16, FP8, AWQ, MXFP4, MLX) against the planner
    # asked node by node.
    for repo_id in KINDS:
        row = rows[repo_id]
        try:
            c = headline(repo_from_json(BY_ID[repo_id]))  # type: ignore[arg-type]
        except NotJudged as exc:
            assert row["verdict"]["reason"] == str(exc) and not row["verdict"]["fits"]
            continue
        said = {k: row["verdict"][k] for k in ("fits", "where", "cards", "nodes")}  # type: ignore[literal-required]
        said["tokens_per_second"] = row["verdict"]["tokens_per_second"]
        assert said == planner_says(c, views), repo_id
    # What that comes to: small GGUF on the CPU node (the GPU nodes have no llama.cpp),
    # safetensors on the cards, DeepSeek-V3's 689 GB of FP8 on four GB200s.
    small = rows["Qwen/Qwen2.5-0.5B-Instruct-GGUF"]["verdict"]
    assert (small["where"], small["node"], small["nodes"]) == ("cpu", "cpu-1", 1)
    assert small["tokens_per_second"] is not None and small["tokens_per_second"] > 10
    assert rows["Qwen/Qwen3-8B"]["verdict"]["cards"] == 1
    assert rows["deepseek-ai/DeepSeek-V3"]["verdict"]["cards"] == 4
    huge = rows["unsloth/DeepSeek-R1-GGUF"]["verdict"]
    assert not huge["fits"] and huge["needs"] and huge["needs"] > 400 * 10**9
    assert huge["best"] is not None and huge["reason"]
    assert "Apple silicon" in (rows["mlx-community/Qwen3-8B-4bit"]["verdict"]["reason"] or "")


def test_sizes_are_the_hubs_figures() -> None:
    def judged(repo_id: str) -> Candidate:
        found = repo_from_json(BY_ID[repo_id])
        assert found is not None
        return headline(found)

    gguf = judged("unsloth/Qwen3-8B-GGUF")
    assert (gguf.name, gguf.source) == ("Q4_K_M", "hf:unsloth/Qwen3-8B-GGUF:Q4_K_M")
    assert gguf.bytes == int(8_190_735_360 * 4.9 / 8)
    assert judged("Qwen/Qwen3-8B").bytes == 2 * 8_190_735_360
    awq = judged("Qwen/Qwen2.5-7B-Instruct-AWQ")
    assert (awq.name, awq.bytes) == ("4-bit AWQ", 4 * 822_083_584 + 2 * 1_089_994_752)
    mxfp4 = judged("openai/gpt-oss-20b")
    assert (mxfp4.name, mxfp4.bytes) == ("4-bit MXFP4", 2 * 1_804_459_584 + 9_555_148_800)
    fp8 = judged("Qwen/Qwen3-30B-A3B-FP8")
    assert fp8.fp8 and fp8.name == "FP8" and not judged("Qwen/Qwen3-8B").fp8
    with pytest.raises(NotJudged, match="neither GGUF nor safetensors"):
        judged("black-forest-labs/FLUX.1-dev")


async def test_fp8_is_judged_only_on_cards_of_capability_8_9() -> None:
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GIB, "memory_used": 0}
    views = {"a100": node("a100", gpus=[{**a100, "compute_capability": "8.0"}] * 2)}
    async with HubStandIn() as hub:
        found = await service(views, hub.url).explore(ExploreQuery(q="Qwen3"))
    rows = {r["repo"]: r["verdict"] for r in found["repos"]}
    assert not rows["Qwen/Qwen3-30B-A3B-FP8"]["fits"]
    assert "compute capability 8.9" in (rows["Qwen/Qwen3-30B-A3B-FP8"]["reason"] or "")
    assert "the best here is 8.0" in (rows["Qwen/Qwen3-30B-A3B-FP8"]["reason"] or "")
    assert rows["Qwen/Qwen3-8B"]["fits"] and rows["Qwen/Qwen3-8B"]["where"] == "cards"


async def test_without_cards_gguf_only_is_asked_and_fits_filters() -> None:
    views = {"cpu-1": node("cpu-1")}
    async with HubStandIn() as hub:
        found = await service(views, hub.url).explore(ExploreQuery(fits=True))
        (asked,) = hub.asked
    assert asked.query["filter"] == "gguf" and found["gguf_only"]
    assert found["listed"] == sum(1 for r in TRENDING if "gguf" in r.get("tags", []))
    assert found["repos"] and all(r["verdict"]["fits"] for r in found["repos"])
    assert all(r["verdict"]["where"] == "cpu" for r in found["repos"])
    assert len(found["repos"]) < found["listed"]  # 70 B and more: not in 64 GiB


async def test_the_hubs_answer_is_kept_for_its_ttl_and_the_verdicts_made_again() -> None:
    now = [1000.0]
    views = fleet()
    async with HubStandIn() as hub, HubStandIn() as other:
        where = [hub.url]
        explorer = ExploreService(
            lambda: views,
            lambda: [NodeCapacity.from_view(v) for v in views.values()],
            lambda: where[0],
            environ={},
            ttl=300,
            clock=lambda: now[0],
        )
        first = await explorer.explore(ExploreQuery(q="qwen"))
        views["cpu-1"] = node("cpu-1", memory=GIB // 4)  # its memory taken meanwhile
        again = await explorer.explore(ExploreQuery(q="qwen"))
        assert len(hub.asked) == 1
        now[0] += 301
        await explorer.explore(ExploreQuery(q="qwen"))
        assert len(hub.asked) == 2
        where[0] = other.url  # the cluster's hf_endpoint set to another hub: asked
        await explorer.explore(ExploreQuery(q="qwen"))
        assert (len(hub.asked), len(other.asked)) == (2, 1)
    small = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
    before = {r["repo"]: r["verdict"]["fits"] for r in first["repos"]}
    after = {r["repo"]: r["verdict"]["fits"] for r in again["repos"]}
    assert before[small] and not after[small]


async def test_a_stalled_hub_is_a_424_in_time_and_not_kept() -> None:
    async with HubStandIn("stall") as hub:
        explorer = service(fleet(), hub.url, timeout=0.5)
        with pytest.raises(Refusal) as refused:
            await explorer.explore(ExploreQuery())
        assert (refused.value.status, refused.value.code) == (424, "hub_timeout")
        assert f"the hub at {hub.url} did not answer within 0.5 s" in refused.value.message
        assert "ctl config set hf_endpoint" in refused.value.message
        hub.mode = "ok"
        found = await explorer.explore(ExploreQuery())
    assert found["listed"] == 100


@pytest.mark.parametrize(("mode", "said"), [("garbage", "not JSON"), ("wrong", "not a list")])
async def test_a_hub_answering_garbage_is_a_424_naming_it(mode: str, said: str) -> None:
    async with HubStandIn(mode) as hub:
        with pytest.raises(Refusal) as refused:
            await service(fleet(), hub.url).explore(ExploreQuery())
    assert refused.value.status == 424 and refused.value.code == "hub_error"
    assert hub.url in refused.value.message and said in refused.value.message


async def test_a_repositorys_sets_are_each_judged() -> None:
    views = fleet()
    async with HubStandIn() as hub:
        explorer = service(views, hub.url)
        found = await explorer.repository("unsloth/DeepSeek-R1-GGUF")
        small = await explorer.repository("Qwen/Qwen2.5-0.5B-Instruct-GGUF")
        with pytest.raises(Refusal) as missing:
            await explorer.repository("no/such")
        with pytest.raises(Refusal) as bad:
            await explorer.repository("../etc")
    assert (missing.value.status, bad.value.status) == (404, 400)
    names = [s["name"] for s in found["sets"]]
    assert names == ["Q2_K", "Q4_K_M", "Q8_0", "F16"]  # smallest first; no mmproj
    q4 = found["sets"][1]
    assert q4["source"] == "hf:unsloth/DeepSeek-R1-GGUF:Q4_K_M" and len(q4["files"]) == 11
    assert not q4["verdict"]["fits"] and q4["verdict"]["best"] is not None
    fits = [s for s in small["sets"] if s["verdict"]["fits"]]
    assert [s["name"] for s in fits] == ["Q2_K", "Q4_K_M", "Q8_0", "F16"]
    assert all(s["verdict"]["node"] == "cpu-1" for s in fits)
