"""Refused flags read as each engine reads them: llama.cpp exactly, vLLM and SGLang
with argparse's beginnings of options."""

from __future__ import annotations

import argparse
import re

import pytest

from llmgw.agent.engines import ADAPTERS, EngineError
from llmgw.modelkit.enginerules.flags import ArgparseFlags, ExactFlags, resolve_option
from llmgw.modelkit.enginerules.sglang import OPTIONS as SGLANG_OPTIONS
from llmgw.modelkit.enginerules.sglang import REFUSED as SGLANG_REFUSED
from llmgw.modelkit.enginerules.vllm import OPTIONS as VLLM_OPTIONS
from llmgw.modelkit.enginerules.vllm import REFUSED as VLLM_REFUSED
from llmgw.wire.messages import ShardSpec

llama = ADAPTERS["llama.cpp"]
vllm = ADAPTERS["vllm"]
sglang = ADAPTERS["sglang"]
VLLM_ALL = tuple(sorted(set(VLLM_OPTIONS) | set(VLLM_REFUSED)))
SGLANG_ALL = tuple(sorted(set(SGLANG_OPTIONS) | set(SGLANG_REFUSED)))


class _Refusal(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Refusal(message)


def argparse_reading(arg: str, options: tuple[str, ...]) -> set[str]:
    """What Python's own argparse makes of ``arg`` given ``options``: the option(s)
    it read it as (several: it stopped, ambiguous), or none."""
    parser = _Parser(add_help=False)
    dests: dict[str, str] = {}
    for i, opt in enumerate(options):
        parser.add_argument(opt, dest=f"o{i}", nargs="?", default=argparse.SUPPRESS)
        dests[f"o{i}"] = opt
    try:
        namespace, _ = parser.parse_known_args([arg])
    except _Refusal as exc:
        m = re.search(r"could match (.*)$", str(exc))
        assert m, str(exc)
        return set(m[1].split(", "))
    return {dests[d] for d in vars(namespace)}


@pytest.mark.parametrize(
    "arg",
    [
        "--trust-remote",
        "--download-d",
        "--max-model-len",
        "--max-model",
        "--mo",
        "--served",
        "--tens",
        "--api-k",
        "--chat-template",
        "--chat-template-c",
        "--chat",
        "--gen=auto",
        "-t",
        "-tp",
        "-tp=2",
        "-d",
        "-dpl",
        "-O3",
        "-qfp8",
        "--gpu-memory-utilization=0.9",
        "--no-such-flag",
        "-1",
        "value",
    ],
)
def test_resolve_option_reads_as_argparse_does(arg: str) -> None:
    assert set(resolve_option(arg, VLLM_ALL)) == argparse_reading(arg, VLLM_ALL)


@pytest.mark.parametrize("arg", ["--model", "--tp", "--tokenizer", "--dp", "--ssl", "--api"])
def test_resolve_option_reads_sglang_as_argparse_does(arg: str) -> None:
    assert set(resolve_option(arg, SGLANG_ALL)) == argparse_reading(arg, SGLANG_ALL)


def test_single_dash_with_equals_is_read_as_python_312_does() -> None:
    # 3.11 rejects "-t=2"; 3.12 reads it as -tp. Either way it is never allowed through.
    assert resolve_option("-t=2", VLLM_ALL) == ("-tp",)


# --- llama.cpp: exact spellings, short and long, with = forms ------------------------

LLAMA_SPELLINGS = [
    *("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff"),
    *("--hf-file", "-hft", "--hf-token", "--lora", "--lora-scaled", "--mmproj", "-mm"),
    *("--mmproj-url", "-md", "--model-draft", "--grammar-file", "-lcs"),
    *("--lookup-cache-static", "-lcd", "--lookup-cache-dynamic", "--slot-save-path"),
    *("--log-file", "--path", "--api-key", "--api-key-file", "--ssl-key-file"),
    *("--ssl-cert-file", "-dev", "--device", "-mg", "--main-gpu", "-ts", "--tensor-split"),
    *("--chat-template-file", "--host", "--port", "-a", "--alias", "-jf", "-t", "--threads"),
]


@pytest.mark.parametrize("flag", LLAMA_SPELLINGS)
def test_llamacpp_refuses_every_spelling(flag: str) -> None:
    assert llama.refused_flag(["-c", "4096", flag, "x"]) == flag
    assert llama.refused_flag([f"{flag}=x"]) == f"{flag}=x"


def test_llamacpp_reads_underscores_as_dashes() -> None:
    assert llama.refused_flag(["--hf_repo", "org/x"]) == "--hf_repo"
    assert llama.refused_flag(["--slot_save_path=/tmp"]) == "--slot_save_path=/tmp"


@pytest.mark.parametrize(
    "args",
    [
        ["--chat-template", "chatml"],  # inline template: llama.cpp does no prefix matching
        ["-c", "8192", "-np", "4", "--jinja"],
        ["--n-gpu-layers", "20", "-ngl", "20", "--flash-attn", "on"],
        ["--model-url-not-a-flag"],  # no beginnings in llama.cpp: an unknown flag it rejects
        ["--hf"],
        ["--temp", "0.7", "--top-k", "40", "--seed", "-1"],
    ],
)
def test_llamacpp_lets_harmless_flags_through(args: list[str]) -> None:
    assert llama.refused_flag(args) is None


def test_llamacpp_refusal_names_flag_and_fix() -> None:
    spec = ShardSpec("r1", "llama.cpp", "hf:a/b", 8000, "k", "fp", args=["-hfr", "org/m"])
    with pytest.raises(EngineError, match=r"'-hfr' is not allowed.*remove it"):
        llama.check(spec)


def test_every_engine_takes_several_cards() -> None:
    llama.check(ShardSpec("r1", "llama.cpp", "s", 8000, "k", "fp", cards=["0", "1"]))
    vllm.check(ShardSpec("r1", "vllm", "s", 8000, "k", "fp", cards=["0", "1"]))
    # The split across them is llmgw's to set: a profile's own is refused.
    spec = ShardSpec("r1", "llama.cpp", "s", 8000, "k", "fp", cards=["0", "1"], args=["-ts", "3,1"])
    with pytest.raises(EngineError, match="'-ts' is not allowed"):
        llama.check(spec)


# --- vLLM and SGLang: argparse's reading, beginnings included -------------------------

VLLM_SPELLINGS = [
    *("--model", "--mod", "--tokenizer", "--tok", "--trust-remote-code", "--trust-remote"),
    *("--trust", "--download-dir", "--download-d", "--load-format", "--load-f"),
    *("--device", "--api-key", "--api-k", "--host", "--port", "--po", "--served-model-name"),
    *("--served", "--tensor-parallel-size", "--tensor", "-tp", "-t", "--ssl-keyfile"),
    *("--ssl-certfile", "--ssl-ca-certs", "--ssl", "--chat-template", "--lora-modules"),
    *("--lora-m", "--config", "--hf-token", "--pipeline-parallel-size", "-pp", "-p"),
    *("--trust_remote_code", "--download_dir", "--speculative-config", "--generation-config"),
]


@pytest.mark.parametrize("flag", VLLM_SPELLINGS)
def test_vllm_refuses_every_spelling(flag: str) -> None:
    assert vllm.refused_flag(["--max-model-len", "4096", flag, "x"]) == flag
    assert vllm.refused_flag([f"{flag}=x"]) == f"{flag}=x"


def test_vllm_dotted_json_keys_are_their_flag() -> None:
    assert vllm.refused_flag(["--speculative-config.model", "org/draft"]) is not None
    assert vllm.refused_flag(["--compilation-config.level", "3"]) is None


@pytest.mark.parametrize(
    "args",
    [
        ["--max-model-len", "4096"],
        ["--max-model", "4096"],  # a unique beginning of a harmless flag
        ["--gpu-memory-utilization=0.9", "--enforce-eager"],
        ["--chat-template-content-format", "openai"],  # longer than --chat-template
        ["--tokenizer-mode", "mistral"],  # exact beats the beginning of --tokenizer
        ["--hf-overrides", '{"rope_scaling": {"type": "yarn"}}'],
        ["--generation-config", "vllm"],
        ["--generation-config=auto"],
        ["-O3", "-q", "fp8"],
        ["--seed", "-1"],
        ["--no-such-flag"],  # vLLM rejects it; nothing it could read
    ],
)
def test_vllm_lets_harmless_flags_through(args: list[str]) -> None:
    assert vllm.refused_flag(args) is None


def test_vllm_generation_config_path_is_refused() -> None:
    assert vllm.refused_flag(["--generation-config", "/etc"]) == "--generation-config"
    assert vllm.refused_flag(["--gen", "/etc"]) == "--gen"
    assert vllm.refused_flag(["--generation-config"]) == "--generation-config"


def test_ambiguous_beginning_touching_a_refused_flag_is_refused() -> None:
    # argparse would stop on "--mo" (--model, --model-impl, ...); an older vLLM without
    # the harmless ones would read it as --model, so it is refused, not left to chance.
    assert len(resolve_option("--mo", VLLM_ALL)) > 1
    assert vllm.refused_flag(["--mo", "/etc/passwd"]) == "--mo"
    # Ambiguous among harmless flags only: argparse's own error, not ours.
    assert len(resolve_option("--max-num", VLLM_ALL)) > 1
    assert vllm.refused_flag(["--max-num", "8"]) is None


SGLANG_SPELLINGS = [
    *("--model-path", "--model", "--model-p", "--mod", "--tokenizer-path", "--tokenizer"),
    *("--trust-remote-code", "--trust", "--download-dir", "--load-format", "--device"),
    *("--api-key", "--host", "--port", "--served-model-name", "--tp-size", "--tp"),
    *("--tensor-parallel-size", "--dp-size", "--chat-template", "--lora-paths"),
    *("--base-gpu-id", "--speculative-draft-model-path", "--delete-ckpt-after-loading"),
    *("--crash-dump-folder", "--tp_size"),
]


@pytest.mark.parametrize("flag", SGLANG_SPELLINGS)
def test_sglang_refuses_every_spelling(flag: str) -> None:
    assert sglang.refused_flag(["--context-length", "8192", flag, "x"]) == flag
    assert sglang.refused_flag([f"{flag}=x"]) == f"{flag}=x"


@pytest.mark.parametrize(
    "args",
    [
        ["--context-length", "8192", "--mem-fraction-static", "0.8"],
        ["--tokenizer-mode", "auto"],
        ["--ep", "2"],  # exact: --ep, not a beginning of anything refused
        ["--enable-torch-compile", "--cuda-graph-max-bs=64"],
        ["--json-model-override-args", "{}"],
    ],
)
def test_sglang_lets_harmless_flags_through(args: list[str]) -> None:
    assert sglang.refused_flag(args) is None


def test_flag_helpers_stand_alone() -> None:
    flags = ArgparseFlags(["--alpha", "--alphabet"], ["--beta"])
    assert flags.refused_flag(["--b"]) == "--b"
    assert flags.refused_flag(["--alph"]) is None
    assert ExactFlags(["-x"]).refused_flag(["-xy", "-x=1"]) == "-x=1"
