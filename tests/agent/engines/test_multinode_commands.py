"""vLLM and SGLang shards of one replica spanning nodes: the leader's and a worker's
exact command line, their environment with and without one NVLink domain, the shards
refused (a vLLM too old to span nodes without Ray, a group without a rendezvous port)
and the multi-node flags refused from a profile's arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.engines import EngineError, adapter
from llmgw.modelkit.enginerules import RuleError, rules
from llmgw.wire.messages import GroupSpec, ShardSpec

KEY = "sk-engine-0123456789abcdef"
CARDS = [f"GPU-{i}" for i in range(8)]
LEADER = "10.0.0.1"
PORT = 29650


def group(rank: int, **kw: object) -> GroupSpec:
    fields: dict[str, object] = {
        "rank": rank,
        "size": 2,
        "leader": LEADER,
        "rendezvous_port": PORT,
        "peers": [LEADER, "10.0.0.2"],
        "bind": LEADER if rank == 0 else "10.0.0.2",
    }
    fields.update(kw)
    return GroupSpec(**fields)  # type: ignore[arg-type]


def spec(engine: str, g: GroupSpec | None, **kw: object) -> ShardSpec:
    fields: dict[str, object] = {
        "replica_id": "r-1",
        "engine": engine,
        "source": "hf:org/big",
        "port": 8123,
        "key": KEY,
        "fingerprint": "fp",
        "model": "big",
        "cards": CARDS,
        "args": ["--max-model-len", "8192"] if engine == "vllm" else ["--context-length", "8192"],
        "group": g,
    }
    fields.update(kw)
    return ShardSpec(**fields)  # type: ignore[arg-type]


# --- vLLM -----------------------------------------------------------------------------

VLLM_HEAD = [
    *("/envs/vllm/bin/vllm", "serve", "/w/big", "--host", "0.0.0.0", "--port", "8123"),
    *("--served-model-name", "big", "--tensor-parallel-size", "8"),
    *("--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp"),
    *("--nnodes", "2", "--node-rank", "0", "--master-addr", LEADER, "--master-port", "29650"),
]
VLLM_TAIL = ["--load-format", "safetensors", "--max-model-len", "8192"]


def test_vllm_leader_command() -> None:
    vllm = adapter("vllm")
    s = spec("vllm", group(0), engine_version="0.11.1")
    argv = vllm.command("/envs/vllm/bin/vllm", s, "/w/big", "0.0.0.0")
    assert argv == [*VLLM_HEAD, *VLLM_TAIL]
    assert "--headless" not in argv
    assert KEY not in " ".join(argv)
    vllm.check(s)  # what the supervisor asks before installing anything


def test_vllm_worker_command_is_headless() -> None:
    vllm = adapter("vllm")
    s = spec("vllm", group(1), engine_version="0.11.2")
    argv = vllm.worker_command("/envs/vllm/bin/vllm", s, "/w/big", "10.0.0.2")
    assert argv == [
        *("/envs/vllm/bin/vllm", "serve", "/w/big", "--host", "10.0.0.2", "--port", "8123"),
        *("--served-model-name", "big", "--tensor-parallel-size", "8"),
        *("--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp"),
        *("--nnodes", "2", "--node-rank", "1", "--master-addr", LEADER),
        *("--master-port", "29650", "--headless"),
        *("--load-format", "safetensors", "--max-model-len", "8192"),
    ]
    assert vllm.command("/envs/vllm/bin/vllm", s, "/w/big", "10.0.0.2") == argv
    # It serves no HTTP: up is its process running; it loads its stage of the weights.
    assert vllm.worker_probe == "process"
    assert vllm.worker_needs_weights is True


def test_vllm_without_group_is_unchanged() -> None:
    s = spec("vllm", None, cards=["0", "1"])
    argv = adapter("vllm").command("/envs/vllm/bin/vllm", s, "/w/model", "0.0.0.0")
    assert argv == [
        *("/envs/vllm/bin/vllm", "serve", "/w/model", "--host", "0.0.0.0", "--port", "8123"),
        *("--served-model-name", "big", "--tensor-parallel-size", "2"),
        *("--load-format", "safetensors", "--max-model-len", "8192"),
    ]


@pytest.mark.parametrize("version", [None, "0.11.1", "0.11.1.post1", "0.11.1+cu129", "0.12.0"])
def test_vllm_versions_that_span_nodes(version: str | None) -> None:
    argv = adapter("vllm").command("v", spec("vllm", group(0), engine_version=version), "/w", "h")
    assert argv[argv.index("--nnodes") + 1] == "2"


@pytest.mark.parametrize("version", ["0.11.0", "0.10.2", "0.9", "0.11.1rc1", "0.11.1.dev42"])
def test_vllm_too_old_to_span_nodes_is_refused(version: str) -> None:
    vllm = adapter("vllm")
    s = spec("vllm", group(0), engine_version=version)
    for call in (lambda: vllm.command("v", s, "/w", "h"), lambda: vllm.check(s)):
        with pytest.raises(EngineError) as caught:
            call()
        message = str(caught.value)
        assert f"vllm {version} " in message
        assert "Ray" in message
        assert "`llmgw ctl engines set vllm 0.11.1` or later" in message
    # A whole replica runs on that vLLM as before.
    whole = spec("vllm", None, engine_version=version)
    vllm.check(whole)
    assert "--nnodes" not in vllm.command("v", whole, "/w", "h")


def test_vllm_version_that_is_no_version_is_left_to_the_node() -> None:
    s = spec("vllm", group(1), engine_version="main")
    assert adapter("vllm").command("v", s, "/w", "h")[-5:] == ["--headless", *VLLM_TAIL]


# --- SGLang ---------------------------------------------------------------------------


def sglang_argv(rank: int, host: str) -> list[str]:
    return [
        *("/envs/sglang/bin/python", "-m", "sglang.launch_server", "--model-path", "/w/big"),
        *("--host", host, "--port", "8123", "--served-model-name", "big"),
        *("--tp-size", "16", "--nnodes", "2", "--node-rank", str(rank)),
        *("--dist-init-addr", "10.0.0.1:29650", "--load-format", "safetensors"),
        *("--api-key", KEY, "--enable-metrics", "--context-length", "8192"),
    ]


def test_sglang_leader_command() -> None:
    sglang = adapter("sglang")
    s = spec("sglang", group(0))
    argv = sglang.command("/envs/sglang/bin/python", s, "/w/big", "0.0.0.0")
    assert argv == sglang_argv(0, "0.0.0.0")
    sglang.check(s)


def test_sglang_worker_command_differs_only_in_rank() -> None:
    sglang = adapter("sglang")
    s = spec("sglang", group(1))
    argv = sglang.worker_command("/envs/sglang/bin/python", s, "/w/big", "10.0.0.2")
    assert argv == sglang_argv(1, "10.0.0.2")
    # Its stand-in server answers GET /health on --host/--port.
    assert sglang.worker_probe == "http"
    assert sglang.health_path == "/health"
    assert sglang.ready(200, b"")


def test_sglang_without_group_is_unchanged() -> None:
    s = spec("sglang", None, cards=["0", "1", "2", "3"], args=[])
    argv = adapter("sglang").command("/envs/sglang/bin/python", s, "/w/model", "0.0.0.0")
    assert argv == [
        *("/envs/sglang/bin/python", "-m", "sglang.launch_server", "--model-path", "/w/model"),
        *("--host", "0.0.0.0", "--port", "8123", "--served-model-name", "big"),
        *("--tp-size", "4", "--load-format", "safetensors", "--api-key", KEY),
        "--enable-metrics",
    ]


def test_sglang_ipv6_leader_is_bracketed() -> None:
    s = spec("sglang", group(1, leader="fd00::1"))
    argv = adapter("sglang").command("py", s, "/w", "h")
    assert argv[argv.index("--dist-init-addr") + 1] == "[fd00::1]:29650"


# --- environment ----------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("rank", [0, 1])
def test_environment_with_one_nvlink_domain(engine: str, rank: int) -> None:
    env = adapter(engine).environment(spec(engine, group(rank, nvlink=True)))
    assert env["NCCL_MNNVL_ENABLE"] == "1"
    assert env["NCCL_CUMEM_ENABLE"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(CARDS)
    assert env["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("g", [group(0), group(1), None], ids=["leader", "worker", "whole"])
def test_environment_without_nvlink_leaves_nccl_alone(engine: str, g: GroupSpec | None) -> None:
    env = adapter(engine).environment(spec(engine, g))
    assert "NCCL_MNNVL_ENABLE" not in env
    assert "NCCL_CUMEM_ENABLE" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0,GPU-1,GPU-2,GPU-3,GPU-4,GPU-5,GPU-6,GPU-7"


def test_vllm_environment_keys() -> None:
    env = adapter("vllm").environment(spec("vllm", group(1, nvlink=True)))
    assert env == {
        "VLLM_API_KEY": KEY,
        "CUDA_VISIBLE_DEVICES": ",".join(CARDS),
        "NCCL_MNNVL_ENABLE": "1",
        "NCCL_CUMEM_ENABLE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    sglang_env = adapter("sglang").environment(spec("sglang", group(0, nvlink=True)))
    assert KEY not in sglang_env.values()  # SGLang takes the key as --api-key only


# --- refused groups -------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_group_without_rendezvous_port_is_refused(engine: str) -> None:
    a = adapter(engine)
    s = spec(engine, group(0, rendezvous_port=None))
    with pytest.raises(EngineError, match=r"spans 2 nodes but was given no rendezvous port"):
        a.command("bin", s, "/w", "h")
    with pytest.raises(EngineError, match=r"no rendezvous port"):
        a.check(s)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(("rank", "size"), [(2, 2), (-1, 2), (0, 0)])
def test_rank_outside_the_group_is_refused(engine: str, rank: int, size: int) -> None:
    s = spec(engine, group(rank, size=size))
    with pytest.raises(EngineError, match=rf"rank {rank} is not in a group of {size} nodes"):
        adapter(engine).command("bin", s, "/w", "h")


# --- profile arguments ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--nnodes", "2"],
        ["--nnodes=2"],
        ["--nn", "2"],
        ["-n", "2"],
        ["-n2"],
        ["-n=2"],
        ["--node-rank", "1"],
        ["--node_rank", "1"],
        ["--node", "1"],
        ["-r", "1"],
        ["-r1"],
        ["--master-addr", "10.9.9.9"],
        ["--master-port", "1"],
        ["--master", "x"],
        ["--distributed-executor-backend", "ray"],
        ["--distributed_executor_backend=ray"],
        ["--distributed", "ray"],
        ["--headless"],
        ["--head"],
    ],
)
def test_vllm_profile_may_not_set_multinode_flags(args: list[str]) -> None:
    with pytest.raises(RuleError) as caught:
        rules("vllm").check(["--dtype", "bfloat16", *args], cards=8)
    assert f"vllm argument {args[0]!r} is not allowed" in str(caught.value)
    # The agent refuses the same arguments in a shard.
    s = spec("vllm", group(0), args=args)
    with pytest.raises(EngineError, match=rf"argument {args[0]!r} is not allowed"):
        adapter("vllm").check(s)


@pytest.mark.parametrize(
    "args",
    [
        ["--nnodes", "2"],
        ["--nnodes=2"],
        ["--nn", "2"],
        ["--node-rank", "1"],
        ["--node_rank=1"],
        ["--node", "1"],
        ["--dist-init-addr", "10.9.9.9:1"],
        ["--dist-init", "10.9.9.9:1"],
        ["--nccl-init-addr", "10.9.9.9:1"],
        ["--nccl-init", "10.9.9.9:1"],
        ["--nccl", "10.9.9.9:1"],  # --nccl-port or --nccl-init-addr: refused
    ],
)
def test_sglang_profile_may_not_set_multinode_flags(args: list[str]) -> None:
    with pytest.raises(RuleError) as caught:
        rules("sglang").check(["--mem-fraction-static", "0.8", *args], cards=8)
    assert f"sglang argument {args[0]!r} is not allowed" in str(caught.value)


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        # Harmless flags next to the refused ones still pass.
        ("vllm", ["--num-gpu-blocks-override", "100", "--no-enable-prefix-caching"]),
        ("vllm", ["--data-parallel-rank", "0", "-dpn", "0", "--disable-custom-all-reduce"]),
        ("vllm", ["-O3", "-q", "fp8", "--seed", "-1", "--max-num-batched-tokens", "8192"]),
        ("vllm", ["--api-server-count", "1", "-asc", "1"]),
        ("sglang", ["--nccl-port", "29700", "--dist-timeout", "600"]),
    ],
)
def test_neighbouring_flags_still_pass(engine: str, args: list[str]) -> None:
    rule = rules(engine)
    assert rule.refused_flag(args) is None
    rule.check(args, cards=8)


# --------------------------------------------------------------------------- llama.cpp


def llama_group(
    tmp_path: Path, rank: int, *, rpc: str | None = "ggml-rpc-server"
) -> tuple[str, ShardSpec]:
    """A llama-server binary in a folder (with its RPC server when ``rpc`` names one)
    and the spec of one node of a two-node replica."""
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    if rpc:
        (tmp_path / rpc).write_text("#!/bin/sh\n")
        (tmp_path / rpc).chmod(0o755)
    group = GroupSpec(
        rank=rank,
        size=2,
        leader="10.0.0.1",
        workers=["10.0.0.2:41003"],
        peers=["10.0.0.1", "10.0.0.2"],
        bind="10.0.0.1" if rank == 0 else "10.0.0.2",
    )
    spec = ShardSpec(
        replica_id="m.default.0123abcd" + (f"~{rank}" if rank else ""),
        engine="llama.cpp",
        source="/m.gguf",
        port=41001 if rank == 0 else 41003,
        key="k",
        fingerprint="f",
        model="m",
        cpu_cores=4,
        group=group,
    )
    return str(server), spec


def test_llama_cpp_leader_names_its_workers_and_puts_every_layer_on_them(tmp_path: Path) -> None:
    binary, spec = llama_group(tmp_path, 0)
    argv = adapter("llama.cpp").command(binary, spec, "/w/m.gguf", "0.0.0.0")
    assert argv[argv.index("--rpc") + 1] == "10.0.0.2:41003"
    assert argv[argv.index("--n-gpu-layers") + 1] == "999"
    assert argv[:7] == [binary, "-m", "/w/m.gguf", "--host", "0.0.0.0", "--port", "41001"]


@pytest.mark.parametrize("name", ["ggml-rpc-server", "rpc-server"])
def test_llama_cpp_worker_is_the_builds_rpc_server_on_its_nodes_address(
    tmp_path: Path, name: str
) -> None:
    binary, spec = llama_group(tmp_path, 1, rpc=name)
    engine = adapter("llama.cpp")
    argv = engine.worker_command(binary, spec, "", "0.0.0.0")
    assert argv == [str(tmp_path / name), "-H", "10.0.0.2", "-p", "41003", "-t", "4"]
    assert engine.worker_probe == "tcp" and not engine.worker_needs_weights


def test_llama_cpp_without_an_rpc_server_says_which_build_is_needed(tmp_path: Path) -> None:
    binary, spec = llama_group(tmp_path, 0, rpc=None)
    with pytest.raises(EngineError) as caught:
        adapter("llama.cpp").command(binary, spec, "/w/m.gguf", "0.0.0.0")
    assert "no RPC server beside" in str(caught.value) and "GGML_RPC=ON" in str(caught.value)


@pytest.mark.parametrize(("version", "refused"), [("0.5.4", True), ("0.5.5", False), (None, False)])
def test_sglang_before_0_5_5_is_refused_nvlink_between_trays(
    version: str | None, refused: bool
) -> None:
    group = GroupSpec(rank=0, size=2, leader="10.0.0.1", rendezvous_port=41010, nvlink=True)
    spec = ShardSpec(
        replica_id="m.default.0123abcd",
        engine="sglang",
        source="/m",
        port=41001,
        key="k",
        fingerprint="f",
        cards=["GPU-1"],
        engine_version=version,
        group=group,
    )
    if refused:
        with pytest.raises(EngineError) as caught:
            adapter("sglang").check(spec)
        assert "0.5.5 or later" in str(caught.value) and "NCCL_CUMEM_ENABLE=0" in str(caught.value)
    else:
        adapter("sglang").check(spec)
        assert adapter("sglang").environment(spec)["NCCL_CUMEM_ENABLE"] == "1"
