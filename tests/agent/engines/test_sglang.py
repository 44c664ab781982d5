"""SGLang's adapter on its own (``agent/engines/sglang.py``), for a whole replica: the
command line (the interpreter running ``sglang.launch_server``, the cards as tensor
parallelism, the key as ``--api-key`` since SGLang reads it nowhere else, metrics on,
the profile's arguments last), the environment without the key, the version command,
and ``--dist-init-addr`` as SGLang reads it. Replicas spanning nodes are in
test_multinode_commands.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.agent.engines import EngineError
from llmgw.agent.engines.sglang import MNNVL_FROM, SglangAdapter, dist_init_addr
from llmgw.wire.messages import GroupSpec, ShardSpec

PYTHON = "/envs/sglang/bin/python"


def spec(**kw: object) -> ShardSpec:
    fields: dict[str, object] = {
        "replica_id": "m.default.0123abcd",
        "engine": "sglang",
        "source": "hf:org/m",
        "port": 41000,
        "key": "llmgw-engine-abc",
        "fingerprint": "fp",
    }
    fields.update(kw)
    return ShardSpec(**fields)  # type: ignore[arg-type]


def test_a_whole_replica_runs_launch_server_with_its_key_and_metrics() -> None:
    s = spec(model="qwen", cards=["GPU-a", "GPU-b"], args=["--context-length", "8192"])
    argv = SglangAdapter().command(PYTHON, s, "/w/qwen", "0.0.0.0")
    assert argv == [
        *(PYTHON, "-m", "sglang.launch_server", "--model-path", "/w/qwen"),
        *("--host", "0.0.0.0", "--port", "41000", "--served-model-name", "qwen"),
        *("--tp-size", "2", "--load-format", "safetensors"),
        *("--api-key", "llmgw-engine-abc", "--enable-metrics"),
        *("--context-length", "8192"),
    ]


def test_no_key_no_name_no_cards_and_pickles_allowed() -> None:
    s = spec(key="", allow_pickle=True)
    argv = SglangAdapter().command(PYTHON, s, "/w/m", "127.0.0.1")
    assert argv == [
        *(PYTHON, "-m", "sglang.launch_server", "--model-path", "/w/m"),
        *("--host", "127.0.0.1", "--port", "41000", "--tp-size", "1", "--enable-metrics"),
    ]


def test_the_key_is_never_put_in_the_environment() -> None:
    env = SglangAdapter().environment(spec(cards=["GPU-a"]))
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def test_its_version_is_asked_of_the_package() -> None:
    sglang = SglangAdapter()
    argv = sglang.version_command(PYTHON)
    assert argv == [PYTHON, "-c", "import sglang; print(sglang.__version__)"]
    assert sglang.parse_version("some warning\n0.5.5\n") == "0.5.5"


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("10.0.0.1", "10.0.0.1:29650"),
        ("leader.example", "leader.example:29650"),
        ("fd00::1", "[fd00::1]:29650"),
        ("[fd00::1]", "[fd00::1]:29650"),
    ],
)
def test_dist_init_addr_brackets_an_ipv6_address(host: str, expected: str) -> None:
    assert dist_init_addr(host, 29650) == expected


def test_an_old_sglang_is_refused_only_where_nvlink_between_trays_is_needed() -> None:
    sglang = SglangAdapter()
    old = "0.5.4"
    group = GroupSpec(rank=0, size=2, leader="10.0.0.1", rendezvous_port=29650, nvlink=True)
    with pytest.raises(EngineError, match="run 0.5.5 or later"):
        sglang.check(spec(engine_version=old, group=group))
    # A whole replica, or a group over the network, runs on it.
    sglang.check(spec(engine_version=old))
    sglang.check(spec(engine_version=old, group=replace(group, nvlink=False)))
    sglang.check(spec(engine_version=".".join(map(str, MNNVL_FROM)), group=group))
