"""The model planner: what a replica of a shape needs, and where it would fit.

``plan`` turns a shape (from ``inspector.py``) into memory per replica and per card, and
asks the scheduler, the one judge of fit, for every node's verdict on the replica it
would ask for (``scheduler.explain``: the same judgement ``ctl explain`` shows and
placement acts on). What it adds is its own: which card count to try, the longest context
that fits each node, and the CPU speed from each node's measured memory read rate.
``GET /api/v1/plan`` serves it (``api/plan.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from llmgw.modelkit import enginerules
from llmgw.modelkit.files import shape_to_json
from llmgw.modelkit.sizing import (
    CONTEXT_STEP,
    GiB,
    MemoryEstimate,
    ModelShape,
    Split,
    check_cards_vs_kv_heads,
    cpu_tokens_per_second,
    memory_estimate,
    slow_warning,
)
from llmgw.server.catalog import scheduler
from llmgw.server.catalog.inspector import Inspection, PlanError
from llmgw.server.catalog.model import CARD_HOST_MEMORY, MAX_NODES
from llmgw.server.catalog.scheduler import NodeCapacity, Verdict
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.admin.catalog import SpanJson

# A context to plan for when the model does not say what it was trained on.
FALLBACK_CONTEXT = 4096

log = logging.getLogger("llmgw.planner")

Format = Literal["gguf", "safetensors", "pickle"]
Where = Literal["cards", "cpu"]
# Where the planned context came from: asked, the model's trained context, the default
# for a model that does not say, or the trained one cut to the longest that fits.
ContextBasis = Literal["asked", "trained", "default", "cut to fit"]


class MemoryJson(TypedDict):
    """A replica's memory, bytes: weights, KV cache, overhead, and per card."""

    weights: int
    kv_cache: int
    overhead: int
    total: int
    cards: int
    split: Split
    per_card: list[int]


class PlanCardJson(TypedDict):
    uuid: str
    index: int
    name: str
    free: int
    total: int


class GpuVerdictJson(TypedDict):
    fits: bool
    # The cards it would take, with what each has free.
    cards: list[PlanCardJson]
    needed_per_card: list[int]
    reason: str | None


class CpuVerdictJson(TypedDict):
    fits: bool
    needed: int
    # Host memory free for it; None where the node did not say.
    available: int | None
    reason: str | None
    memory_read_gbs: float | None
    memory_read_one_core_gbs: float | None
    # The reply speed its memory read rate gives; None where it was not measured.
    tokens_per_second: float | None
    warning: str | None
    note: str | None


class NodePlanJson(TypedDict):
    node: str
    state: str
    fits: bool
    where: Where | None
    reasons: list[str]
    max_context: int
    # None when the CPU alone was asked for (no cards).
    gpu: GpuVerdictJson | None
    cpu: CpuVerdictJson


class PlanJson(TypedDict):
    """``GET /api/v1/plan``: what a replica needs, and every node's verdict."""

    source: str
    format: Format
    files: list[str]
    weight_bytes: int
    shape: dict[str, Any]
    kv_bytes_per_token: float | None
    engine: str
    split: Split
    slots: int
    cards: int | None
    cpu_cores: int | None
    context: int
    context_basis: ContextBasis
    trained_context: int | None
    memory: MemoryJson
    memory_cpu: MemoryJson
    fits_on: list[str]
    nodes: list[NodePlanJson]
    warnings: list[str]
    # Nodes one replica spans (``--nodes``); each node's verdict is on its share.
    replica_nodes: int
    # For a replica spanning nodes: every set of nodes it could go to, best first
    # (``ctl explain``'s); None for one node.
    spans: list[SpanJson] | None


@dataclass(frozen=True)
class PlanNode:
    """A node as the planner sees it: placement's figures, which the scheduler judges,
    and what only the planner reads (its state in words, its memory read rates)."""

    capacity: NodeCapacity
    state: str
    reason: str = ""
    memory_available: int | None = None
    memory_read_gbs: float | None = None
    memory_read_one_core_gbs: float | None = None

    @property
    def id(self) -> str:
        return self.capacity.id


def plan_nodes(views: Mapping[str, NodeView], capacities: Iterable[NodeCapacity]) -> list[PlanNode]:
    """Placement's capacities (with what placed replicas hold) beside the views."""
    out = []
    for cap in capacities:
        view = views.get(cap.id)
        if view is None:
            continue
        figures = view.figures()
        out.append(
            PlanNode(
                capacity=cap,
                state=str(view.state),
                reason=view.reason,
                memory_available=figures.memory_available,
                memory_read_gbs=figures.memory_read_gbs,
                memory_read_one_core_gbs=figures.memory_read_one_core_gbs,
            )
        )
    return out


def default_engine(fmt: str) -> str:
    return "llama.cpp" if fmt == "gguf" else "vllm"


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f} GiB"


def _memory_json(m: MemoryEstimate) -> MemoryJson:
    return {
        "weights": m.weights,
        "kv_cache": m.kv_cache,
        "overhead": m.overhead,
        "total": m.total,
        "cards": m.cards,
        "split": m.split,
        "per_card": list(m.per_card),
    }


def _largest_context(fits: Callable[[int], bool], cap: int) -> int:
    """The longest context, in llama.cpp's steps and at most ``cap``, that ``fits``."""
    lo, hi = 0, cap // CONTEXT_STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * CONTEXT_STEP):
            lo = mid
        else:
            hi = mid - 1
    return lo * CONTEXT_STEP


@dataclass(frozen=True)
class _Ask:
    """What was asked, and the replicas it means, built as the catalog builds a
    profile's (``model.check_profile``): the scheduler judges the same request."""

    shape: ModelShape
    source: str
    engine: str
    weight_bytes: int
    slots: int
    cards: int | None  # None: any count, or the CPU; 0: the CPU only
    split: Split
    multi_card: bool
    tensor_split: bool
    cpu_cores: int | None
    # Nodes one replica spans: the model is cut in layers over them, and every figure
    # of a node (its cards, its memory) is its share, as ``model.check_profile`` makes.
    nodes: int = 1
    # The engine keeps the experts in host memory, the rest on its card (FreeToken).
    experts_in_ram: bool = False

    def card_counts(self, available: int) -> list[int]:
        if self.cards is not None:
            return [self.cards] if self.cards >= 1 else []
        top = available if self.multi_card else min(1, available)
        counts = range(1, top + 1)
        if self.tensor_split:
            return [n for n in counts if check_cards_vs_kv_heads(self.shape, n) is None]
        return list(counts)

    def on_cards(self, context: int, n: int) -> MemoryEstimate:
        """The replica on ``n`` cards a node (on every node it spans)."""
        split: Split = self.split if self.nodes == 1 else "layer"
        return memory_estimate(
            self.shape,
            context,
            self.slots,
            cards=n * self.nodes,
            split=split,
            experts_in_ram=self.experts_in_ram,
        )

    def on_cpu(self, context: int) -> MemoryEstimate:
        """The replica on the CPU: one share a node it spans."""
        split: Split = self.split if self.nodes == 1 else "layer"
        return memory_estimate(self.shape, context, self.slots, cards=self.nodes, split=split)

    def cpu_share(self, context: int) -> int:
        """The host memory one node needs for its share on the CPU."""
        found = self.on_cpu(context)
        return found.total if self.nodes == 1 else max(found.per_card)

    def request(self, context: int, cards: int) -> scheduler.Request:
        """The replica the catalog would place for this context on ``cards`` cards."""
        if cards:
            found = self.on_cards(context, cards)
            memory, card_memory = CARD_HOST_MEMORY + found.host_weights, max(found.per_card)
        else:
            memory, card_memory = self.cpu_share(context), 0
        return scheduler.Request(
            model="(plan)",
            profile="(plan)",
            engine=self.engine,
            source=self.source,
            memory=memory,
            disk=self.weight_bytes,
            cpu_cores=float(self.cpu_cores or 0),
            cards=cards,
            card_memory=card_memory,
            nodes=self.nodes,
        )


def _judge(req: scheduler.Request, node: PlanNode) -> Verdict:
    (verdict,) = scheduler.explain(req, [node.capacity])
    return verdict


def _known_cards(node: PlanNode) -> int:
    return sum(1 for c in node.capacity.cards if c.memory_total)


def _node_max_context(ask: _Ask, node: PlanNode, cap: int) -> int:
    """The longest context the scheduler would place on this node, on cards or the CPU."""
    counts = ask.card_counts(_known_cards(node))
    if ask.cards in (None, 0) and enginerules.rules(ask.engine).runs_on_cpu:
        counts = [*counts, 0]
    best = 0
    for n in counts:

        def fits(context: int, n: int = n) -> bool:
            return _judge(ask.request(context, n), node).ok

        best = max(best, _largest_context(fits, cap))
    return best


def _card_json(verdict: Verdict, node: PlanNode) -> list[PlanCardJson]:
    by_uuid = {c.uuid: c for c in node.capacity.cards}
    out: list[PlanCardJson] = []
    for uuid in verdict.cards:
        card = by_uuid[uuid]
        out.append(
            {
                "uuid": card.uuid,
                "index": card.index,
                "name": card.name,
                "free": card.memory_free - card.reserved,
                "total": card.memory_total,
            }
        )
    return out


def _gpu_verdict(ask: _Ask, node: PlanNode, context: int) -> tuple[GpuVerdictJson, list[str]]:
    """The cards' verdict as the plan shows it, and its reasons when it does not fit."""
    out: GpuVerdictJson = {"fits": False, "cards": [], "needed_per_card": [], "reason": None}
    cards = node.capacity.cards
    known = _known_cards(node)
    counts = ask.card_counts(known)
    if not cards:
        why = "no cards"
    elif not known:
        why = "its cards' free memory is not known"
    elif ask.cards is not None and ask.cards > known:
        why = f"{ask.cards} cards asked, it has {known}"
    elif not counts:
        why = "no count of its cards splits the model's KV heads evenly"
    else:
        why = ""
    if why:
        out["reason"] = why
        return out, [why]
    verdict: Verdict | None = None
    for n in counts:
        verdict = _judge(ask.request(context, n), node)
        # A node's own cards: the largest shares when the replica spans nodes.
        needed = sorted(ask.on_cards(context, n).per_card, reverse=True)[:n]
        out["needed_per_card"] = needed
        if verdict.ok:
            out["fits"], out["cards"] = True, _card_json(verdict, node)
            return out, []
    assert verdict is not None
    out["reason"] = "; ".join(verdict.reasons)
    return out, list(verdict.reasons)


def _cpu_verdict(
    ask: _Ask, inspection: Inspection, node: PlanNode, context: int
) -> tuple[CpuVerdictJson, list[str]]:
    """The CPU's verdict as the plan shows it, and its reasons when it does not fit."""
    needed = ask.cpu_share(context)
    reasons: list[str] = []
    if ask.cards is not None and ask.cards > 0:
        reasons = [f"{ask.cards} card(s) asked"]
    elif not enginerules.rules(ask.engine).runs_on_cpu:
        reasons = [f"{ask.engine} runs on cards only"]
    elif node.memory_available is None:
        reasons = ["its available memory is not known"]
    else:
        reasons = list(_judge(ask.request(context, 0), node).reasons)
    rate, one_core = node.memory_read_gbs, node.memory_read_one_core_gbs
    tps: float | None = None
    warning: str | None = None
    note: str | None = None
    if rate is not None and rate > 0:
        one = one_core if one_core is not None and one_core > 0 else None
        tps = round(
            cpu_tokens_per_second(inspection.shape, rate, threads=ask.cpu_cores, one_core_gbs=one),
            2,
        )
        warning = slow_warning(tps)
    else:
        note = "the node has not measured its memory read rate yet"
    available = None
    if node.memory_available is not None:
        available = max(0, node.memory_available - node.capacity.memory_reserved)
    shown: CpuVerdictJson = {
        "fits": not reasons,
        "needed": needed,
        "available": available,
        "reason": "; ".join(reasons) or None,
        "memory_read_gbs": rate,
        "memory_read_one_core_gbs": one_core,
        "tokens_per_second": tps,
        "warning": warning,
        "note": note,
    }
    return shown, reasons


def _reasons(node: PlanNode, ask: _Ask, gpu: list[str] | None, cpu: list[str]) -> list[str]:
    """Why nothing fits: what the node itself refuses (its state, marks, engines,
    labels; the scheduler's words), or else what each of cards and CPU lacks."""
    static = scheduler.static_reasons(node.capacity, ask.request(0, 0))
    if static:  # refused whatever it has free
        return [
            f"{r}: {node.reason}" if r == "node not Ready" and node.reason else r for r in static
        ]
    out = []
    if gpu:
        # "on cards: needs 2 with ...", not "on cards: cards: needs 2 with ...".
        out.append(f"on cards: {'; '.join(r.removeprefix('cards: ') for r in gpu)}")
    if cpu:
        out.append(f"on the CPU: {'; '.join(cpu)}")
    return out


def plan(
    inspection: Inspection,
    nodes: Sequence[PlanNode],
    *,
    context: int | None,
    slots: int = 1,
    cards: int | None = None,
    cpu_cores: int | None = None,
    engine: str | None = None,
    nodes_per_replica: int = 1,
) -> PlanJson:
    """Memory per replica and per card, and each node's verdict with its reasons; for a
    replica spanning ``nodes_per_replica`` nodes, each node's verdict on its share and
    the sets of nodes it could go to."""
    shape = inspection.shape
    if slots < 1:
        raise PlanError(f"slots must be at least 1, not {slots}")
    if cards is not None and cards < 0:
        raise PlanError(f"cards must be 0 (the CPU) or more, not {cards}")
    if cpu_cores is not None and cpu_cores < 1:
        raise PlanError(f"cpu_cores must be at least 1, not {cpu_cores}")
    engine_name = engine or default_engine(inspection.format)
    try:
        rules = enginerules.rules(engine_name)
    except enginerules.RuleError as exc:
        raise PlanError(str(exc)) from None
    if nodes_per_replica > 1 and not rules.spans_nodes:
        raise PlanError(f"llmgw runs a {engine_name} replica on one node; ask for 1 node")
    if cards == 0 and not rules.runs_on_cpu:
        raise PlanError(f"{engine_name} runs on cards only; ask for 1 card or more (--gpus 1)")
    if cards is not None and cards > 1 and not rules.multi_card:
        raise PlanError(
            f"{engine_name} runs on one card; ask for 1 card (--gpus 1), or an engine that "
            "splits a model over cards (vllm, sglang, tensorrt-llm)"
        )
    split: Split = "tensor" if rules.tensor_split else "layer"
    spanning = nodes_per_replica > 1
    if not 1 <= nodes_per_replica <= MAX_NODES:
        raise PlanError(f"nodes must be 1 to {MAX_NODES} per replica, not {nodes_per_replica}")
    if spanning:
        # As ``model.check_profile`` has it: a count of cards a node (1 unless said), and
        # only llama.cpp spans nodes on their CPUs.
        cards = 1 if cards is None else cards
        if cards == 0 and engine_name != "llama.cpp":
            raise PlanError(
                f"{engine_name} spans nodes only on cards: give --gpus 1 or more per node"
            )
    if cards is not None and cards > 1 and rules.tensor_split:
        problem = check_cards_vs_kv_heads(shape, cards)
        if problem is not None:
            raise PlanError(f"{engine_name} splits by tensor: {problem}")
    trained = shape.trained_context
    if context is not None:
        if context < 1:
            raise PlanError(f"context must be at least 1 token, not {context}")
        if trained is not None and context > trained:
            raise PlanError(
                f"context {context} is past the model's trained context of {trained} "
                f"tokens; ask for {trained} or less"
            )
    ask = _Ask(
        shape=shape,
        source=inspection.source,
        engine=engine_name,
        weight_bytes=inspection.weight_bytes or 0,
        slots=slots,
        cards=cards,
        split=split,
        multi_card=rules.multi_card,
        tensor_split=rules.tensor_split,
        cpu_cores=cpu_cores,
        nodes=nodes_per_replica,
        experts_in_ram=rules.experts_in_ram,
    )
    ready = [n for n in nodes if n.capacity.ready and not n.capacity.cordoned]
    warnings: list[str] = []
    basis: ContextBasis
    if context is not None:
        chosen, basis = context, "asked"
    else:
        cap = trained or FALLBACK_CONTEXT
        best = max((_node_max_context(ask, n, cap) for n in ready), default=0)
        if best >= cap or best == 0:
            chosen = cap
            basis = "trained" if trained else "default"
        else:
            chosen, basis = best, "cut to fit"
            warnings.append(
                f"the trained context of {cap} tokens fits on no node; planned with "
                f"{best}, the longest that fits"
            )
        if trained is None:
            warnings.append(f"the model's files do not say its trained context; planned with {cap}")
    n_cards = cards if cards else 1
    verdicts: list[NodePlanJson] = []
    for node in sorted(nodes, key=lambda n: n.id):
        gpu, gpu_reasons = _gpu_verdict(ask, node, chosen) if cards != 0 else (None, None)
        cpu, cpu_reasons = _cpu_verdict(ask, inspection, node, chosen)
        where: Where | None = None
        if gpu is not None and gpu["fits"]:
            where = "cards"
        elif cpu["fits"]:
            where = "cpu"
        reasons: list[str] = []
        if where is None:
            reasons = _reasons(node, ask, gpu_reasons, cpu_reasons)
        verdicts.append(
            {
                "node": node.id,
                "state": node.state,
                "fits": where is not None,
                "where": where,
                "reasons": reasons,
                "max_context": _node_max_context(ask, node, trained or FALLBACK_CONTEXT),
                "gpu": gpu,
                "cpu": cpu,
            }
        )
    fits_on = [v["node"] for v in verdicts if v["fits"]]
    spans: list[SpanJson] | None = None
    if spanning:
        request = ask.request(chosen, n_cards if cards else 0)
        found = scheduler.explain_spans(request, [n.capacity for n in nodes])
        spans = [s.as_json() for s in found]
        placed = found[0] if found and found[0].ok else None
        # A replica spanning nodes fits on a set of them, not on one.
        fits_on = list(placed.chosen) if placed is not None else []
        if placed is None:
            shares = sum(v["fits"] for v in verdicts)
            warnings.append(
                f"no set of {nodes_per_replica} nodes joined by one wire (an NVLink domain, "
                f"an InfiniBand fabric, or Ethernet alone) holds a share each: {shares} "
                "node(s) fit a share (the sets and their reasons above)"
            )
    return {
        "source": inspection.source,
        "format": inspection.format,
        "files": list(inspection.files),
        "weight_bytes": inspection.weight_bytes,
        "shape": shape_to_json(shape),
        "kv_bytes_per_token": shape.kv_bytes_per_token(),
        "engine": engine_name,
        "split": split,
        "slots": slots,
        "cards": cards,
        "cpu_cores": cpu_cores,
        "context": chosen,
        "context_basis": basis,
        "trained_context": trained,
        "memory": _memory_json(ask.on_cards(chosen, n_cards)),
        "memory_cpu": _memory_json(ask.on_cpu(chosen)),
        "fits_on": fits_on,
        "nodes": verdicts,
        "warnings": warnings,
        "replica_nodes": nodes_per_replica,
        "spans": spans,
    }
