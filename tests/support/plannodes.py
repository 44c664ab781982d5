"""Nodes as the planner sees them, built the way the control plane builds them: a
``NodeView`` with its facts, its capacity for placement, and ``plan_nodes``."""

from __future__ import annotations

from llmgw.modelkit.sizing import GiB, ModelShape
from llmgw.server.catalog.inspector import Inspection
from llmgw.server.catalog.plan import PlanNode, plan_nodes
from llmgw.server.catalog.scheduler import NodeCapacity
from llmgw.server.fleet.figures import LiveFigures
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.hardware import GPU
from llmgw.wire.messages import EngineInfo
from llmgw.wire.states import NodeState
from tests.support.nodefacts import facts

# An 8B model read from its GGUF header, as the planner's tests plan it.
SHAPE = ModelShape(
    architecture="llama",
    parameters=8_000_000_000,
    file_bytes=8 * GiB,
    layers=32,
    embedding=4096,
    heads=32,
    kv_heads=8,
    head_size=128,
    value_head_size=128,
    trained_context=8192,
    name="Test-8B",
)
MODEL = Inspection("hf:org/test:Q8_0", "gguf", SHAPE, SHAPE.file_bytes, ("test.gguf",))


def plan_node(
    node_id: str,
    *,
    state: NodeState = NodeState.READY,
    reason: str = "",
    cordoned: bool = False,
    memory_available: int = 64 * GiB,
    gpus: list[GPU] | None = None,
    memory_read_gbs: float | None = None,
    memory_read_one_core_gbs: float | None = None,
) -> PlanNode:
    """A node as the control plane holds it, seen as the planner sees it."""
    view = NodeView(
        id=node_id,
        cert_serial=1,
        state=state,
        reason=reason,
        cordoned=cordoned,
        facts=facts(
            cpu_count=16,
            memory_total=memory_available + GiB,
            memory_available=memory_available,
            gpus=gpus or [],
        ),
        live=LiveFigures(
            memory_read_gbs=memory_read_gbs, memory_read_one_core_gbs=memory_read_one_core_gbs
        ),
        engines=[EngineInfo(name="llama.cpp", path="/x")],
        engines_probed=True,
        installable=["vllm", "sglang"],
    )
    (planned,) = plan_nodes({node_id: view}, [NodeCapacity.from_view(view)])
    return planned
