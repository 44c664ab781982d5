"""vLLM's adapter on its own (``agent/engines/vllm.py``), for a whole replica: the
command line (the model's name, the cards as tensor parallelism, safetensors only unless
pickles are allowed or the file is GGUF, the adapters, the profile's arguments last),
the environment (key, hub offline, no usage reports), and ``below``, which orders
versions as PEP 440 does. Replicas spanning nodes are in test_multinode_commands.py."""

from __future__ import annotations

import pytest

from llmgw.agent.engines import EngineError
from llmgw.agent.engines.vllm import MULTINODE_SINCE, VllmAdapter, below, load_format
from llmgw.wire.messages import AdapterSpec, ShardSpec

BINARY = "/envs/vllm/bin/vllm"


def spec(**kw: object) -> ShardSpec:
    fields: dict[str, object] = {
        "replica_id": "m.default.0123abcd",
        "engine": "vllm",
        "source": "hf:org/m",
        "port": 41000,
        "key": "llmgw-engine-abc",
        "fingerprint": "fp",
    }
    fields.update(kw)
    return ShardSpec(**fields)  # type: ignore[arg-type]


def test_the_plainest_replica_runs_on_one_card_of_safetensors() -> None:
    argv = VllmAdapter().command(BINARY, spec(), "/w/m", "127.0.0.1")
    assert argv == [
        *(BINARY, "serve", "/w/m", "--host", "127.0.0.1", "--port", "41000"),
        *("--tensor-parallel-size", "1", "--load-format", "safetensors"),
    ]


def test_the_models_name_cards_adapters_and_arguments_in_their_order() -> None:
    adapters = [
        AdapterSpec("sql", "hf:org/sql-lora", path="/w/loras/sql"),
        AdapterSpec("chat", "hf:org/chat-lora", path="/w/loras/chat"),
    ]
    s = spec(
        model="qwen",
        cards=["GPU-a", "GPU-b", "GPU-c", "GPU-d"],
        adapters=adapters,
        args=["--max-model-len", "8192", "--gpu-memory-utilization", "0.85"],
    )
    argv = VllmAdapter().command(BINARY, s, "/w/qwen", "0.0.0.0")
    assert argv == [
        *(BINARY, "serve", "/w/qwen", "--host", "0.0.0.0", "--port", "41000"),
        *("--served-model-name", "qwen", "--tensor-parallel-size", "4"),
        *("--load-format", "safetensors"),
        *("--enable-lora", "--lora-modules", "sql=/w/loras/sql", "chat=/w/loras/chat"),
        *("--max-model-len", "8192", "--gpu-memory-utilization", "0.85"),
    ]
    # The key goes by the environment only.
    assert "llmgw-engine-abc" not in argv


def test_safetensors_only_unless_pickles_are_allowed_or_the_file_is_gguf() -> None:
    assert load_format(spec(), "/w/m") == ["--load-format", "safetensors"]
    assert load_format(spec(allow_pickle=True), "/w/m") == []
    assert load_format(spec(), "/w/m/model-Q4_K_M.gguf") == []
    pickled = VllmAdapter().command(BINARY, spec(allow_pickle=True), "/w/m", "h")
    assert "--load-format" not in pickled


def test_an_adapter_not_fetched_is_refused_by_name() -> None:
    s = spec(adapters=[AdapterSpec("sql", "hf:org/sql-lora")])
    with pytest.raises(EngineError, match=r"LoRA adapter sql \(hf:org/sql-lora\) was not fetched"):
        VllmAdapter().command(BINARY, s, "/w/m", "h")


def test_the_environment_holds_the_key_keeps_the_hub_shut_and_reports_nothing() -> None:
    env = VllmAdapter().environment(spec(cards=["GPU-a"]))
    assert env == {
        "VLLM_API_KEY": "llmgw-engine-abc",
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    # No key (a cluster with none to give): none set, rather than an empty one demanded.
    assert "VLLM_API_KEY" not in VllmAdapter().environment(spec(key=""))


def test_a_whole_replica_is_checked_like_any_engines() -> None:
    vllm = VllmAdapter()
    vllm.check(spec(cards=["GPU-a", "GPU-b"], engine_version="0.8.0"))
    with pytest.raises(EngineError, match="not allowed"):
        vllm.check(spec(args=["--download-dir", "/tmp/x"]))


@pytest.mark.parametrize(
    ("version", "floor", "is_below"),
    [
        ("0.11.0", (0, 11, 1), True),
        ("0.9", (0, 11, 1), True),
        ("v0.10.2", (0, 11, 1), True),
        ("0.11.1", (0, 11, 1), False),
        ("0.11.1.0", (0, 11, 1), False),
        ("0.11", (0, 11, 0), False),
        ("0.12.0", (0, 11, 1), False),
        ("1.0", (0, 11, 1), False),
        ("0.11.1.post1", (0, 11, 1), False),
        ("0.11.1+cu129", (0, 11, 1), False),
        # A pre-release of the floor comes before it.
        ("0.11.1rc1", (0, 11, 1), True),
        ("0.11.1.dev42", (0, 11, 1), True),
        ("0.11.1-beta", (0, 11, 1), True),
        ("0.11.1a0", (0, 11, 1), True),
        # Not a version at all: not known to be below.
        ("main", (0, 11, 1), False),
        ("", (0, 11, 1), False),
    ],
)
def test_below_orders_versions_as_pep_440_does(
    version: str, floor: tuple[int, ...], is_below: bool
) -> None:
    assert below(version, floor) is is_below


def test_spanning_nodes_without_ray_came_in_0_11_1() -> None:
    assert MULTINODE_SINCE == (0, 11, 1)
