"""FreeToken's and TensorRT-LLM's adapters on their own (``agent/engines/freetoken.py``,
``tensorrt.py``): the command lines (the model directory, the address, the card or the
cards as tensor parallelism, the served name, the profile's arguments last), the
environment (FreeToken's key in FREETOKEN_API_KEY, the hub offline), the readiness
rule, the version read, and what each refuses before anything starts."""

from __future__ import annotations

import pytest

from llmgw.agent.engines import EngineError, adapter
from llmgw.wire.messages import GroupSpec, ShardSpec

KEY = "llmgw-engine-abc"


def spec(engine: str, **kw: object) -> ShardSpec:
    fields: dict[str, object] = {
        "replica_id": "m.default.0123abcd",
        "engine": engine,
        "source": "hf:org/m",
        "port": 41000,
        "key": KEY,
        "fingerprint": "fp",
        "model": "qwen",
        "cards": ["GPU-a"],
    }
    fields.update(kw)
    return ShardSpec(**fields)  # type: ignore[arg-type]


def test_freetoken_command_line() -> None:
    s = spec("freetoken", args=["--moe-strategy", "hybrid", "--max-seq-len-override", "8192"])
    argv = adapter("freetoken").command("/envs/ft/bin/ft", s, "/w/qwen", "0.0.0.0")
    assert argv == [
        *("/envs/ft/bin/ft", "serve", "--model-path", "/w/qwen"),
        *("--host", "0.0.0.0", "--port", "41000", "--gpu", "0"),
        *("--served-model-name", "qwen"),
        *("--moe-strategy", "hybrid", "--max-seq-len-override", "8192"),
    ]
    assert KEY not in argv


def test_freetoken_environment_has_the_key_its_card_and_the_hub_shut() -> None:
    s = spec("freetoken", env={"NCCL_DEBUG": "INFO"})
    env = adapter("freetoken").environment(s)
    assert env["FREETOKEN_API_KEY"] == KEY
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a"
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["NCCL_DEBUG"] == "INFO"
    # No key (a cluster without a store for it) is no variable, not an empty one.
    assert "FREETOKEN_API_KEY" not in adapter("freetoken").environment(spec("freetoken", key=""))


@pytest.mark.parametrize(
    ("status", "body", "ready"),
    [
        (200, b'{"status":"ok","model":"m","maintenance":"serving"}', True),
        (200, b'{"status":"ok","maintenance":"rebuilding"}', True),
        (200, b'{"status":"loading","phase":"weights","progress":{}}', False),
        (200, b'{"status":"error","message":"worker 0 died"}', False),
        (503, b"", False),
        (200, b"", True),
    ],
)
def test_freetoken_readiness(status: int, body: bytes, ready: bool) -> None:
    assert adapter("freetoken").ready(status, body) is ready


def test_freetoken_version() -> None:
    assert adapter("freetoken").parse_version("freetoken version 0.2.1\n") == "0.2.1"
    assert adapter("freetoken").version_command("/e/ft") == ["/e/ft", "--version"]


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"cards": []}, "freetoken runs on cards only; give the profile 1 card"),
        ({"cards": ["GPU-a", "GPU-b"]}, "freetoken runs on one card"),
        ({"args": ["--gpu", "1"]}, "freetoken argument '--gpu' is not allowed"),
        ({"args": ["--mmproj", "/x.gguf"]}, "freetoken argument '--mmproj' is not allowed"),
        ({"env": {"FREETOKEN_MMPROJ": "x"}}, "FREETOKEN_MMPROJ names a file"),
        (
            {"group": GroupSpec(rank=0, size=2, leader="10.0.0.1", rendezvous_port=41001)},
            "llmgw runs a freetoken replica on one node",
        ),
    ],
)
def test_freetoken_refusals(kw: dict[str, object], words: str) -> None:
    with pytest.raises(EngineError, match=words):
        adapter("freetoken").check(spec("freetoken", **kw))


def test_freetoken_refuses_a_gguf_file() -> None:
    with pytest.raises(EngineError, match="serve the GGUF with llama.cpp"):
        adapter("freetoken").command("ft", spec("freetoken"), "/w/m.gguf", "127.0.0.1")


def test_tensorrt_command_line_takes_its_cards_as_tensor_parallelism() -> None:
    s = spec("tensorrt-llm", cards=["GPU-a", "GPU-b", "GPU-c", "GPU-d"], args=["--ep_size", "4"])
    argv = adapter("tensorrt-llm").command("/envs/trt/bin/trtllm-serve", s, "/w/q", "0.0.0.0")
    assert argv == [
        *("/envs/trt/bin/trtllm-serve", "/w/q", "--host", "0.0.0.0", "--port", "41000"),
        *("--backend", "pytorch", "--tp_size", "4", "--ep_size", "4"),
    ]
    env = adapter("tensorrt-llm").environment(s)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b,GPU-c,GPU-d"
    assert env["HF_HUB_OFFLINE"] == "1"
    # trtllm-serve takes no key: it is in neither (the firewall keeps its port).
    assert KEY not in argv and KEY not in env.values()


def test_tensorrt_version_is_asked_of_its_python() -> None:
    engine = adapter("tensorrt-llm")
    assert engine.version_command("/envs/trt/bin/trtllm-serve") == [
        *("/envs/trt/bin/python", "-c", "import tensorrt_llm; print(tensorrt_llm.__version__)")
    ]
    said = "[TensorRT-LLM] TensorRT LLM version: 1.0.0\n1.0.0\n"
    assert engine.parse_version(said) == "1.0.0"


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"cards": []}, "tensorrt-llm runs on cards only"),
        ({"args": ["--tp_size", "2"]}, "tensorrt-llm argument '--tp_size' is not allowed"),
        ({"args": ["--extra_llm_api_options", "/x.yaml"]}, "'--extra_llm_api_options'"),
        ({"args": ["--trust_remote_code"]}, "'--trust_remote_code' is not allowed"),
        ({"args": ["--tokenizer", "org/tok"]}, "'--tokenizer' is not allowed"),
        ({"env": {"LD_LIBRARY_PATH": "x"}}, "LD_LIBRARY_PATH is set by llmgw"),
        (
            {"group": GroupSpec(rank=1, size=2, leader="10.0.0.1", rendezvous_port=41001)},
            "one node",
        ),
    ],
)
def test_tensorrt_refusals(kw: dict[str, object], words: str) -> None:
    with pytest.raises(EngineError, match=words):
        adapter("tensorrt-llm").check(spec("tensorrt-llm", **kw))
