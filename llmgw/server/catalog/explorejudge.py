"""Each file set the explorer shows, judged by the planner serving uses (``plan.py``)
against the nodes as they are now, and what it judged by.

A set becomes the ``Inspection`` the planner takes: its bytes, the parameter count and
trained context the hub read, the format's engine (llama.cpp for GGUF, vLLM for
safetensors). The listing gives no layers or heads, so no KV cache is counted: what a
set needs is its weights and the engine's overhead, as ``ctl model plan`` says of a
shape that does not name them. ``plan`` asks the scheduler, the one judge of fit, for
each node's verdict; where it fits on cards the verdict names the fewest cards a
replica takes, where only on a CPU the planner's tokens a second on the fastest node.

Nodes that are alike (the same cards, free memory, engines, state and memory read
rate) get the same verdict, so the planner is asked once for each kind: the trending
hundred against the 64 nodes of the recorded fleet took 0.6 s, against 12 s asked node by
node. An FP8 set is judged only on nodes with a card of compute
capability 8.9 or more (FP8's tensor cores: Ada and Hopper on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog.exploresets import Candidate
from llmgw.server.catalog.inspector import Inspection, PlanError
from llmgw.server.catalog.plan import NodePlanJson, PlanNode, plan, plan_nodes
from llmgw.server.catalog.scheduler import NodeCapacity
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.admin.explore import (
    BestNodeJson,
    ExploreVerdictJson,
    JudgedByJson,
    JudgedCardJson,
    JudgedRamJson,
)

FP8_CAPABILITY = 8.9


def _capability(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Kind:
    """Nodes alike to the scheduler: one of them is judged for all."""

    node: PlanNode
    members: tuple[str, ...]
    # The highest compute capability of its cards; None: no card says.
    capability: float | None


@dataclass(frozen=True)
class JudgeFleet:
    kinds: tuple[Kind, ...]
    judged_by: JudgedByJson

    @property
    def has_cards(self) -> bool:
        return any(k.node.capacity.cards for k in self.kinds)


def _kind_key(node: PlanNode, capability: float | None) -> str:
    cap = node.capacity
    cards = tuple(
        (c.name, c.memory_total, c.memory_free, c.reserved, c.mig_instance, c.unusable)
        for c in sorted(cap.cards, key=lambda c: c.index)
    )
    same = replace(cap, id="", cards=())
    return repr((same, cards, capability, replace(node, capacity=NodeCapacity(id=""))))


def judge_fleet(views: Mapping[str, NodeView], capacities: Sequence[NodeCapacity]) -> JudgeFleet:
    """The nodes as placement sees them now, in kinds, and what they offer at most."""
    nodes = plan_nodes(views, capacities)
    capability: dict[str, float | None] = {}
    largest: JudgedCardJson | None = None
    best_capability: tuple[float, str] | None = None
    most_ram: JudgedRamJson | None = None
    for node in sorted(nodes, key=lambda n: n.id):
        gpus = views[node.id].figures().gpus
        by_uuid = {g.uuid: g.compute_capability for g in gpus}
        caps = [(c, t) for t in by_uuid.values() if t and (c := _capability(t)) is not None]
        capability[node.id] = max((c for c, _ in caps), default=None)
        if caps:
            top = max(caps)
            if best_capability is None or top[0] > best_capability[0]:
                best_capability = top
        for card in node.capacity.cards:
            if largest is None or card.memory_total > largest["memory"]:
                largest = {
                    "node": node.id,
                    "name": card.name,
                    "memory": card.memory_total,
                    "capability": by_uuid.get(card.uuid),
                }
        ram = node.capacity.memory_total
        if ram and (most_ram is None or ram > most_ram["memory"]):
            most_ram = {"node": node.id, "memory": ram}
    kinds: dict[str, list[PlanNode]] = {}
    for node in sorted(nodes, key=lambda n: n.id):
        kinds.setdefault(_kind_key(node, capability[node.id]), []).append(node)
    return JudgeFleet(
        kinds=tuple(
            Kind(alike[0], tuple(n.id for n in alike), capability[alike[0].id])
            for alike in kinds.values()
        ),
        judged_by={
            "nodes": len(nodes),
            "largest_card": largest,
            "best_capability": best_capability[1] if best_capability else None,
            "most_ram": most_ram,
        },
    )


def _offers(node: PlanNode) -> BestNodeJson:
    known = [c for c in node.capacity.cards if c.memory_total and not c.unusable]
    available = node.memory_available
    if available is not None:
        available = max(0, available - node.capacity.memory_reserved)
    return {
        "node": node.id,
        "cards_free": sum(max(0, c.memory_free - c.reserved) for c in known) if known else None,
        "memory_available": available,
    }


def _room(offer: BestNodeJson) -> int:
    return max(offer["cards_free"] or 0, offer["memory_available"] or 0)


def not_fitting(reason: str, needs: int | None = None) -> ExploreVerdictJson:
    """A verdict of no fit: why (empty while not judged), and the memory it needs."""
    return {
        "fits": False,
        "where": None,
        "cards": None,
        "node": None,
        "nodes": 0,
        "tokens_per_second": None,
        "needs": needs,
        "best": None,
        "reason": reason,
    }


def inspection_of(c: Candidate) -> Inspection:
    """The set as the planner reads a source: its bytes and the hub's figures."""
    shape = ModelShape(
        architecture=c.architecture,
        parameters=c.parameters,
        file_bytes=c.bytes,
        layers=None,
        embedding=None,
        heads=None,
        kv_heads=None,
        head_size=None,
        trained_context=c.trained_context,
        quantisation=c.name,
        name=c.repo,
    )
    return Inspection(c.source or f"hf:{c.repo}", c.format, shape, c.bytes, c.files)


def judge(c: Candidate, fleet: JudgeFleet) -> ExploreVerdictJson:
    """The planner's verdict on ``c``: where it fits with fewest cards or fastest on a
    CPU, else what it needs against the node nearest to holding it."""
    kinds = list(fleet.kinds)
    if c.fp8:
        kinds = [k for k in kinds if k.capability is not None and k.capability >= FP8_CAPABILITY]
        if not kinds:
            top = fleet.judged_by["best_capability"]
            return not_fitting(
                "FP8 weights need a card of compute capability 8.9 or more (Ada, Hopper, "
                f"Blackwell); the best here is {top or 'none'}"
            )
    if not kinds:
        return not_fitting("no node has reported its figures yet")
    try:
        planned = plan(inspection_of(c), [k.node for k in kinds], context=None)
    except PlanError as exc:
        return not_fitting(str(exc))
    members = {k.node.id: k.members for k in kinds}
    by_id = {k.node.id: k.node for k in kinds}
    fitting = [v for v in planned["nodes"] if v["fits"]]
    on_cards = [v for v in fitting if v["where"] == "cards" and v["gpu"] is not None]
    count = sum(len(members[v["node"]]) for v in fitting)
    if on_cards:

        def cards(v: NodePlanJson) -> int:
            return len(v["gpu"]["cards"]) if v["gpu"] is not None else 0

        chosen = min(on_cards, key=lambda v: (cards(v), v["node"]))
        return {
            **not_fitting(""),
            "fits": True,
            "where": "cards",
            "cards": cards(chosen),
            "node": chosen["node"],
            "nodes": count,
            "needs": max(chosen["gpu"]["needed_per_card"] or [0]) if chosen["gpu"] else None,
            "reason": None,
        }
    if fitting:

        def rate(v: NodePlanJson) -> float:
            return v["cpu"]["tokens_per_second"] or -1.0

        chosen = max(fitting, key=lambda v: (rate(v), v["node"]))
        return {
            **not_fitting(""),
            "fits": True,
            "where": "cpu",
            "node": chosen["node"],
            "nodes": count,
            "tokens_per_second": chosen["cpu"]["tokens_per_second"],
            "needs": chosen["cpu"]["needed"],
            "reason": None,
        }
    offers = [_offers(by_id[v["node"]]) for v in planned["nodes"]]
    best = max(offers, key=lambda o: (_room(o), o["node"]))
    reasons = next(v["reasons"] for v in planned["nodes"] if v["node"] == best["node"])
    found = not_fitting("; ".join(reasons) or "it fits on no node", planned["memory"]["total"])
    return {**found, "best": best}
