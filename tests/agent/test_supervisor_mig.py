"""A replica placed on a MIG instance: the engine the supervisor starts is given that
instance, ``CUDA_VISIBLE_DEVICES=MIG-<uuid>``, read back from the started process's own
environment (``/proc/<pid>/environ``). The card is the NVML fake in MIG mode, read as
the agent reads it (``read_nvml``), so the UUID placed is the one a node reports. The
stand-in llama-server sees a CUDA device only when it is given a MIG device, as CUDA
does on a card in MIG mode, and says so in llama-server's start-up words."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.agent.discovery import FakeCard, FakeNvml, read_nvml
from llmgw.agent.supervisor import Supervisor
from llmgw.wire.hardware import GPU
from llmgw.wire.messages import Message, ShardSpec
from llmgw.wire.states import ShardState
from tests.e2e.cluster import free_port
from tests.support.engines import StandInEngines

MiB = 1 << 20
PARENT = "GPU-d41f09c2-5e77-4a1b-8c3e-7f20b6a91c3d"
INSTANCES = [
    {
        "uuid": "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158",
        "memory_total": 40192 * MiB,
        "memory_used": 13 * MiB,
        "gi_id": 1,
        "ci_id": 0,
        "profile": "3g.40gb",
    },
    {
        "uuid": "MIG-c4819f07-3a6e-5d21-b9f4-60e2a7c31d8b",
        "memory_total": 19968 * MiB,
        "memory_used": 0,
        "gi_id": 5,
        "ci_id": 0,
        "profile": "2g.20gb",
    },
]

# llama-server as it starts on CUDA: one device per MIG device it is given, none else.
LLAMA_SERVER = f"""#!{sys.executable}
import http.server, os, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
if visible.startswith("MIG-"):
    print("ggml_cuda_init: found 1 CUDA devices:")
    print("  Device 0: NVIDIA A100-SXM4-80GB MIG 3g.40gb, compute capability 8.0, VMM: yes")
    print("load_tensors: offloaded 3/3 layers to GPU")
else:
    print("ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected")
    print("system_info: n_threads = 4 (n_threads_batch = 4) / 4 | CPU : SSE3 = 1 |")
sys.stdout.flush()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{{"status":"ok"}}')
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


class Weights:
    def __init__(self, model: Path) -> None:
        self.model = model

    async def fetch(self, source: str, **kw: object) -> Path:
        return self.model


def mig_node() -> list[GPU]:
    """The node's cards as the agent reads them: an A100 in MIG mode with two instances."""
    nvml = FakeNvml(
        [
            FakeCard(
                PARENT,
                "NVIDIA A100-SXM4-80GB",
                memory_total=81920 * MiB,
                memory_used=13 * MiB,
                compute_capability=(8, 0),
                figures={"mig_mode": True, "mig_instances": INSTANCES},
            )
        ]
    )
    nvml.init()
    gpus, warnings = read_nvml(nvml)
    assert warnings == []
    return gpus


def environ(pid: int) -> dict[str, str]:
    """The environment the process was started with, as the kernel keeps it."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode() for k, v in pairs}


async def until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
def supervisor(tmp_path: Path) -> Supervisor:
    binary = tmp_path / "llama-server"
    binary.write_text(LLAMA_SERVER)
    binary.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")

    def emit(msg: Message) -> None:
        pass

    return Supervisor(
        tmp_path / "shards", StandInEngines(binary), Weights(model), emit, host="127.0.0.1"
    )


def spec(cards: list[str]) -> ShardSpec:
    return ShardSpec(
        replica_id="m.default.0123abcd",
        engine="llama.cpp",
        source="/models/m.gguf",
        port=free_port(),
        key="k",
        fingerprint="f",
        cards=cards,
    )


async def test_the_engine_on_a_mig_instance_is_given_that_instance(
    supervisor: Supervisor,
) -> None:
    gpus = mig_node()
    assert [(g.uuid, g.mig_parent, g.mig_profile) for g in gpus] == [
        (INSTANCES[0]["uuid"], PARENT, "3g.40gb"),
        (INSTANCES[1]["uuid"], PARENT, "2g.20gb"),
    ]
    placed = spec([gpus[0].uuid])  # what the scheduler gives: the instance's UUID
    try:
        supervisor.start(placed)
        shard = supervisor.shards[placed.replica_id]
        await until(lambda: shard.state in (ShardState.READY, ShardState.FAILED), "the start")
        assert shard.state == ShardState.READY, shard.reason
        assert shard.pid is not None
        env = environ(shard.pid)
        assert env["CUDA_VISIBLE_DEVICES"] == "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158"
        assert env["LLAMA_API_KEY"] == "k"
        # What the engine found with it: the MIG device, every layer on it.
        assert shard.compute is not None
        assert shard.compute.devices == ["CUDA0 (NVIDIA A100-SXM4-80GB MIG 3g.40gb)"]
        assert (shard.compute.offloaded_layers, shard.compute.total_layers) == (3, 3)
    finally:
        await supervisor.stop(placed.replica_id)


async def test_a_shard_on_two_mig_instances_fails_saying_why(supervisor: Supervisor) -> None:
    gpus = mig_node()
    placed = spec([g.uuid for g in gpus])
    try:
        supervisor.start(placed)
        shard = supervisor.shards[placed.replica_id]
        await until(lambda: shard.state == ShardState.FAILED, "the refusal")
        assert shard.pid is None  # refused before anything started
        assert "CUDA gives a process one MIG device" in shard.reason
        assert "Give the profile 1 card" in shard.reason
    finally:
        await supervisor.stop(placed.replica_id)
