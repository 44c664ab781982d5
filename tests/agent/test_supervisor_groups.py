"""The supervisor running the shards of a replica spanning nodes, with stand-in llama.cpp
binaries (scripts that behave as the real ones do at their edges): a worker runs the
build's RPC server on its node's address without fetching the weights and is up once
its port takes connections; the leader waits for its workers before it starts, names
them in ``--rpc``, and reports its rank; a worker's peers are what the firewall lets in."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from llmgw.agent.supervisor import Supervisor
from llmgw.wire.messages import GroupSpec, Message, ShardSpec, ShardStatus
from llmgw.wire.states import ShardState
from tests.e2e.cluster import free_port
from tests.support.engines import StandInEngines

RPC_SERVER = f"""#!{sys.executable}
import socket, sys
args = sys.argv[1:]
host, port = args[args.index("-H") + 1], int(args[args.index("-p") + 1])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port))
s.listen()
while True:
    s.accept()[0].close()
"""

LLAMA_SERVER = f"""#!{sys.executable}
import http.server, socket, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
for endpoint in args[args.index("--rpc") + 1].split(","):
    host, _, p = endpoint.rpartition(":")
    socket.create_connection((host, int(p)), timeout=2).close()  # as llama-server does
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
        self.fetched: list[str] = []

    async def fetch(self, source: str, **kw: object) -> Path:
        self.fetched.append(str(kw["replica_id"]))
        return self.model


@pytest.fixture
def build(tmp_path: Path) -> Path:
    folder = tmp_path / "build"
    folder.mkdir()
    for name, text in (("llama-server", LLAMA_SERVER), ("ggml-rpc-server", RPC_SERVER)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder / "llama-server"


def spec(rank: int, leader_port: int, worker_port: int) -> ShardSpec:
    group = GroupSpec(
        rank=rank,
        size=2,
        leader="127.0.0.1",
        workers=[f"127.0.0.1:{worker_port}"],
        peers=["127.0.0.1", "127.0.0.2"],
        bind="127.0.0.1",
    )
    return ShardSpec(
        replica_id="m.default.0123abcd" + (f"~{rank}" if rank else ""),
        engine="llama.cpp",
        source="/models/m.gguf",
        port=leader_port if rank == 0 else worker_port,
        key="k",
        fingerprint="f",
        group=group,
    )


async def until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_the_leader_waits_for_its_worker_which_needs_no_weights(
    tmp_path: Path, build: Path
) -> None:
    said: list[ShardStatus] = []

    def emit(msg: Message) -> None:
        if isinstance(msg, ShardStatus):
            said.append(msg)

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    weights = Weights(model)
    sup = Supervisor(tmp_path / "shards", StandInEngines(build), weights, emit, host="127.0.0.1")
    leader_port, worker_port = free_port(), free_port()
    leader, worker = spec(0, leader_port, worker_port), spec(1, leader_port, worker_port)
    try:
        sup.start(leader)
        await until(lambda: any("waiting for 1 of 1 workers" in s.reason for s in said), "the wait")
        assert sup.shards[leader.replica_id].state == ShardState.LOADING
        sup.start(worker)
        await until(
            lambda: all(s.state == ShardState.READY for s in sup.shards.values()), "both ready"
        )
        worker_shard = sup.shards[worker.replica_id]
        assert worker_shard.pid is not None
        argv = psutil.Process(worker_shard.pid).cmdline()
        assert argv[-4:] == ["-H", "127.0.0.1", "-p", str(worker_port)]
        leader_argv = psutil.Process(sup.shards[leader.replica_id].pid or 0).cmdline()
        assert leader_argv[leader_argv.index("--rpc") + 1] == f"127.0.0.1:{worker_port}"
        # Only the leader read the weights; the worker gets its layers over RPC.
        assert weights.fetched == [leader.replica_id]
        ranks = {s.replica_id: s.rank for s in sup.statuses()}
        assert ranks == {leader.replica_id: 0, worker.replica_id: 1}
        assert sup.peers() == {worker_port: ("127.0.0.1", "127.0.0.2")}

        # The worker dies: it is failed, with the words the control plane acts on.
        psutil.Process(worker_shard.pid).kill()
        await until(lambda: worker_shard.state == ShardState.FAILED, "the worker failed")
        assert worker_shard.reason.startswith("the engine exited")
        assert worker_port not in sup.peers()
    finally:
        for rid in list(sup.shards):
            await sup.stop(rid, grace=2)
        await sup.close()
