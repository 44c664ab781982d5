"""Adoption keeps a replica's compute: an agent started again while its engine runs
reports what the engine runs on, even once the start-up lines have left the log's tail.

The engine is a stand-in llama-server (a Python script): it prints llama.cpp's start-up
lines, answers /health, and /v1/models only with its key, as the real one does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil
import pytest

from llmgw.agent.logbook import ENGINE_LINES
from llmgw.agent.supervisor import Supervisor
from llmgw.wire.messages import (
    Compute,
    DownloadProgress,
    EngineInfo,
    Message,
    ShardSpec,
    ShardStatus,
)
from llmgw.wire.states import ShardState
from tests.e2e.cluster import free_port

ENGINE = r"""#!{python}
import http.server, os, sys

print("build: 6000 (abcdef0) with cc for x86_64-linux-gnu", flush=True)
print("load_backend: loaded CPU backend from /opt/llama/libggml-cpu-haswell.so", flush=True)
print("system_info: n_threads = 1 (n_threads_batch = 1) / 2 | CPU : SSE3 = 1 |", flush=True)
port = int(sys.argv[sys.argv.index("--port") + 1])
key = os.environ["LLAMA_API_KEY"]


class Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        keyed = self.headers.get("authorization") == "Bearer " + key
        status = 200 if self.path == "/health" or keyed else 401
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{{"status": "ok"}}')

    def log_message(self, *args):
        pass


print("main: server is listening on http://127.0.0.1:%d" % port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), Engine).serve_forever()
"""


class Installed:
    def __init__(self, binary: Path) -> None:
        self.binary = binary

    async def ensure(
        self, name: str, report: Callable[[str], None], version: str | None = None
    ) -> EngineInfo:
        return EngineInfo(name=name, path=str(self.binary), version="b6000", build="cpu")


class Fetched:
    def __init__(self, model: Path) -> None:
        self.model = model

    async def fetch(
        self,
        source: str,
        *,
        allow_pickle: bool,
        replica_id: str,
        progress: Callable[[DownloadProgress], None],
        vouched: Mapping[str, str] | None = None,
        hub: str | None = None,
    ) -> Path:
        return self.model


def write_engine(folder: Path) -> Path:
    binary = folder / "llama-server"
    binary.write_text(ENGINE.format(python=sys.executable))
    binary.chmod(0o755)
    return binary


@pytest.fixture
def engine(tmp_path: Path) -> Path:
    return write_engine(tmp_path)


def supervisor(root: Path, engine: Path, sent: list[Message]) -> Supervisor:
    model = root.parent / "tiny.gguf"
    model.write_bytes(b"GGUF")
    return Supervisor(root, Installed(engine), Fetched(model), sent.append, host="127.0.0.1")


async def ended(child: asyncio.subprocess.Process) -> None:
    """The engine the old agent left running killed, and its end heard by this loop:
    its pid goes as the child watcher (a thread on 3.11) reaps it, but a loop closed
    before the watcher's word arrives leaves it "still running", a ResourceWarning in
    whichever test collects it."""
    os.killpg(child.pid, signal.SIGKILL)
    async with asyncio.timeout(10):
        await child.wait()


async def until_ready(sup: Supervisor, replica_id: str) -> None:
    async with asyncio.timeout(30):
        while sup.shards[replica_id].state != ShardState.READY:
            failed = sup.shards[replica_id]
            assert failed.state != ShardState.FAILED, failed.reason
            await asyncio.sleep(0.1)


async def test_an_adopted_replica_keeps_its_compute_after_its_log_moved_on(
    tmp_path: Path, engine: Path
) -> None:
    root = tmp_path / "shards"
    spec = ShardSpec(
        replica_id="r1",
        engine="llama.cpp",
        source=str(tmp_path / "tiny.gguf"),
        port=free_port(),
        key="k-r1",
        fingerprint="f",
        cpu_cores=1,
    )
    first = supervisor(root, engine, [])
    first.start(spec)
    child: asyncio.subprocess.Process | None = None
    try:
        await until_ready(first, "r1")
        child = first.shards["r1"].child
        pid = first.shards["r1"].pid
        ran_on = first.shards["r1"].compute
        assert ran_on == Compute(backend="CPU")
        await first.close()  # the old agent goes, leaving its engine running
        # The engine logs its requests: the start-up lines leave the tail kept.
        with first.log_path("r1").open("a") as log:
            for n in range(ENGINE_LINES * 3):
                log.write(f"srv  log_server_r: request: GET /v1/models 127.0.0.1 200 #{n}\n")

        sent: list[Message] = []
        second = supervisor(root, engine, sent)
        assert await second.adopt() == ["r1"]
        adopted = second.shards["r1"]
        assert adopted.pid == pid and adopted.state == ShardState.READY
        assert adopted.compute == ran_on
        assert adopted.status().compute == Compute(backend="CPU")
        await second.close()
    finally:
        if child is not None:
            await ended(child)


async def test_a_record_of_an_older_agent_reads_compute_from_the_log(
    tmp_path: Path, engine: Path
) -> None:
    root = tmp_path / "shards"
    spec = ShardSpec(
        replica_id="r2",
        engine="llama.cpp",
        source=str(tmp_path / "tiny.gguf"),
        port=free_port(),
        key="k-r2",
        fingerprint="f",
    )
    first = supervisor(root, engine, [])
    first.start(spec)
    child: asyncio.subprocess.Process | None = None
    try:
        await until_ready(first, "r2")
        child = first.shards["r2"].child
        await first.close()
        record_path = root / "r2.json"
        record = json.loads(record_path.read_text())
        assert record["compute"] == {"backend": "CPU", "devices": []}
        del record["compute"]  # as an agent before this one wrote it
        record_path.write_text(json.dumps(record))

        second = supervisor(root, engine, [])
        assert await second.adopt() == ["r2"]
        assert second.shards["r2"].compute == Compute(backend="CPU")
        await second.close()
    finally:
        if child is not None:
            await ended(child)


async def test_a_projector_beside_the_model_is_given_to_the_engine_and_kept_on_adoption(
    tmp_path: Path, engine: Path
) -> None:
    """The node gives llama.cpp the mmproj file beside its GGUF, reports the replica
    takes images, and an agent started again reports the same of the engine it adopts."""
    root = tmp_path / "shards"
    projector = tmp_path / "mmproj-tiny-F16.gguf"
    projector.write_bytes(b"GGUF")
    spec = ShardSpec(
        replica_id="r3",
        engine="llama.cpp",
        source=str(tmp_path / "tiny.gguf"),
        port=free_port(),
        key="k-r3",
        fingerprint="f",
    )
    sent: list[Message] = []
    first = supervisor(root, engine, sent)
    first.start(spec)
    child: asyncio.subprocess.Process | None = None
    try:
        await until_ready(first, "r3")
        child = first.shards["r3"].child
        argv = psutil.Process(first.shards["r3"].pid).cmdline()
        assert argv[argv.index("--mmproj") + 1] == str(projector)
        ready = [m for m in sent if isinstance(m, ShardStatus) and m.state == ShardState.READY]
        assert ready and ready[-1].vision is True
        await first.close()

        second = supervisor(root, engine, [])
        assert await second.adopt() == ["r3"]
        adopted = second.shards["r3"]
        assert adopted.status().vision is True
        assert adopted.spec.projector == str(projector)
        await second.close()
    finally:
        if child is not None:
            await ended(child)
