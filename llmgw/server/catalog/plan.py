"""The model planner: what a replica of a shape needs, and where it fits.

``plan`` turns a shape (from ``inspector.py``) and the nodes' latest figures into memory
per replica and per card, a verdict per node with its reasons, and the CPU speed from each
node's measured memory read rate. ``GET /api/v1/plan`` serves it (``api/plan.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from llmgw.modelkit import enginerules
from llmgw.modelkit.files import (
    shape_to_json,
)
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
from llmgw.server.catalog.inspector import Inspection, PlanError

if TYPE_CHECKING:
    pass

# A context to plan for when the model does not say what it was trained on.
FALLBACK_CONTEXT = 4096

log = logging.getLogger("llmgw.planner")

Format = Literal["gguf", "safetensors", "pickle"]
AskNode = Callable[[str], Awaitable[dict[str, Any] | None]]


def default_engine(fmt: str) -> str:
    return "llama.cpp" if fmt == "gguf" else "vllm"


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f} GiB"


def _memory_json(m: MemoryEstimate) -> dict[str, Any]:
    return {
        "weights": m.weights,
        "kv_cache": m.kv_cache,
        "overhead": m.overhead,
        "total": m.total,
        "cards": m.cards,
        "split": m.split,
        "per_card": list(m.per_card),
    }


def _card_free(gpu: dict[str, Any]) -> int | None:
    total, used = gpu.get("memory_total"), gpu.get("memory_used")
    if isinstance(total, int) and isinstance(used, int):
        return max(0, total - used)
    return None


def _fits_on(needs: tuple[int, ...], frees: list[int]) -> bool:
    # The busiest shard goes on the card with the most room.
    return all(n <= f for n, f in zip(sorted(needs, reverse=True), frees, strict=False)) and len(
        frees
    ) >= len(needs)


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
    shape: ModelShape
    slots: int
    cards: int | None  # None: any count, or the CPU; 0: the CPU only
    split: Split
    multi_card: bool
    tensor_split: bool
    cpu_cores: int | None

    def card_counts(self, available: int) -> list[int]:
        if self.cards is not None:
            return [self.cards] if self.cards >= 1 else []
        top = available if self.multi_card else min(1, available)
        counts = range(1, top + 1)
        if self.tensor_split:
            return [n for n in counts if check_cards_vs_kv_heads(self.shape, n) is None]
        return list(counts)

    def on_cards(self, context: int, n: int) -> MemoryEstimate:
        return memory_estimate(self.shape, context, self.slots, cards=n, split=self.split)

    def on_cpu(self, context: int) -> MemoryEstimate:
        return memory_estimate(self.shape, context, self.slots)


def _card_frees(node: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for gpu in node.get("gpus") or []:
        free = _card_free(gpu)
        if free is not None:
            out.append((free, gpu))
    return sorted(out, key=lambda x: -x[0])


def _node_max_context(ask: _Ask, node: dict[str, Any], cap: int) -> int:
    """The longest context a replica can have on this node, on cards or on the CPU."""
    frees = [f for f, _ in _card_frees(node)]
    best = 0
    for n in ask.card_counts(len(frees)):
        if n > len(frees):
            continue

        def on_cards(context: int, n: int = n) -> bool:
            return _fits_on(ask.on_cards(context, n).per_card, frees[:n])

        best = max(best, _largest_context(on_cards, cap))
    available = node.get("memory_available")
    if ask.cards in (None, 0) and isinstance(available, int):

        def on_cpu(context: int, room: int = available) -> bool:
            return ask.on_cpu(context).total <= room

        best = max(best, _largest_context(on_cpu, cap))
    return best


def _gpu_verdict(ask: _Ask, node: dict[str, Any], context: int) -> dict[str, Any]:
    cards = _card_frees(node)
    gpus = node.get("gpus") or []
    out: dict[str, Any] = {
        "fits": False,
        "cards": [],
        "needed_per_card": [],
        "reason": None,
    }
    if not gpus:
        out["reason"] = "no cards"
        return out
    if not cards:
        out["reason"] = "its cards' free memory is not known"
        return out
    counts = ask.card_counts(len(cards))
    if ask.cards is not None and ask.cards > len(cards):
        out["reason"] = f"{ask.cards} cards asked, it has {len(cards)}"
        return out
    if not counts:
        out["reason"] = "no count of its cards splits the model's KV heads evenly"
        return out
    frees = [f for f, _ in cards]
    tried = ask.on_cards(context, counts[0])
    for n in counts:
        estimate = ask.on_cards(context, n)
        if _fits_on(estimate.per_card, frees[:n]):
            chosen = cards[:n]
            out.update(
                fits=True,
                needed_per_card=sorted(estimate.per_card, reverse=True),
                cards=[
                    {
                        "uuid": g.get("uuid"),
                        "index": g.get("index"),
                        "name": g.get("name"),
                        "free": f,
                        "total": g.get("memory_total"),
                    }
                    for f, g in chosen
                ],
            )
            return out
        tried = estimate
    shown = ", ".join(_gib(f) for f in frees[: max(tried.cards, 1)])
    out["needed_per_card"] = sorted(tried.per_card, reverse=True)
    out["reason"] = (
        f"needs {_gib(max(tried.per_card))} on each of {tried.cards} card(s); "
        f"the most free: {shown}"
    )
    return out


def _cpu_verdict(
    ask: _Ask, inspection: Inspection, node: dict[str, Any], context: int
) -> dict[str, Any]:
    needed = ask.on_cpu(context).total
    available = node.get("memory_available")
    rate = node.get("memory_read_gbs")
    one_core = node.get("memory_read_one_core_gbs")
    reason: str | None = None
    if ask.cards is not None and ask.cards > 0:
        reason = f"{ask.cards} card(s) asked"
    elif not isinstance(available, int):
        reason = "its available memory is not known"
    elif needed > available:
        reason = f"needs {_gib(needed)} of memory, {_gib(available)} available"
    cores = node.get("cpu_count")
    if reason is None and ask.cpu_cores and isinstance(cores, int) and ask.cpu_cores > cores:
        reason = f"{ask.cpu_cores} CPU cores asked, it has {cores}"
    tps: float | None = None
    warning: str | None = None
    note: str | None = None
    if isinstance(rate, int | float) and rate > 0:
        one = one_core if isinstance(one_core, int | float) and one_core > 0 else None
        tps = round(
            cpu_tokens_per_second(
                inspection.shape, float(rate), threads=ask.cpu_cores, one_core_gbs=one
            ),
            2,
        )
        warning = slow_warning(tps)
    else:
        note = "the node has not measured its memory read rate yet"
    return {
        "fits": reason is None,
        "needed": needed,
        "available": available if isinstance(available, int) else None,
        "reason": reason,
        "memory_read_gbs": rate,
        "memory_read_one_core_gbs": one_core,
        "tokens_per_second": tps,
        "warning": warning,
        "note": note,
    }


def plan(
    inspection: Inspection,
    nodes: list[dict[str, Any]],
    *,
    context: int | None,
    slots: int = 1,
    cards: int | None = None,
    cpu_cores: int | None = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """Memory per replica and per card, and each node's verdict with its reasons."""
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
    if cards is not None and cards > 1 and not rules.multi_card:
        raise PlanError(
            f"{engine_name} runs on one card; ask for 1 card (--gpus 1), or an engine that "
            "splits a model over cards (vllm, sglang)"
        )
    split: Split = "tensor" if rules.tensor_split else "layer"
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
        slots=slots,
        cards=cards,
        split=split,
        multi_card=rules.multi_card,
        tensor_split=rules.tensor_split,
        cpu_cores=cpu_cores,
    )
    ready = [
        n
        for n in nodes
        if n.get("state") == "Ready" and n.get("connected", True) and not n.get("cordoned")
    ]
    warnings: list[str] = []
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
    verdicts = []
    for node in sorted(nodes, key=lambda n: str(n.get("id"))):
        gpu = _gpu_verdict(ask, node, chosen) if cards != 0 else None
        cpu = _cpu_verdict(ask, inspection, node, chosen)
        is_ready = node in ready
        where: str | None = None
        reasons: list[str] = []
        if not is_ready:
            state = node.get("state")
            why = node.get("reason")
            if state == "Ready" and node.get("cordoned"):
                reasons.append("node is cordoned: it takes no new replicas")
            elif state == "Ready":
                reasons.append("node is not connected")
            else:
                reasons.append(f"node is {state}" + (f": {why}" if why else ""))
        else:
            if gpu is not None and gpu["fits"]:
                where = "cards"
            elif cpu["fits"]:
                where = "cpu"
            if where is None:
                if gpu is not None:
                    reasons.append(f"on cards: {gpu['reason']}")
                reasons.append(f"on the CPU: {cpu['reason']}")
        verdicts.append(
            {
                "node": node.get("id"),
                "state": node.get("state"),
                "fits": where is not None,
                "where": where,
                "reasons": reasons,
                "max_context": _node_max_context(ask, node, trained or FALLBACK_CONTEXT),
                "gpu": gpu,
                "cpu": cpu,
            }
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
        "fits_on": [v["node"] for v in verdicts if v["fits"]],
        "nodes": verdicts,
        "warnings": warnings,
    }
