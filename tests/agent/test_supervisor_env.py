"""A FreeToken replica as the supervisor starts it, read back from the started process
(``/proc/<pid>``): the profile's variables in its environment beside the key (never on
its command line) and its one card; the replica's own directory as its working
directory, gone when the replica is; readiness waiting out FreeToken's 200 that says
"loading"; and a variable the agent refuses, refused before anything starts.

The stand-in ``ft`` answers ``/health`` as FreeToken 0.2.1 does: 200 from the start,
``{"status": "loading", ...}`` for its first answers, then ``{"status": "ok", ...}``;
it counts the answers it gave in a file beside it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.agent.supervisor import Supervisor
from llmgw.wire.messages import Message, ShardSpec
from llmgw.wire.states import ShardState
from tests.e2e.cluster import free_port
from tests.support.engines import StandInEngines

LOADING_ANSWERS = 3

FT = f"""#!{sys.executable}
import http.server, json, sys
from pathlib import Path
args = sys.argv[1:]
assert args[0] == "serve", args
port = int(args[args.index("--port") + 1])
counter = Path(__file__).with_name("health-answers")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        n = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(n + 1))
        if n < {LOADING_ANSWERS}:
            body = {{"status": "loading", "phase": "weights",
                     "progress": {{"done_bytes": n, "total_bytes": 9}}, "model": "m"}}
        else:
            body = {{"status": "ok", "model": "m", "uptime_s": 0, "maintenance": "serving"}}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


class Weights:
    def __init__(self, model: Path) -> None:
        self.model = model

    async def fetch(self, source: str, **kw: object) -> Path:
        return self.model


def environ(pid: int) -> dict[str, str]:
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
def binary(tmp_path: Path) -> Path:
    ft = tmp_path / "env" / "ft"
    ft.parent.mkdir()
    ft.write_text(FT)
    ft.chmod(0o755)
    return ft


@pytest.fixture
def supervisor(tmp_path: Path, binary: Path) -> Supervisor:
    model = tmp_path / "weights" / "m"
    model.mkdir(parents=True)

    def emit(msg: Message) -> None:
        pass

    return Supervisor(
        tmp_path / "shards",
        StandInEngines(binary, "0.2.1"),
        Weights(model),
        emit,
        host="127.0.0.1",
    )


def spec(env: dict[str, str]) -> ShardSpec:
    return ShardSpec(
        replica_id="m.default.0123abcd",
        engine="freetoken",
        source="hf:org/m",
        port=free_port(),
        key="llmgw-engine-secret",
        fingerprint="f",
        model="m",
        cards=["GPU-1"],
        args=["--max-seq-len-override", "4096", "--max-running-requests", "1"],
        env=env,
    )


async def test_variables_key_card_and_directory_reach_the_engine_after_loading(
    supervisor: Supervisor, binary: Path
) -> None:
    placed = spec({"NCCL_DEBUG": "INFO", "FREETOKEN_PIN_BUDGET_GB": "48", "SCRATCH": "tmp"})
    try:
        supervisor.start(placed)
        shard = supervisor.shards[placed.replica_id]
        await until(lambda: shard.state in (ShardState.READY, ShardState.FAILED), "the start")
        assert shard.state == ShardState.READY, shard.reason
        # Ready only once FreeToken said "ok": every "loading" 200 before it was waited out.
        assert int(binary.with_name("health-answers").read_text()) == LOADING_ANSWERS + 1
        assert shard.pid is not None
        env = environ(shard.pid)
        assert env["NCCL_DEBUG"] == "INFO"
        assert env["FREETOKEN_PIN_BUDGET_GB"] == "48"
        assert env["FREETOKEN_API_KEY"] == "llmgw-engine-secret"
        assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
        assert env["HF_HUB_OFFLINE"] == "1"
        argv = Path(f"/proc/{shard.pid}/cmdline").read_bytes().split(b"\0")
        assert b"llmgw-engine-secret" not in b" ".join(argv)
        assert argv[argv.index(b"--gpu") + 1] == b"0"
        assert argv[argv.index(b"--served-model-name") + 1] == b"m"
        workdir = supervisor.workdir(placed.replica_id)
        assert Path(f"/proc/{shard.pid}/cwd").resolve() == workdir.resolve()
    finally:
        await supervisor.stop(placed.replica_id)
    await until(lambda: not workdir.exists(), "the replica's directory removed")


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"LD_PRELOAD": "/tmp/evil.so"}, "LD_PRELOAD is set by llmgw or changes which code"),
        ({"LLMGW_STATE_DIR": "x"}, "LLMGW_STATE_DIR is the agent's own setting"),
        ({"FREETOKEN_API_LOG_DIR": "logs"}, "FREETOKEN_API_LOG_DIR names a file"),
        ({"TOPO": "/etc/topo.xml"}, "names a path outside the replica's directory"),
    ],
)
async def test_a_refused_variable_fails_the_shard_before_it_starts(
    supervisor: Supervisor, env: dict[str, str], words: str
) -> None:
    placed = spec(env)
    try:
        supervisor.start(placed)
        shard = supervisor.shards[placed.replica_id]
        await until(lambda: shard.state == ShardState.FAILED, "the refusal")
        assert shard.pid is None
        assert words in shard.reason
        assert shard.reason.startswith("freetoken environment: ")
    finally:
        await supervisor.stop(placed.replica_id)
