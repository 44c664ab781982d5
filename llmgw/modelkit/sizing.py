"""The model planner's arithmetic: a model's shape, the memory a replica needs, CPU speed.

Pure computation shared by every role: a GGUF header (read with the ``gguf`` package,
memory-mapped, never touching tensor data) or a safetensors ``config.json`` becomes a
:class:`ModelShape`; from a shape come the memory a replica needs per card, the longest
context that fits in some free memory, whether a card count splits the KV heads, and how
fast a reply runs on CPUs. No network, no store, no engine: callers bring the figures.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import gguf

GiB = 1024**3
MiB = 1024**2

# Runtime overhead beside weights and KV cache. The spec gives no figure, so these come
# from llama.cpp's own behaviour: a CUDA context plus compute buffers is a few hundred
# MiB whatever the model (512 MiB keeps a tiny model honest), and the compute buffers
# and scratch grow with the model; 5% of weights + KV covers the PoC's largest
# (a 14B at 8 GiB needs ~400 MiB of compute buffer). Charged per card, since each card
# holds its own context and buffers.
OVERHEAD_FIXED_BYTES = 512 * MiB
OVERHEAD_FRACTION = 0.05

# CPU speed, calibrated on the PoC against llama.cpp's predicted_per_second (spec):
# seconds per token = bytes read / (0.68 x usable rate) + 5 ms.
CPU_EFFICIENCY = 0.68
CPU_TOKEN_FIXED_S = 0.005
# A reply slower than this is worth a warning: the user waits minutes.
SLOW_REPLY_S = 60.0

# llama.cpp rounds its KV cache to 256 cells; a context is offered in those steps.
CONTEXT_STEP = 256

Split = Literal["layer", "tensor"]

# Expert feed-forward tensors in llama.cpp's naming (blk.N.ffn_gate_exps.weight, ...):
# only experts_used of experts_total are read for a token.
_EXPERT_TENSOR = re.compile(r"\.ffn_[a-z_]*exps\b")
# "Qwen3-30B-A3B": 30 B total, 3 B active.
_ACTIVE_NAME = re.compile(r"(\d+(?:\.\d+)?)B-A(\d+(?:\.\d+)?)B", re.IGNORECASE)


@dataclass(frozen=True)
class ModelShape:
    """What the planner knows of a model; a figure not known is None, never 0."""

    architecture: str | None
    parameters: int | None
    file_bytes: int
    layers: int | None
    embedding: int | None
    heads: int | None
    kv_heads: int | None
    head_size: int | None
    value_head_size: int | None = None
    trained_context: int | None = None
    experts: int | None = None
    experts_used: int | None = None
    quantisation: str | None = None
    kv_cache_type: str = "f16"
    # Sum of KV heads over layers when they differ per layer (a GGUF array).
    kv_heads_total: int | None = None
    # Bytes of expert tensors, when the GGUF names them (ffn_*_exps).
    expert_bytes: int | None = None
    name: str | None = None

    @property
    def is_moe(self) -> bool:
        return (self.experts or 0) > 1 and (self.experts_used or 0) > 0

    def kv_bytes_per_token(self, kv_bytes_per_element: float = 2) -> float | None:
        """K and V for one token across every layer; None when the shape cannot say."""
        if self.head_size is None:
            return None
        total_heads = self.kv_heads_total
        if total_heads is None:
            if self.layers is None or self.kv_heads is None:
                return None
            total_heads = self.layers * self.kv_heads
        v_size = self.value_head_size if self.value_head_size is not None else self.head_size
        return total_heads * (self.head_size + v_size) * kv_bytes_per_element


# ---------------------------------------------------------------------------- GGUF


def _field(reader: gguf.GGUFReader, key: str) -> object:
    field = reader.get_field(key)
    if field is None:
        return None
    return field.contents()


def _positive_int(value: object) -> int | None:
    """An int > 0 from a scalar, or None: 0 in a header means 'not set'."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value > 0 else None


def _per_layer(value: object) -> tuple[int | None, int | None]:
    """(largest, sum) of a per-layer figure that may be a scalar or an array per layer."""
    if isinstance(value, list):
        ints = [int(v) for v in value if isinstance(v, int | float)]
        if not ints:
            return None, None
        return (max(ints) or None), sum(ints)
    scalar = _positive_int(value)
    return scalar, None


def _quantisation(file_type: object) -> str | None:
    if not isinstance(file_type, int):
        return None
    try:
        from gguf import LlamaFileType

        name = LlamaFileType(file_type).name
    except ValueError:
        return None
    # MOSTLY_Q4_K_M -> Q4_K_M, ALL_F32 -> F32: the names users see on file names.
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def read_gguf_header(path: str | os.PathLike[str]) -> ModelShape:
    """A GGUF file's shape from its metadata and tensor infos (tensor data untouched)."""
    # gguf (and numpy under it) is loaded the first time a file is read: a process that
    # never reads one, as the control plane serving requests, never holds them.
    from gguf import GGUFReader

    reader = GGUFReader(path, "r")
    arch_value = _field(reader, "general.architecture")
    arch = arch_value if isinstance(arch_value, str) else None
    prefix = arch or "llama"

    def key(name: str) -> object:
        return _field(reader, f"{prefix}.{name}")

    parameters = 0
    expert_bytes = 0
    for tensor in reader.tensors:
        parameters += int(tensor.n_elements)
        if _EXPERT_TENSOR.search(tensor.name):
            expert_bytes += int(tensor.n_bytes)

    layers = _positive_int(key("block_count"))
    embedding = _positive_int(key("embedding_length"))
    heads, _ = _per_layer(key("attention.head_count"))
    kv_value = key("attention.head_count_kv")
    kv_heads, kv_total = _per_layer(kv_value)
    if kv_value is None:
        kv_heads = heads  # no GQA key: every head has its own K and V
    if kv_total is None and kv_heads is not None and layers is not None:
        kv_total = kv_heads * layers
    head_size = _positive_int(key("attention.key_length"))
    value_size = _positive_int(key("attention.value_length"))
    if head_size is None and embedding is not None and heads is not None:
        head_size = embedding // heads
    name = _field(reader, "general.name")
    return ModelShape(
        architecture=arch,
        parameters=parameters or None,
        file_bytes=os.path.getsize(path),
        layers=layers,
        embedding=embedding,
        heads=heads,
        kv_heads=kv_heads,
        head_size=head_size,
        value_head_size=value_size if value_size is not None else head_size,
        trained_context=_positive_int(key("context_length")),
        experts=_positive_int(key("expert_count")),
        experts_used=_positive_int(key("expert_used_count")),
        quantisation=_quantisation(_field(reader, "general.file_type")),
        kv_heads_total=kv_total,
        expert_bytes=expert_bytes or None,
        name=name if isinstance(name, str) else None,
    )


# ----------------------------------------------------------------------- config.json


def _config_int(config: Mapping[str, object], *names: str) -> int | None:
    for name in names:
        value = _positive_int(config.get(name))
        if value is not None:
            return value
    return None


def shape_from_config(config_json: Mapping[str, object], weight_bytes: int) -> ModelShape:
    """A safetensors repository's shape from its config.json and the weights' size."""
    # A model that also reads pictures keeps its language model in text_config; that is
    # what holds the KV cache, so it is what is sized.
    text = config_json.get("text_config")
    config = {**config_json, **text} if isinstance(text, dict) else config_json
    archs = config_json.get("architectures")
    arch = config.get("model_type")
    if not isinstance(arch, str) and isinstance(archs, list) and archs:
        arch = str(archs[0])
    embedding = _config_int(config, "hidden_size", "n_embd", "d_model")
    heads = _config_int(config, "num_attention_heads", "n_head")
    kv_heads = _config_int(config, "num_key_value_heads", "n_head_kv") or heads
    head_size = _config_int(config, "head_dim")
    if head_size is None and embedding is not None and heads is not None:
        head_size = embedding // heads
    dtype = config.get("torch_dtype") or config_json.get("torch_dtype")
    return ModelShape(
        architecture=arch if isinstance(arch, str) else None,
        parameters=None,
        file_bytes=weight_bytes,
        layers=_config_int(config, "num_hidden_layers", "n_layer", "num_layers"),
        embedding=embedding,
        heads=heads,
        kv_heads=kv_heads,
        head_size=head_size,
        value_head_size=head_size,
        trained_context=_config_int(
            config, "max_position_embeddings", "max_sequence_length", "n_positions"
        ),
        # Experts go by several names across families (Mixtral, Qwen-MoE, DeepSeek).
        experts=_config_int(config, "num_local_experts", "num_experts", "n_routed_experts"),
        experts_used=_config_int(config, "num_experts_per_tok", "num_experts_per_token"),
        quantisation=dtype if isinstance(dtype, str) else None,
    )


# -------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one replica needs, in total and on each of its cards."""

    weights: int
    kv_cache: int
    overhead: int
    cards: int
    split: Split
    per_card: tuple[int, ...]
    # Weights held in host memory rather than on the cards (an engine keeping a mixture
    # of experts' experts in RAM); not part of ``weights`` or ``per_card``.
    host_weights: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead


def _overhead(part_bytes: float) -> int:
    return int(OVERHEAD_FIXED_BYTES + OVERHEAD_FRACTION * part_bytes)


def kv_cache_bytes(
    shape: ModelShape, context: int, slots: int = 1, kv_bytes_per_element: float = 2
) -> int:
    """KV cache for ``slots`` sequences of ``context`` tokens each (0 when unknowable)."""
    per_token = shape.kv_bytes_per_token(kv_bytes_per_element)
    if per_token is None:
        return 0
    return int(per_token * context * slots)


def memory_estimate(
    shape: ModelShape,
    context: int,
    slots: int = 1,
    kv_bytes_per_element: float = 2,
    cards: int = 1,
    split: Split = "layer",
    experts_in_ram: bool = False,
) -> MemoryEstimate:
    """Weights + KV cache + runtime overhead for one replica, split over its cards.

    ``context`` is per slot: each slot can hold the whole context, so the KV cache is
    context x slots (the engine is started with a total of context x slots, llama.cpp's
    ``-c`` divided by ``-np``). The spec sizes slots as "as many of that [context] as the
    room left holds", which is this reading.
    """
    if cards < 1:
        raise ValueError(f"cards must be at least 1, not {cards}")
    host = expert_weight_bytes(shape) if experts_in_ram else 0
    weights = shape.file_bytes - host
    kv = kv_cache_bytes(shape, context, slots, kv_bytes_per_element)
    if split == "layer" and shape.layers and cards > 1:
        # Whole layers per card: the busiest card holds ceil(layers / cards) of them.
        # Weights outside the layers (embeddings, output) are spread with them, which is
        # close enough: llama.cpp puts the output on the last card.
        base, extra = divmod(shape.layers, cards)
        counts = [base + (1 if i < extra else 0) for i in range(cards)]
        fractions = [c / shape.layers for c in counts]
    else:
        fractions = [1 / cards] * cards
    per_card = tuple(
        math.ceil(f * (weights + kv)) + _overhead(f * (weights + kv)) for f in fractions
    )
    overhead = sum(per_card) - weights - kv
    return MemoryEstimate(weights, kv, overhead, cards, split, per_card, host)


# Experts' share of a mixture of experts' weights when its files do not say which
# tensors are experts: low on purpose (Mixtral 8x7B's are 96%, Qwen3-30B-A3B's 95%,
# DeepSeek-V3's 97%), so the card is asked for more rather than less.
EXPERT_SHARE = 0.9


def expert_weight_bytes(shape: ModelShape) -> int:
    """Bytes of a mixture of experts' routed experts (0 for a dense model): as the GGUF
    names them, else solved from the active share its name gives ("30B-A3B"), else
    ``EXPERT_SHARE`` of the weights."""
    if not shape.is_moe or shape.experts is None or shape.experts_used is None:
        return 0
    if shape.expert_bytes is not None:
        return min(shape.expert_bytes, shape.file_bytes)
    ratio = min(1.0, shape.experts_used / shape.experts)
    named = active_share_from_name(shape.name) if shape.name else None
    if named is not None and ratio < 1 and named > ratio:
        # active = dense + experts x ratio, dense = 1 - experts: solved for experts.
        return int(shape.file_bytes * min(EXPERT_SHARE, (1 - named) / (1 - ratio)))
    return int(shape.file_bytes * EXPERT_SHARE)


def max_context_that_fits(
    shape: ModelShape,
    free_bytes: int,
    slots: int = 1,
    kv_bytes_per_element: float = 2,
) -> int:
    """The longest context per slot whose replica fits in ``free_bytes`` on one card.

    Rounded down to llama.cpp's 256-token step and capped at the trained context;
    0 when not even one step fits (or the shape lacks the figures for a KV cache).
    """
    per_token = shape.kv_bytes_per_token(kv_bytes_per_element)
    if per_token is None or per_token <= 0 or slots < 1:
        return 0
    # free = (1 + fraction) x (weights + kv) + fixed, solved for kv.
    room_for_kv = (free_bytes - OVERHEAD_FIXED_BYTES) / (1 + OVERHEAD_FRACTION) - shape.file_bytes
    if room_for_kv <= 0:
        return 0
    context = int(room_for_kv // (per_token * slots))
    if shape.trained_context is not None:
        context = min(context, shape.trained_context)
    return (context // CONTEXT_STEP) * CONTEXT_STEP


# ------------------------------------------------------------------------- KV heads


def check_cards_vs_kv_heads(shape: ModelShape, cards: int) -> str | None:
    """None when tensor parallelism over ``cards`` splits the KV heads; else why not.

    Each card must hold whole KV heads (kv_heads % cards == 0), or past the KV heads
    each head is copied to the same number of cards (cards % kv_heads == 0, as
    Qwen3-235B's four KV heads on eight cards).
    """
    if cards < 1:
        return f"{cards} cards: a replica needs at least one card"
    kv = shape.kv_heads
    if cards == 1 or kv is None:
        return None
    if kv % cards == 0 or cards % kv == 0:
        return None
    working = sorted({c for c in range(1, kv + 1) if kv % c == 0} | {kv * m for m in (2, 4, 8)})
    listed = ", ".join(str(c) for c in working)
    return (
        f"{cards} cards cannot split the model's {kv} KV heads evenly: "
        f"a count that divides {kv} or is a multiple of it works ({listed})"
    )


# ------------------------------------------------------------------------ CPU speed


def active_share(shape: ModelShape) -> float:
    """The share of the weights read for one token: 1 unless a mixture of experts."""
    if not shape.is_moe or shape.experts is None or shape.experts_used is None:
        return 1.0
    ratio = min(1.0, shape.experts_used / shape.experts)
    if shape.expert_bytes is not None and shape.file_bytes > 0:
        # Attention, embeddings and shared experts are read whole; routed experts by ratio.
        expert = min(shape.expert_bytes, shape.file_bytes)
        return (shape.file_bytes - expert + expert * ratio) / shape.file_bytes
    if shape.name is not None:
        named = active_share_from_name(shape.name)
        if named is not None:
            return named
    # Without knowing which tensors are experts, the experts' ratio alone; it undercounts
    # the shared part, so speeds of such models read a little high.
    return ratio


def active_share_from_name(name: str) -> float | None:
    """A model named like "Qwen3-30B-A3B" reads 3 of its 30 B parameters a token."""
    match = _ACTIVE_NAME.search(name)
    if match is None:
        return None
    total, active = float(match.group(1)), float(match.group(2))
    if total <= 0 or active <= 0 or active > total:
        return None
    return active / total


def cpu_tokens_per_second(
    shape: ModelShape,
    mem_bandwidth_gbs: float,
    threads: int | None = None,
    one_core_gbs: float | None = None,
) -> float:
    """Tokens a second of one reply on the CPUs (0.0 when the rate is unknown).

    A token reads every weight it uses once, so its time is the bytes read over the
    usable memory rate, at 0.68 of the measured rate, plus 5 ms of fixed work. With
    ``threads`` and ``one_core_gbs`` a replica limited to some cores gets about one
    core's rate for each, up to the whole machine's.
    """
    rate = mem_bandwidth_gbs
    if threads is not None and one_core_gbs is not None and threads > 0 and one_core_gbs > 0:
        rate = min(rate, threads * one_core_gbs)
    if rate <= 0:
        return 0.0
    bytes_per_token = shape.file_bytes * active_share(shape)
    seconds = bytes_per_token / (CPU_EFFICIENCY * rate * 1e9) + CPU_TOKEN_FIXED_S
    return 1.0 / seconds


def slow_warning(tokens_per_second: float, reply_tokens: int = 500) -> str | None:
    """A warning when a reply of ``reply_tokens`` would take minutes; else None."""
    if tokens_per_second <= 0:
        return f"a reply of {reply_tokens} tokens would not finish: no speed is known"
    seconds = reply_tokens / tokens_per_second
    if seconds < SLOW_REPLY_S:
        return None
    return (
        f"a reply of {reply_tokens} tokens would take about {seconds / 60:.1f} minutes "
        f"at {tokens_per_second:.1f} tokens/s"
    )
