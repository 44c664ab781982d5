"""FreeToken's and TensorRT-LLM's rules (``modelkit/enginerules/freetoken.py``,
``tensorrt.py``): refused flags in the spellings each parser takes (FreeToken's
argparse reads a unique beginning; trtllm-serve's click only whole names, written with
underscores), the flags the catalog sets, what each needs of a card and a host, and the
arguments that give each its context and slots."""

from __future__ import annotations

import pytest

from llmgw.modelkit.enginerules import EXPERT_PARALLEL, RuleError, rules
from llmgw.modelkit.enginerules import freetoken as ft_flags
from llmgw.modelkit.enginerules import tensorrt as trt_flags

FT = rules("freetoken")
TRT = rules("tensorrt-llm")


def test_the_lists_are_flags_each_named_once_and_apart() -> None:
    for module in (ft_flags, trt_flags):
        for flags in (module.REFUSED, module.MANAGED):
            assert len(set(flags)) == len(flags)
            assert all(f.startswith("-") and " " not in f for f in flags)
        assert not set(module.REFUSED) & set(module.MANAGED)
    assert not set(ft_flags.OPTIONS) & (set(ft_flags.REFUSED) | set(ft_flags.MANAGED))


@pytest.mark.parametrize("flag", ft_flags.REFUSED)
def test_freetoken_refuses_each_flag_whole_and_by_a_unique_beginning(flag: str) -> None:
    value = "profile:/etc/x" if flag == "--moe-cache-split" else "x"
    assert FT.refused_flag(["--dtype", "bfloat16", flag, value]) == flag
    assert FT.refused_flag([f"{flag}={value}"]) == f"{flag}={value}"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--model-p", "/m"], "--model-p"),  # unique beginning of --model-path
        (["--mmpr", "/x.gguf"], "--mmpr"),
        (["--allowed-local", "/"], "--allowed-local"),
        (["--served-model", "x"], "--served-model"),
        (["--model_source", "modelscope"], "--model_source"),
        (["--moe-cache-split", "profile:/etc/passwd"], "--moe-cache-split"),
        (["--moe-cache-split=profile:x"], "--moe-cache-split=profile:x"),
        (["--tp-size", "2"], "--tp-size"),
    ],
)
def test_freetoken_spellings(args: list[str], flag: str) -> None:
    assert FT.refused_flag(args) == flag


def test_freetoken_harmless_flags_pass() -> None:
    args = ["--moe-strategy", "hybrid", "--moe-cache-mem", "12GiB", "--dtype", "bfloat16"]
    args += ["--moe-cache-split", "equal", "--hf-overrides", '{"rope_theta": 1}']
    args += ["--reasoning-parser", "qwen3", "--cuda-graph-max-bs", "8"]
    assert FT.refused_flag(args) is None
    FT.check(args, cards=1)


def test_freetoken_managed_flags_point_at_ctl_model_context() -> None:
    for flag in ("--max-seq-len-override", "--max-running-requests", "--max-seq-len"):
        with pytest.raises(RuleError, match="llmgw ctl model context"):
            FT.check([flag, "8192"], cards=1)


def test_freetoken_is_one_card_one_node_and_no_cpu() -> None:
    with pytest.raises(RuleError, match="freetoken runs on one card"):
        FT.check([], cards=2)
    with pytest.raises(RuleError, match="freetoken runs on cards only; give the profile 1 card"):
        FT.check([], cards=0)
    with pytest.raises(RuleError, match="runs a freetoken replica on one node"):
        FT.check([], cards=1, nodes=2)
    assert FT.experts_in_ram and not FT.tensor_split


@pytest.mark.parametrize(
    ("compute", "driver", "said"),
    [
        ("8.0", "580.65.06", None),
        ("9.0", "590.10", None),
        ("12.0", "580.1", None),
        ("7.5", "580.65.06", "compute capability 7.5, freetoken needs 8.0 or more"),
        ("8.6", "575.57.08", "driver 575.57.08, freetoken needs 580 or later"),
        (None, None, None),  # not reported: not held against the card
    ],
)
def test_freetoken_card_needs(compute: str | None, driver: str | None, said: str | None) -> None:
    assert FT.card_refusal(compute, driver) == said
    assert rules("vllm").card_refusal(compute, driver) is None


def test_freetoken_host_needs() -> None:
    assert FT.host_refusal("x86_64") is None
    assert FT.host_refusal("amd64") is None
    assert FT.host_refusal(None) is None
    assert FT.host_refusal("aarch64") == "freetoken runs on x86_64 hosts; this one is aarch64"
    assert rules("vllm").host_refusal("aarch64") is None


@pytest.mark.parametrize("flag", trt_flags.REFUSED)
def test_tensorrt_refuses_each_flag_as_click_spells_it(flag: str) -> None:
    underscored = "--" + flag[2:].replace("-", "_")
    assert TRT.refused_flag([underscored, "x"]) == underscored
    assert TRT.refused_flag([f"{underscored}=x"]) == f"{underscored}=x"
    assert TRT.refused_flag([flag, "x"]) == flag


def test_tensorrt_harmless_flags_pass_and_beginnings_are_not_flags() -> None:
    args = ["--kv_cache_free_gpu_memory_fraction", "0.8", "--max_num_tokens", "8192"]
    args += ["--ep_size", "2", "--reasoning_parser", "deepseek-r1", "--log_level", "info"]
    assert TRT.refused_flag(args) is None
    TRT.check(args, cards=2)


def test_tensorrt_managed_flags_and_card_rules() -> None:
    for flag in ("--max_seq_len", "--max_batch_size", "--max-seq-len"):
        with pytest.raises(RuleError, match="llmgw ctl model context"):
            TRT.check([flag, "8192"], cards=1)
    with pytest.raises(RuleError, match="tensorrt-llm runs on cards only"):
        TRT.check([], cards=0)
    with pytest.raises(RuleError, match="runs a tensorrt-llm replica on one node"):
        TRT.check([], cards=2, nodes=2)
    assert TRT.tensor_split and TRT.multi_card


def test_context_args() -> None:
    assert FT.context_args(8192, 4) == [
        *("--max-seq-len-override", "8192", "--max-running-requests", "4")
    ]
    assert TRT.context_args(8192, 4) == ["--max_seq_len", "8192", "--max_batch_size", "4"]


def test_expert_parallel_for_a_mixture_of_experts_on_several_cards_on_vllm() -> None:
    vllm = rules("vllm")
    assert vllm.layout_args([], cards=2, moe=True) == [EXPERT_PARALLEL]
    assert vllm.layout_args([EXPERT_PARALLEL], cards=2, moe=True) == []
    assert vllm.layout_args([], cards=1, moe=True) == []
    assert vllm.layout_args([], cards=8, moe=False) == []
    assert rules("sglang").layout_args([], cards=2, moe=True) == []
