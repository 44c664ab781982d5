"""The model planner: what a source is, what a replica of it needs, and where it fits.

``Inspector`` learns a source's shape without fetching its weights: a local path is read
where it is (here, or by a node that has it), a hub repository from its listing and the
first bytes of its GGUF header (HTTP Range), a safetensors repository from its
config.json and the listed sizes. ``plan`` turns a shape and the nodes' latest figures
into memory per replica and per card, a verdict per node with its reasons, and the
CPU speed from each node's measured memory read rate. ``GET /api/v1/plan`` serves it
(``api/plan.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from llmgw import enginerules
from llmgw.hub import HubClient, HubError, HubFile, NetworkError, is_gguf, select_files
from llmgw.modelfiles import (
    NeedMore,
    ShapeError,
    combine_parts,
    gguf_header_length,
    inspect_local,
    shape_from_gguf_prefix,
    shape_from_json,
    shape_to_json,
)
from llmgw.modelplan import (
    CONTEXT_STEP,
    GiB,
    MemoryEstimate,
    ModelShape,
    Split,
    check_cards_vs_kv_heads,
    cpu_tokens_per_second,
    memory_estimate,
    shape_from_config,
    slow_warning,
)
from llmgw.sources import (
    PickleRefused,
    Source,
    SourceError,
    check_named_pickle,
    is_pickled,
    parse_source,
    pickle_refusal,
)

if TYPE_CHECKING:
    from llmgw.server.nodes import NodeRegistry

log = logging.getLogger("llmgw.planner")

Format = Literal["gguf", "safetensors", "pickle"]
AskNode = Callable[[str], Awaitable[dict[str, Any] | None]]

# The first read of a GGUF: most headers (vocabulary included) fit in a few MiB.
HEADER_FIRST_READ = 4 * 1024 * 1024
HEADER_MAX_READ = 512 * 1024 * 1024
CONFIG_MAX_BYTES = 8 * 1024 * 1024
# A context for a model whose files do not name its trained one.
FALLBACK_CONTEXT = 4096
NODE_ASK_TIMEOUT = 30.0


class PlanError(ValueError):
    """A plan that cannot be made as asked; the message says what and the fix."""


class PickledWeights(PlanError):
    """The source holds only Python pickles, and the model did not allow them."""


@dataclass(frozen=True)
class Inspection:
    """What a source is: its normal form, format, shape, bytes of weights and files."""

    source: str
    format: Format
    shape: ModelShape
    weight_bytes: int
    files: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "format": self.format,
            "shape": shape_to_json(self.shape),
            "weight_bytes": self.weight_bytes,
            "files": list(self.files),
        }


def inspection_from_answer(source: str, data: dict[str, Any]) -> Inspection:
    """An Inspection from a node's ``weights.inspect`` answer (or ``inspect_local``)."""
    fmt = data.get("format")
    if fmt not in ("gguf", "safetensors", "pickle"):
        raise PlanError(f"{source}: the node answered an unknown format {fmt!r}")
    try:
        shape = shape_from_json(data)
    except ShapeError as exc:
        raise PlanError(f"{source}: the node's answer is not a shape: {exc}") from None
    files = data.get("files") or []
    return Inspection(
        source=source,
        format=fmt,
        shape=shape,
        weight_bytes=int(data.get("weight_bytes") or shape.file_bytes),
        files=tuple(str(f) for f in files),
    )


class Inspector:
    """Reads sources' shapes, each once: a source's files do not change under its name."""

    def __init__(
        self,
        hub_endpoint: str | None = None,
        hub_token: str | None = None,
        ask_node: AskNode | None = None,
        *,
        environ: dict[str, str] | None = None,
        first_read: int = HEADER_FIRST_READ,
    ) -> None:
        self._hub = HubClient(hub_endpoint, hub_token, environ=environ)
        self._ask_node = ask_node
        self._first_read = first_read
        self._cache: dict[str, Inspection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Bytes of file bodies read so far (headers, configs): tests check it stays small.
        self.bytes_read = 0

    async def close(self) -> None:
        await self._hub.close()

    async def inspect(self, source: str, *, allow_pickle: bool = False) -> Inspection:
        try:
            src = parse_source(source)
            check_named_pickle(src, allow_pickle=allow_pickle)
        except (SourceError, PickleRefused) as exc:
            raise PlanError(str(exc)) from None
        lock = self._locks.setdefault(src.text, asyncio.Lock())
        async with lock:
            found = self._cache.get(src.text)
            if found is None:
                found = await self._inspect(src)
                self._cache[src.text] = found
        if found.format == "pickle" and not allow_pickle:
            raise PickledWeights(str(pickle_refusal(src.text, list(found.files))))
        return found

    async def _inspect(self, src: Source) -> Inspection:
        if src.kind == "local":
            assert src.path is not None
            if src.path.exists():
                try:
                    data = await asyncio.to_thread(inspect_local, src.path, allow_pickle=True)
                except ShapeError as exc:
                    raise PlanError(str(exc)) from None
                return inspection_from_answer(src.text, data)
            return await self._from_nodes(
                src, f"{src.text} is not on the control plane and no connected node holds it"
            )
        try:
            if src.kind == "hf":
                return await self._from_hub(src)
            return await self._from_url(src)
        except NetworkError as exc:
            # A control plane without the internet: a node may hold the files already.
            return await self._from_nodes(src, f"{src.text}: {exc}")
        except (HubError, SourceError, ShapeError) as exc:
            raise PlanError(str(exc)) from None

    async def _from_nodes(self, src: Source, why: str) -> Inspection:
        answer = await self._ask_node(src.text) if self._ask_node is not None else None
        if answer is None:
            raise PlanError(
                f"{why}; give a path that exists on a connected node, or a hub or https "
                "source the control plane can reach"
            )
        return inspection_from_answer(src.text, answer)

    async def _from_hub(self, src: Source) -> Inspection:
        assert src.repo is not None
        listing = await self._hub.list_files(src.repo)
        selection = select_files(src, listing)
        files = selection.files
        ggufs = [f for f in files if is_gguf(f.path)]
        if ggufs:
            shapes = []
            for f in ggufs:
                url = self._hub.resolve_url(src.repo, f.path)
                shapes.append(await self._gguf_shape(url, f.size, repo=src.repo, path=f.path))
            sizes = [s.file_bytes for s in shapes]
            shape = combine_parts(shapes, sizes)
            return Inspection(
                src.text, "gguf", shape, shape.file_bytes, tuple(f.path for f in ggufs)
            )
        weights = [f for f in files if f.path.lower().endswith(".safetensors")]
        fmt: Format = "safetensors"
        if not weights:
            weights = [f for f in files if is_pickled(f.path)]
            fmt = "pickle"
        config = next((f for f in files if f.path == "config.json"), None)
        if config is None:
            raise PlanError(
                f"{src.text}: the repository has no config.json beside its weights, so its "
                "shape is unknown; name a GGUF file (hf:ORG/REPO:QUANT) instead"
            )
        config_json = await self._config(src.repo, config)
        size = sum(f.size or 0 for f in weights)
        if any(f.size is None for f in weights):
            raise PlanError(f"{src.text}: the hub listed weights without sizes")
        shape = shape_from_config(config_json, size)
        return Inspection(src.text, fmt, shape, size, tuple(f.path for f in weights))

    async def _config(self, repo: str, config: HubFile) -> dict[str, Any]:
        url = self._hub.resolve_url(repo, config.path)
        data, _ = await self._hub.read_range(url, 0, CONFIG_MAX_BYTES, repo=repo, path=config.path)
        self.bytes_read += len(data)
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise PlanError(f"hf:{repo}: config.json is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise PlanError(f"hf:{repo}: config.json is not a JSON object")
        return parsed

    async def _from_url(self, src: Source) -> Inspection:
        assert src.url is not None and src.filename is not None
        if not is_gguf(src.filename):
            raise PlanError(
                f"{src.text}: only a .gguf file is planned from a URL (its header says its "
                "shape); use an hf: source or a local directory for other formats"
            )
        shape = await self._gguf_shape(src.url, None)
        return Inspection(src.text, "gguf", shape, shape.file_bytes, (src.filename,))

    async def _gguf_shape(
        self, url: str, size: int | None, *, repo: str | None = None, path: str | None = None
    ) -> ModelShape:
        """Read a GGUF's first bytes, more until the header is whole, and read it."""
        buf = b""
        want = self._first_read
        total = size
        while True:
            data, said = await self._hub.read_range(url, len(buf), want, repo=repo, path=path)
            self.bytes_read += len(data)
            buf += data
            total = total or said
            try:
                length = gguf_header_length(buf)
                break
            except NeedMore as more:
                if not data or (total is not None and len(buf) >= total):
                    raise PlanError(
                        f"{path or url}: the file ends inside its GGUF header"
                    ) from None
                want = max(more.needed, 2 * want)
                if want > HEADER_MAX_READ:
                    raise PlanError(
                        f"{path or url}: the GGUF header runs past {HEADER_MAX_READ} bytes"
                    ) from None
        if total is None:
            raise PlanError(f"{path or url}: the server did not say the file's size")
        return await asyncio.to_thread(shape_from_gguf_prefix, buf[:length], total)


# ------------------------------------------------------------------------------ plan


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


# ---------------------------------------------------------------------------- wiring


def make_inspector(registry: NodeRegistry) -> Inspector:
    """An Inspector whose nodes are asked through their streams (``weights.inspect``)."""

    async def ask_one(node_id: str, source: str) -> dict[str, Any] | None:
        view = registry.nodes.get(node_id)
        if view is None or view.session is None:
            return None
        try:
            async for answer in view.session.ask(
                "weights.inspect", {"source": source}, timeout=NODE_ASK_TIMEOUT
            ):
                if answer.ok and isinstance(answer.result, dict):
                    return {**answer.result, "node": node_id}
                return None
        except (TimeoutError, ConnectionError) as exc:
            log.info("node %s could not inspect %s: %s", node_id, source, exc)
        return None

    async def ask_node(source: str) -> dict[str, Any] | None:
        ids = sorted(i for i, v in registry.nodes.items() if v.session is not None)
        answers = await asyncio.gather(*(ask_one(i, source) for i in ids))
        return next((a for a in answers if a is not None), None)

    return Inspector(ask_node=ask_node)
