"""Each adapter's command line, environment, readiness rule and version reading; the
key reaches llama.cpp and vLLM only through the environment, SGLang only as --api-key."""

from __future__ import annotations

import pytest

from llmgw.agent.engines import ADAPTERS, EngineError, adapter
from llmgw.modelkit.enginerules import RULES
from llmgw.wire.messages import ShardSpec

KEY = "sk-engine-0123456789abcdef"


def spec(engine: str, **kw: object) -> ShardSpec:
    fields: dict[str, object] = {
        "replica_id": "r-1",
        "engine": engine,
        "source": "hf:org/model",
        "port": 8123,
        "key": KEY,
        "fingerprint": "fp",
        "model": "tiny",
    }
    fields.update(kw)
    return ShardSpec(**fields)  # type: ignore[arg-type]


def test_registry_and_lookup() -> None:
    assert sorted(ADAPTERS) == ["freetoken", "llama.cpp", "sglang", "tensorrt-llm", "vllm"]
    assert all(a.name == name for name, a in ADAPTERS.items())
    assert adapter("vllm") is ADAPTERS["vllm"]
    with pytest.raises(EngineError, match=r"'tgi'.*llama\.cpp, sglang, tensorrt-llm, vllm"):
        adapter("tgi")


# --- llama.cpp -----------------------------------------------------------------------


def test_llamacpp_command_on_cpu() -> None:
    s = spec("llama.cpp", cpu_cores=6, args=["-c", "4096"])
    argv = adapter("llama.cpp").command("/opt/llama/llama-server", s, "/w/m.gguf", "0.0.0.0")
    assert argv == [
        "/opt/llama/llama-server",
        *("-m", "/w/m.gguf", "--host", "0.0.0.0", "--port", "8123", "--alias", "tiny"),
        *("-t", "6", "--metrics", "--verbosity", "4", "-c", "4096"),
    ]
    assert "--n-gpu-layers" not in argv
    assert KEY not in " ".join(argv)


def test_llamacpp_is_given_the_projector_the_node_found() -> None:
    llama = adapter("llama.cpp")
    assert "--mmproj" not in llama.command("llama-server", spec("llama.cpp"), "/w/m.gguf", "h")
    s = spec("llama.cpp", projector="/w/mmproj-F16.gguf", args=["-c", "512"])
    argv = llama.command("llama-server", s, "/w/m.gguf", "h")
    at = argv.index("--mmproj")
    assert argv[at + 1] == "/w/mmproj-F16.gguf"
    assert argv[-2:] == ["-c", "512"]  # the profile's own arguments stay last
    assert (llama.images, adapter("vllm").images, adapter("sglang").images) == (
        "projector",
        "config",
        "config",
    )


def test_llamacpp_command_on_a_card_offloads_every_layer() -> None:
    s = spec("llama.cpp", cards=["GPU-1234"], cpu_cores=None, model=None)
    argv = adapter("llama.cpp").command("llama-server", s, "/w/m.gguf", "127.0.0.1")
    assert argv[argv.index("--n-gpu-layers") + 1] == "999"
    assert "-t" not in argv and "--alias" not in argv  # not given: llama.cpp decides
    assert KEY not in " ".join(argv)


def test_llamacpp_splits_layers_across_the_cards_it_is_given() -> None:
    cards = ["GPU-a", "GPU-b", "GPU-c"]
    s = spec("llama.cpp", cards=cards)
    argv = adapter("llama.cpp").command("llama-server", s, "/w/m.gguf", "127.0.0.1")
    assert argv[argv.index("--split-mode") + 1] == "layer"
    assert argv[argv.index("--tensor-split") + 1] == "1,1,1"
    assert argv[argv.index("--n-gpu-layers") + 1] == "999"
    env = adapter("llama.cpp").environment(s)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b,GPU-c"  # those three alone
    adapter("llama.cpp").check(s)  # several cards are no longer refused
    one = adapter("llama.cpp").command("llama-server", spec("llama.cpp", cards=["GPU-a"]), "m", "h")
    assert "--split-mode" not in one and "--tensor-split" not in one


def test_llamacpp_environment_carries_the_key() -> None:
    env = adapter("llama.cpp").environment(spec("llama.cpp", cards=["0"]))
    assert env == {"LLAMA_API_KEY": KEY, "CUDA_VISIBLE_DEVICES": "0"}
    # No card: no card visible, rather than every card on the node.
    assert adapter("llama.cpp").environment(spec("llama.cpp"))["CUDA_VISIBLE_DEVICES"] == ""


def test_no_key_means_no_key_variable_or_argument() -> None:
    for name in ("llama.cpp", "vllm"):
        assert ADAPTERS[name].key_env not in ADAPTERS[name].environment(spec(name, key=""))
    argv = adapter("sglang").command("python", spec("sglang", key=""), "/w/m", "h")
    assert "--api-key" not in argv


# --- vLLM -----------------------------------------------------------------------------


def test_vllm_command() -> None:
    s = spec("vllm", cards=["0", "1"], args=["--max-model-len", "8192"])
    argv = adapter("vllm").command("/envs/vllm/bin/vllm", s, "/w/model", "0.0.0.0")
    assert argv == [
        *("/envs/vllm/bin/vllm", "serve", "/w/model", "--host", "0.0.0.0", "--port", "8123"),
        *("--served-model-name", "tiny", "--tensor-parallel-size", "2"),
        *("--load-format", "safetensors", "--max-model-len", "8192"),
    ]
    assert KEY not in " ".join(argv)


def test_vllm_load_format_follows_pickle_rule_and_gguf() -> None:
    vllm = adapter("vllm")
    assert "--load-format" not in vllm.command("v", spec("vllm", allow_pickle=True), "/w", "h")
    assert "--load-format" not in vllm.command("v", spec("vllm"), "/w/m.Q4_K_M.gguf", "h")
    argv = vllm.command("v", spec("vllm"), "/w", "h")
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"  # never 0


def test_vllm_environment() -> None:
    env = adapter("vllm").environment(spec("vllm", cards=["0", "1"]))
    assert env["VLLM_API_KEY"] == KEY
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["HF_HUB_OFFLINE"] == "1"  # the agent fetched the model; vLLM fetches nothing


# --- SGLang ---------------------------------------------------------------------------


def test_sglang_command_takes_the_key_as_argument_only() -> None:
    s = spec("sglang", cards=["0", "1", "2", "3"])
    argv = adapter("sglang").command("/envs/sglang/bin/python", s, "/w/model", "0.0.0.0")
    assert argv == [
        *("/envs/sglang/bin/python", "-m", "sglang.launch_server", "--model-path", "/w/model"),
        *("--host", "0.0.0.0", "--port", "8123", "--served-model-name", "tiny"),
        *("--tp-size", "4", "--load-format", "safetensors", "--api-key", KEY),
        "--enable-metrics",
    ]
    env = adapter("sglang").environment(s)
    assert KEY not in env.values()
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_our_own_flags_pass_each_engines_refusal_check() -> None:
    # The refusal reads only the profile's arguments; ours are appended by command().
    # The engines that run on cards only are given one.
    for name in ADAPTERS:
        cards = [] if RULES[name].runs_on_cpu else ["GPU-1"]
        adapter(name).check(spec(name, args=[], cards=cards))


# --- readiness, metrics and versions --------------------------------------------------


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_readiness_rule(name: str) -> None:
    a = adapter(name)
    assert a.health_path == "/health" and a.metrics_path == "/metrics"
    assert a.ready(200, b"")  # vLLM and SGLang: empty 200 when ready
    assert a.ready(200, b'{"status":"ok"}')  # llama.cpp
    assert not a.ready(503, b'{"error":{"code":503,"message":"Loading model"}}')
    assert not a.ready(200, b'{"status":"loading model"}')  # 200 that is still loading
    assert not a.ready(500, b"")


def test_version_reading() -> None:
    llama = adapter("llama.cpp")
    out = (
        "ggml_cuda_init: found 1 CUDA devices:\n"
        "version: 6123 (79c1160b)\n"
        "built with cc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0 for x86_64-linux-gnu\n"
    )
    assert llama.parse_version(out) == "b6123"
    assert llama.parse_version("version: 0 (unknown)\nbuilt with cc for x\n") is None
    assert llama.version_command("/x/llama-server") == ["/x/llama-server", "--version"]
    assert adapter("vllm").parse_version("INFO 01-01 x\n0.10.1.1\n") == "0.10.1.1"
    assert adapter("sglang").version_command("/e/python")[:2] == ["/e/python", "-c"]


def test_llamacpp_parses_verbosity_4_device_list_of_newer_builds() -> None:
    from llmgw.agent.engines.llamacpp import parse_startup

    lines = [
        "--- llmgw: starting /opt/llama-server at Wed Dec  2 16:00:00 2026",
        "0.00.003.344 I cmn  common_param: device_info:",
        "0.00.003.350 I cmn  common_param:   - CUDA0   : NVIDIA H200 (143000 MiB, 142000 MiB free)",
        "0.00.003.353 I cmn  common_param:   - CPU     : AMD EPYC (24105 MiB, 24105 MiB free)",
        "0.00.009.000 I load_tensors: offloaded 3/3 layers to GPU",
    ]
    got = parse_startup(lines)
    assert got.backend == "CUDA" and got.devices == ["CUDA0 (NVIDIA H200)"]
    assert (got.offloaded_layers, got.total_layers) == (3, 3)
