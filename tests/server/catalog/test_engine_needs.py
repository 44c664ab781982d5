"""What FreeToken and TensorRT-LLM need of a node, judged where placement judges (and
``ctl explain`` shows): FreeToken passes over a card below compute capability 8.0 or
on a driver before 580, and a host that is not x86-64, saying which; both run on cards
only. FreeToken's replica holds the experts in host memory and the rest on its card.
The catalog keeps a profile's engine variables, refuses one naming what it may not,
and gives vLLM expert parallelism for a mixture of experts on several cards, whatever
chose the cards."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from llmgw.modelkit.sizing import GiB, ModelShape
from llmgw.server.catalog.inspector import Inspection, PlanError
from llmgw.server.catalog.model import (
    CatalogError,
    Model,
    Profile,
    check_model,
    fingerprint,
    shard_spec,
)
from llmgw.server.catalog.plan import plan, plan_nodes
from llmgw.server.catalog.scheduler import NodeCapacity, Request, explain
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.hardware import GPU
from llmgw.wire.messages import EngineInfo
from llmgw.wire.states import NodeState
from tests.support.nodefacts import facts

# A mixture of experts read from its config.json: 60 GiB, 128 experts, 8 a token.
MOE = ModelShape(
    architecture="qwen3_moe",
    parameters=None,
    file_bytes=60 * GiB,
    layers=48,
    embedding=2048,
    heads=32,
    kv_heads=4,
    head_size=128,
    value_head_size=128,
    trained_context=32768,
    experts=128,
    experts_used=8,
    name="Qwen3-30B-A3B",
)
MOE_MODEL = Inspection("hf:Qwen/Qwen3-30B-A3B", "safetensors", MOE, MOE.file_bytes, ("a",))


def card(index: int, compute: str | None = "8.9", driver: str | None = "580.65.06") -> GPU:
    return GPU(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA L40S",
        memory_total=48 * GiB,
        memory_used=0,
        compute_capability=compute,
        driver=driver,
    )


def view(nid: str, gpus: list[GPU], arch: str = "x86_64", memory: int = 256 * GiB) -> NodeView:
    return NodeView(
        id=nid,
        cert_serial=1,
        state=NodeState.READY,
        facts=facts(
            arch=arch, cpu_count=32, memory_total=memory, memory_available=memory, gpus=gpus
        ),
        engines=[EngineInfo(name="llama.cpp", path="/x")],
        engines_probed=True,
        installable=["vllm", "sglang", "freetoken", "tensorrt-llm"],
    )


def verdicts(engine: str, *views: NodeView) -> dict[str, Any]:
    ask = Request(
        model="m",
        profile="default",
        engine=engine,
        source="hf:o/m",
        memory=GiB,
        cards=1,
        card_memory=10 * GiB,
    )
    found = explain(ask, [NodeCapacity.from_view(v) for v in views])
    return {v.node: v for v in found}


def test_freetoken_passes_over_old_cards_drivers_and_hosts_saying_why() -> None:
    found = verdicts(
        "freetoken",
        view("ada", [card(0)]),
        view("turing", [card(0, compute="7.5")]),
        view("olddriver", [card(0, driver="575.57.08")]),
        view("grace", [card(0, compute="9.0")], arch="aarch64"),
        view("unsaid", [card(0, compute=None, driver=None)]),
        view("mixed", [card(0, compute="7.5"), card(1, compute="8.6")]),
    )
    assert found["ada"].ok and found["unsaid"].ok
    assert found["mixed"].ok and found["mixed"].cards == ("GPU-1",)
    turing = " ".join(found["turing"].reasons)
    assert "card 0: compute capability 7.5, freetoken needs 8.0 or more" in turing
    old = " ".join(found["olddriver"].reasons)
    assert "card 0: driver 575.57.08, freetoken needs 580 or later" in old
    assert found["grace"].reasons == (
        "engine: freetoken runs on x86_64 hosts; this one is aarch64",
    )
    # vLLM has no such needs: every node holds it.
    assert all(v.ok for v in verdicts("vllm", view("turing", [card(0, compute="7.5")])).values())


def test_freetoken_holds_the_experts_in_host_memory() -> None:
    nodes = plan_nodes(
        {"ada": view("ada", [card(0)])}, [NodeCapacity.from_view(view("ada", [card(0)]))]
    )
    on_ft = plan(MOE_MODEL, nodes, context=8192, cards=1, engine="freetoken")
    on_vllm = plan(MOE_MODEL, nodes, context=8192, cards=1, engine="vllm")
    # vLLM would need the whole 60 GiB on the card; FreeToken a tenth of it and the KV.
    assert on_vllm["memory"]["weights"] == 60 * GiB
    assert on_ft["memory"]["weights"] == 60 * GiB - int(60 * GiB * 0.9)
    assert on_ft["nodes"][0]["fits"] and not on_vllm["nodes"][0]["fits"]
    assert on_ft["nodes"][0]["where"] == "cards"


def test_cards_only_engines_are_not_planned_on_the_cpu() -> None:
    nodes = plan_nodes({"a": view("a", [])}, [NodeCapacity.from_view(view("a", []))])
    for engine in ("freetoken", "tensorrt-llm"):
        with pytest.raises(PlanError, match=f"{engine} runs on cards only"):
            plan(MOE_MODEL, nodes, context=4096, cards=0, engine=engine)
        found = plan(MOE_MODEL, nodes, context=4096, engine=engine)
        assert not found["nodes"][0]["fits"]
        assert found["nodes"][0]["cpu"]["reason"] == f"{engine} runs on cards only"
    with pytest.raises(PlanError, match="runs a freetoken replica on one node"):
        plan(MOE_MODEL, nodes, context=4096, cards=1, engine="freetoken", nodes_per_replica=2)


def model(engine: str, cards: int, **kw: Any) -> Model:
    profile = Profile(name="default", engine=engine, cards=cards, **kw)
    return Model(
        name="q", source="hf:Qwen/Qwen3-30B-A3B", engine=engine, profiles=(profile,), context=8192
    )


def test_freetoken_profile_memory_and_tensorrt_held_to_kv_heads() -> None:
    kept = check_model(model("freetoken", 1), MOE)
    (p,) = kept.profiles
    assert p.memory == GiB + int(60 * GiB * 0.9)  # the experts, in host memory
    assert p.card_memory < 10 * GiB
    with pytest.raises(CatalogError, match="cannot split the model's 4 KV heads evenly"):
        check_model(model("tensorrt-llm", 3), MOE)
    check_model(model("tensorrt-llm", 8), MOE)  # a multiple of the KV heads


def test_engine_variables_kept_given_to_every_shard_and_refused_naming_the_variable() -> None:
    kept = check_model(model("vllm", 2, env={"NCCL_DEBUG": "INFO"}), MOE)
    spec = shard_spec(kept, kept.profiles[0], "q.default.00000000", 41000, ["GPU-0", "GPU-1"], "k")
    assert spec.env == {"NCCL_DEBUG": "INFO"}
    with pytest.raises(CatalogError, match="profiles.default: LD_PRELOAD is set by llmgw"):
        check_model(model("vllm", 1, env={"LD_PRELOAD": "x.so"}), MOE)
    with pytest.raises(CatalogError, match=r"names a path outside the replica's directory"):
        check_model(model("vllm", 1, env={"NCCL_TOPO_FILE": "/etc/topo.xml"}), MOE)
    # A change of variables is a new replica.
    other = replace(kept.profiles[0], env={"NCCL_DEBUG": "WARN"})
    assert fingerprint(kept, kept.profiles[0]) != fingerprint(kept, other)


def test_vllm_keeps_expert_parallelism_on_a_layout_given_by_hand() -> None:
    kept = check_model(model("vllm", 2, args=("--gpu-memory-utilization", "0.9")), MOE)
    spec = shard_spec(kept, kept.profiles[0], "q.default.00000000", 41000, ["GPU-0", "GPU-1"], "k")
    assert spec.args.count("--enable-expert-parallel") == 1
    one = check_model(model("vllm", 1), MOE)
    spec = shard_spec(one, one.profiles[0], "q.default.00000000", 41000, ["GPU-0"], "k")
    assert "--enable-expert-parallel" not in spec.args
    dense = replace(MOE, experts=None, experts_used=None)
    two = check_model(model("vllm", 2), dense)
    spec = shard_spec(two, two.profiles[0], "q.default.00000000", 41000, ["GPU-0", "GPU-1"], "k")
    assert "--enable-expert-parallel" not in spec.args
