"""Engine rules: refused and catalog-managed flags as each engine parses them, card
counts, and the arguments that give an engine its context and slots."""

from __future__ import annotations

import pytest

from llmgw.modelkit.enginerules import RULES, EngineRules, RuleError, rules

MANAGED_HINT = "llmgw ctl model context"


def test_rules_cover_the_five_engines() -> None:
    assert sorted(RULES) == ["freetoken", "llama.cpp", "sglang", "tensorrt-llm", "vllm"]
    for name, engine in RULES.items():
        assert rules(name) is engine
        assert engine.name == name


def test_unknown_engine_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(RuleError) as caught:
        rules("tgi")
    message = str(caught.value)
    assert "'tgi'" in message
    assert "freetoken, llama.cpp, sglang, tensorrt-llm, vllm" in message


# ------------------------------------------------------------------------ refused flags


@pytest.mark.parametrize(
    ("engine", "args", "flag"),
    [
        # llama.cpp looks flags up exactly, short spellings included.
        ("llama.cpp", ["-m", "/tmp/x.gguf"], "-m"),
        ("llama.cpp", ["--model", "/tmp/x.gguf"], "--model"),
        ("llama.cpp", ["-hf", "org/repo"], "-hf"),
        ("llama.cpp", ["--hf-repo", "org/repo"], "--hf-repo"),
        ("llama.cpp", ["--hf_repo", "org/repo"], "--hf_repo"),
        ("llama.cpp", ["-t", "8"], "-t"),
        ("llama.cpp", ["--threads=8"], "--threads=8"),
        ("llama.cpp", ["-ngl", "99", "--port", "9000"], "--port"),
        ("llama.cpp", ["--chat-template-file", "/etc/passwd"], "--chat-template-file"),
        ("llama.cpp", ["-dev", "CUDA1"], "-dev"),
        ("llama.cpp", ["--lora", "a.gguf"], "--lora"),
        # vLLM and SGLang take any unambiguous beginning, and --flag=value.
        ("vllm", ["--model=x"], "--model=x"),
        ("vllm", ["--trust-remote"], "--trust-remote"),
        ("vllm", ["--trust_remote_code"], "--trust_remote_code"),
        ("vllm", ["--trust-remote-code"], "--trust-remote-code"),
        ("vllm", ["-tp", "2"], "-tp"),
        ("vllm", ["-t", "2"], "-t"),
        ("vllm", ["--generation-config", "/etc"], "--generation-config"),
        ("vllm", ["--generation-config=/etc"], "--generation-config=/etc"),
        ("vllm", ["--dtype", "half", "--served-model-name", "x"], "--served-model-name"),
        ("sglang", ["--model-path", "x"], "--model-path"),
        ("sglang", ["--model=x"], "--model=x"),
        ("sglang", ["--trust-remote"], "--trust-remote"),
        ("sglang", ["--mod", "x"], "--mod"),
        ("sglang", ["--tp", "2"], "--tp"),
        ("sglang", ["--port=1"], "--port=1"),
    ],
)
def test_refused_flags_in_every_spelling(engine: str, args: list[str], flag: str) -> None:
    rule = rules(engine)
    assert rule.refused_flag(args) == flag
    with pytest.raises(RuleError) as caught:
        rule.check(args, cards=1)
    message = str(caught.value)
    assert repr(flag) in message
    assert "is not allowed" in message
    assert MANAGED_HINT not in message


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        # --chat-template is its own llama.cpp flag, not a spelling of the file one.
        ("llama.cpp", ["-ngl", "99", "--jinja", "--chat-template", "chatml"]),
        ("llama.cpp", ["--mod", "x"]),  # llama.cpp does not take beginnings
        ("llama.cpp", []),
        ("vllm", ["--dtype", "bfloat16", "--enforce-eager", "--model-impl", "vllm"]),
        ("vllm", ["--generation-config", "auto"]),
        ("vllm", ["--generation-config=vllm"]),
        ("sglang", ["--mem-fraction-static", "0.8", "--model-impl", "sglang"]),
    ],
)
def test_harmless_args_pass(engine: str, args: list[str]) -> None:
    rule = rules(engine)
    assert rule.refused_flag(args) is None
    rule.check(args, cards=1)


# ------------------------------------------------------------------------ managed flags


@pytest.mark.parametrize(
    ("engine", "args", "flag"),
    [
        ("llama.cpp", ["-c", "8192"], "-c"),
        ("llama.cpp", ["-c=8192"], "-c=8192"),
        ("llama.cpp", ["--ctx-size", "8192"], "--ctx-size"),
        ("llama.cpp", ["--ctx_size", "8192"], "--ctx_size"),
        ("llama.cpp", ["-np", "4"], "-np"),
        ("llama.cpp", ["--parallel", "4"], "--parallel"),
        ("vllm", ["--max-model-len", "8192"], "--max-model-len"),
        ("vllm", ["--max-model-len=8192"], "--max-model-len=8192"),
        ("vllm", ["--max-model", "8192"], "--max-model"),
        ("vllm", ["--max_model_len", "8192"], "--max_model_len"),
        ("vllm", ["--max-num-seqs", "4"], "--max-num-seqs"),
        ("vllm", ["--max-num-s", "4"], "--max-num-s"),
        ("sglang", ["--context-length", "8192"], "--context-length"),
        ("sglang", ["--context", "8192"], "--context"),
        ("sglang", ["--max-running-requests", "4"], "--max-running-requests"),
        ("sglang", ["--max-running", "4"], "--max-running"),
    ],
)
def test_managed_flags_point_at_ctl_model_context(engine: str, args: list[str], flag: str) -> None:
    rule = rules(engine)
    assert rule.refused_flag(args) is None  # not refused outright: managed
    with pytest.raises(RuleError) as caught:
        rule.check(args, cards=1)
    message = str(caught.value)
    assert repr(flag) in message
    assert "set by llmgw from the catalog" in message
    assert MANAGED_HINT in message


def test_exact_harmless_vllm_option_beside_a_managed_one_passes() -> None:
    # --max-num-batched-tokens shares a beginning with --max-num-seqs but is its own flag.
    rules("vllm").check(["--max-num-batched-tokens", "8192"], cards=1)


# ----------------------------------------------------------------------------- cards


def test_llama_cpp_splits_layers_across_cards() -> None:
    rule = rules("llama.cpp")
    assert rule.multi_card is True and rule.tensor_split is False
    for cards in (0, 1, 2, 8):
        rule.check([], cards=cards)
    # The split is llmgw's to set from the cards it gives: a profile cannot.
    with pytest.raises(RuleError, match="--tensor-split"):
        rule.check(["--tensor-split", "3,1"], cards=2)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_tensor_split_engines_take_several_cards(engine: str) -> None:
    rule = rules(engine)
    assert rule.multi_card is True
    assert rule.tensor_split is True
    rule.check([], cards=8)


def test_refused_flag_is_reported_before_card_count() -> None:
    with pytest.raises(RuleError, match="'-m' is not allowed"):
        rules("llama.cpp").check(["-m", "x"], cards=2)


# ---------------------------------------------------------------------- context args


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        # llama-server divides --ctx-size among its slots: context x slots.
        ("llama.cpp", ["--ctx-size", "32768", "--parallel", "4"]),
        ("vllm", ["--max-model-len", "8192", "--max-num-seqs", "4"]),
        ("sglang", ["--context-length", "8192", "--max-running-requests", "4"]),
    ],
)
def test_context_args(engine: str, expected: list[str]) -> None:
    rule = rules(engine)
    assert rule.context_args(8192, 4) == expected
    # What the catalog adds must itself be a managed flag, or a profile could fight it.
    with pytest.raises(RuleError, match=MANAGED_HINT):
        rule.check(expected, cards=1)


def test_llama_cpp_one_slot_context_is_the_context() -> None:
    assert rules("llama.cpp").context_args(4096, 1) == ["--ctx-size", "4096", "--parallel", "1"]


def test_engine_rules_are_frozen() -> None:
    rule = rules("vllm")
    assert isinstance(rule, EngineRules)
    with pytest.raises(AttributeError):
        rule.multi_card = False  # type: ignore[misc]
