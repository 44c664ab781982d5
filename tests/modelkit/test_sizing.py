"""The planner's arithmetic: GGUF and config.json shapes, memory, KV heads, CPU speed."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from llmgw.modelkit import sizing
from llmgw.modelkit.sizing import (
    ModelShape,
    active_share,
    active_share_from_name,
    check_cards_vs_kv_heads,
    cpu_tokens_per_second,
    max_context_that_fits,
    memory_estimate,
    read_gguf_header,
    shape_from_config,
    slow_warning,
)
from tests.support import tinymodel

MiB = 1024**2


def shape(**overrides: object) -> ModelShape:
    base: dict[str, object] = dict(
        architecture="llama",
        parameters=None,
        file_bytes=1000 * MiB,
        layers=4,
        embedding=512,
        heads=8,
        kv_heads=2,
        head_size=64,
        value_head_size=64,
        trained_context=32768,
    )
    base.update(overrides)
    return ModelShape(**base)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- GGUF


def test_tiny_model_header(tmp_path: Path) -> None:
    path = tinymodel.write_tiny_model(tmp_path / "tiny.gguf")
    got = read_gguf_header(path)

    n_vocab = len(tinymodel.vocabulary()[0])
    e, ff, kv_width = 64, 128, 16 * 2
    per_layer = e + e * e + 2 * kv_width * e + e * e + e + 3 * ff * e
    assert got.architecture == "llama"
    assert got.name == "llmgw-tiny"
    assert got.parameters == 2 * n_vocab * e + e + 2 * per_layer
    assert got.file_bytes == path.stat().st_size
    assert got.layers == 2
    assert got.embedding == 64
    assert got.heads == 4
    assert got.kv_heads == 2
    assert got.kv_heads_total == 4
    assert got.head_size == 16  # no key_length: embedding / heads
    assert got.value_head_size == 16
    assert got.trained_context == 512
    assert got.experts is None and got.experts_used is None
    assert got.expert_bytes is None
    assert not got.is_moe
    assert got.quantisation == "F32"
    assert got.kv_cache_type == "f16"
    # 2 layers x 2 KV heads x (16 + 16) x 2 bytes
    assert got.kv_bytes_per_token() == 256
    assert active_share(got) == 1.0


def write_moe(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    writer.add_name("tiny-8x-A2")
    writer.add_context_length(4096)
    writer.add_embedding_length(8)
    writer.add_block_count(2)
    writer.add_head_count(4)
    writer.add_array("qwen3moe.attention.head_count_kv", [2, 1])
    writer.add_key_length(16)
    writer.add_value_length(8)
    writer.add_expert_count(8)
    writer.add_expert_used_count(2)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    f32 = np.float32
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=f32))
    for i in range(2):
        writer.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((8, 8), dtype=f32))
        writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", np.zeros((8, 8), dtype=f32))
        writer.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.zeros((8, 16, 8), dtype=f32))
        writer.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.zeros((8, 16, 8), dtype=f32))
        writer.add_tensor(f"blk.{i}.ffn_down_exps.weight", np.zeros((8, 8, 16), dtype=f32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_moe_header_and_active_share(tmp_path: Path) -> None:
    path = write_moe(tmp_path / "moe.gguf")
    got = read_gguf_header(path)

    assert got.architecture == "qwen3moe"
    assert got.parameters == 16 * 8 + 2 * (64 + 64 + 3 * 1024)
    assert got.experts == 8 and got.experts_used == 2 and got.is_moe
    # three expert tensors of 1,024 f32 a layer, two layers
    assert got.expert_bytes == 2 * 3 * 1024 * 4
    # head_count_kv per layer: the largest is the KV heads, the sum sizes the cache
    assert got.kv_heads == 2 and got.kv_heads_total == 3
    assert got.head_size == 16 and got.value_head_size == 8
    assert got.kv_bytes_per_token() == 3 * (16 + 8) * 2
    assert got.quantisation == "F16"

    size = path.stat().st_size
    expert = 24576
    assert active_share(got) == pytest.approx((size - expert + expert / 4) / size)
    # Without tensor names: the name's active figure, then the experts' ratio.
    no_tensors = ModelShape(**{**got.__dict__, "expert_bytes": None})
    assert active_share(no_tensors) == pytest.approx(0.25)
    named = ModelShape(**{**got.__dict__, "expert_bytes": None, "name": "Qwen3-30B-A3B"})
    assert active_share(named) == pytest.approx(0.1)


def test_active_share_from_name() -> None:
    assert active_share_from_name("Qwen3-30B-A3B-Instruct") == pytest.approx(0.1)
    assert active_share_from_name("qwen3-235b-a22b") == pytest.approx(22 / 235)
    assert active_share_from_name("llama-3.1-8b") is None


# ----------------------------------------------------------------------- config.json


def test_config_llama() -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
    }
    got = shape_from_config(config, 16_060_522_240)
    assert got.architecture == "llama"
    assert got.file_bytes == 16_060_522_240
    assert (got.layers, got.embedding, got.heads, got.kv_heads) == (32, 4096, 32, 8)
    assert got.head_size == 128 and got.value_head_size == 128
    assert got.trained_context == 131072
    assert got.experts is None and got.experts_used is None and not got.is_moe
    assert got.parameters is None
    assert got.quantisation == "bfloat16"
    # 32 layers x 8 heads x 256 x 2 bytes: 128 KiB a token
    assert got.kv_bytes_per_token() == 131072


def test_config_mixtral_like() -> None:
    config = {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    got = shape_from_config(config, 93_000_000_000)
    assert got.experts == 8 and got.experts_used == 2 and got.is_moe
    assert active_share(got) == pytest.approx(0.25)


def test_config_text_config_nested() -> None:
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27},
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 2560,
            "num_hidden_layers": 34,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "max_position_embeddings": 131072,
        },
    }
    got = shape_from_config(config, 8_600_000_000)
    assert got.architecture == "gemma3_text"
    assert (got.layers, got.embedding, got.heads, got.kv_heads) == (34, 2560, 8, 4)
    assert got.head_size == 256
    assert got.trained_context == 131072


def test_config_unknowns_are_none() -> None:
    got = shape_from_config({"hidden_size": 0}, 10)
    assert got.layers is None and got.embedding is None and got.heads is None
    assert got.kv_heads is None and got.head_size is None and got.trained_context is None
    assert got.kv_bytes_per_token() is None
    assert memory_estimate(got, 4096).kv_cache == 0
    assert max_context_that_fits(got, 10**12) == 0


# -------------------------------------------------------------------------- memory


FIXED = 512 * MiB  # sizing.OVERHEAD_FIXED_BYTES


def test_overhead_figures() -> None:
    assert sizing.OVERHEAD_FIXED_BYTES == FIXED
    assert sizing.OVERHEAD_FRACTION == 0.05


def test_memory_one_card() -> None:
    # 4 layers x 2 KV heads x (64 + 64) x 2 bytes = 2,048 bytes a token;
    # 4,096 tokens x 2 slots = 16 MiB of KV cache.
    got = memory_estimate(shape(), context=4096, slots=2)
    assert got.weights == 1000 * MiB
    assert got.kv_cache == 16 * MiB
    assert got.overhead == FIXED + int(0.05 * 1016 * MiB)
    assert got.per_card == (got.total,)
    assert got.total == 1016 * MiB + FIXED + int(0.05 * 1016 * MiB)


def test_memory_q8_kv_halves_the_cache() -> None:
    assert memory_estimate(shape(), 4096, kv_bytes_per_element=1).kv_cache == 4 * MiB


def test_memory_layer_split() -> None:
    # 4 layers on 3 cards: 2, 1, 1 -> halves and quarters of 1,016 MiB.
    got = memory_estimate(shape(), context=4096, slots=2, cards=3, split="layer")
    assert got.per_card == (
        508 * MiB + FIXED + int(0.05 * 508 * MiB),
        254 * MiB + FIXED + int(0.05 * 254 * MiB),
        254 * MiB + FIXED + int(0.05 * 254 * MiB),
    )
    assert got.total == sum(got.per_card)
    assert got.weights + got.kv_cache == 1016 * MiB


def test_memory_tensor_split() -> None:
    got = memory_estimate(shape(), context=4096, slots=2, cards=4, split="tensor")
    assert got.per_card == (254 * MiB + FIXED + int(0.05 * 254 * MiB),) * 4
    assert got.overhead == 4 * (FIXED + int(0.05 * 254 * MiB))


def test_memory_rejects_no_cards() -> None:
    with pytest.raises(ValueError):
        memory_estimate(shape(), 4096, cards=0)


def test_max_context_that_fits() -> None:
    s = shape()
    exact = FIXED + int(1.05 * (1000 * MiB + 2048 * 4096)) + 16
    assert max_context_that_fits(s, exact) == 4096
    # two slots share the same room: half the context each
    assert max_context_that_fits(s, exact, slots=2) == 2048
    # a little less room: down to the previous 256 step
    assert max_context_that_fits(s, exact - 4096) == 3840
    # room past the trained context is capped there
    assert max_context_that_fits(shape(trained_context=1000), 10**12) == 768
    # not even the weights
    assert max_context_that_fits(s, 1000 * MiB) == 0
    # and what fits, fits
    assert memory_estimate(s, 4096).total <= exact


# ------------------------------------------------------------------------- KV heads


@pytest.mark.parametrize(
    ("kv_heads", "cards", "fits"),
    [
        (8, 1, True),
        (8, 2, True),
        (8, 4, True),
        (8, 8, True),
        (8, 16, True),
        (8, 3, False),
        (8, 6, False),
        (8, 12, False),
        (4, 8, True),  # Qwen3-235B: four KV heads on eight cards
        (4, 3, False),
        (1, 7, True),
        (2, 3, False),
    ],
)
def test_cards_vs_kv_heads(kv_heads: int, cards: int, fits: bool) -> None:
    reason = check_cards_vs_kv_heads(shape(kv_heads=kv_heads), cards)
    if fits:
        assert reason is None
    else:
        assert reason is not None
        assert f"{cards} cards" in reason and f"{kv_heads} KV heads" in reason


def test_cards_vs_kv_heads_names_counts_that_work() -> None:
    reason = check_cards_vs_kv_heads(shape(kv_heads=8), 6)
    assert reason is not None and "1, 2, 4, 8, 16, 32, 64" in reason
    assert check_cards_vs_kv_heads(shape(kv_heads=None), 3) is None
    assert check_cards_vs_kv_heads(shape(), 0) is not None


# ------------------------------------------------------------------------ CPU speed

# The spec's calibration on the PoC (llama.cpp's predicted_per_second). The files are
# the published Q4_K_M GGUFs: qwen2.5-1.5b-instruct at 1.12 GB and qwen2.5-14b-instruct
# at 8.99 GB.
CALIBRATION = [
    # GB/s, file bytes, measured tok/s, the spec's estimate
    (24.9, 1.12e9, 14.5, 14.7),
    (41.9, 8.99e9, 3.3, 3.2),
]


@pytest.mark.parametrize(("gbs", "size", "measured", "estimated"), CALIBRATION)
def test_cpu_speed_calibration(gbs: float, size: float, measured: float, estimated: float) -> None:
    got = cpu_tokens_per_second(shape(file_bytes=int(size)), gbs)
    assert got == pytest.approx(measured, rel=0.10)
    assert got == pytest.approx(estimated, rel=0.10)


@pytest.mark.parametrize(("gbs", "estimated"), [(24.9, 14.7), (41.9, 3.2)])
def test_cpu_speed_formula_round_trip(gbs: float, estimated: float) -> None:
    # The bytes the spec's estimate implies give that estimate back exactly.
    implied = (1 / estimated - 0.005) * 0.68 * gbs * 1e9
    got = cpu_tokens_per_second(shape(file_bytes=int(implied)), gbs)
    assert got == pytest.approx(estimated, rel=1e-6)


def test_cpu_speed_threads_and_experts() -> None:
    s = shape(file_bytes=int(6.8e9))
    # 6.8 GB / (0.68 x 10 GB/s) = 1 s, + 5 ms
    assert cpu_tokens_per_second(s, 10.0) == pytest.approx(1 / 1.005)
    # two threads at 2 GB/s each: 4 GB/s usable
    assert cpu_tokens_per_second(s, 10.0, threads=2, one_core_gbs=2.0) == pytest.approx(1 / 2.505)
    # more threads than the machine: the machine's rate
    assert cpu_tokens_per_second(s, 10.0, threads=64, one_core_gbs=2.0) == pytest.approx(1 / 1.005)
    moe = shape(file_bytes=int(6.8e9), experts=8, experts_used=2)
    assert cpu_tokens_per_second(moe, 10.0) == pytest.approx(1 / 0.255)
    assert cpu_tokens_per_second(s, 0.0) == 0.0


def test_slow_warning() -> None:
    assert slow_warning(14.5) is None
    warning = slow_warning(3.2)
    assert warning is not None and "minutes" in warning and "3.2 tokens/s" in warning
    assert slow_warning(10.0, reply_tokens=1000) is not None
    assert slow_warning(0.0) is not None
