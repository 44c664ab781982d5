"""One shard's record and the checks of its engine from outside: is the process still
running and why did it end, is the one found after an agent restart still ours (same
process, answering to its key alone), and is its port free before it starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import psutil
import pytest
from aiohttp import web

from llmgw.agent.engines import EngineError
from llmgw.agent.shard import Shard, accepts, port_in_use, split_endpoint, still_ours
from llmgw.wire.messages import GroupSpec, ShardSpec
from llmgw.wire.states import ShardState
from tests.support.ports import free_port

KEY = "the-engine-key"


def spec(
    port: int = 1,
    engine: str = "llama.cpp",
    source: str = "/m.gguf",
    group: GroupSpec | None = None,
) -> ShardSpec:
    return ShardSpec(
        replica_id="r1",
        engine=engine,
        source=source,
        port=port,
        key=KEY,
        fingerprint="f",
        group=group,
    )


def this_process(shard: Shard) -> Shard:
    """``shard`` as if this test's own process were its engine."""
    shard.pid = os.getpid()
    shard.create_time = psutil.Process().create_time()
    return shard


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s


# --- the record -----------------------------------------------------------------------


def test_status_reports_the_state_its_last_lines_and_its_rank() -> None:
    shard = Shard(spec=spec())
    status = shard.status(last_lines=["bye"])
    assert (status.replica_id, status.state, status.port) == ("r1", ShardState.STARTING, 1)
    assert status.last_lines == ["bye"] and status.rank is None
    assert not shard.worker

    group = GroupSpec(rank=1, size=2, leader="10.0.0.1")
    worker = Shard(spec=spec(group=group))
    assert worker.worker and worker.status().rank == 1
    assert not Shard(spec=spec(group=GroupSpec(rank=0, size=2, leader="10.0.0.1"))).worker


def test_the_source_is_reported_in_the_weights_caches_form() -> None:
    # So the control plane can match what a node holds against what its shards use.
    assert Shard(spec=spec(source="hf:Org/Repo:q4_k_m")).status().source == "hf:org/repo:Q4_K_M"
    # One it cannot read goes as it was given rather than not at all.
    assert Shard(spec=spec(source="hf://org/repo")).status().source == "hf://org/repo"


# --- the process ----------------------------------------------------------------------


def test_a_shard_without_a_process_is_not_alive() -> None:
    shard = Shard(spec=spec())
    assert not shard.alive()
    assert shard.exit_reason() == "the engine exited"


def test_an_engine_that_exited_says_its_code() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    try:
        shard = Shard(spec=spec(), pid=child.pid, process=psutil.Process(child.pid))
        deadline = time.monotonic() + 30
        # Unreaped it is a zombie, which must not count as running.
        while shard.alive():
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert shard.exit_reason() == "the engine exited (code 3)"
    finally:
        child.wait()


# --- after an agent restart: still ours? ----------------------------------------------


@pytest.fixture
async def engine() -> AsyncIterator[tuple[int, dict[str, bool]]]:
    """An engine's /v1/models on loopback; ``open`` makes it answer without the key."""
    behaviour = {"open": False}

    async def models(request: web.Request) -> web.Response:
        keyed = request.headers.get("authorization") == f"Bearer {KEY}"
        if keyed or behaviour["open"]:
            return web.json_response({"data": []})
        return web.Response(status=401)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port, behaviour
    finally:
        await runner.cleanup()


async def test_the_engine_found_again_is_ours_when_it_answers_to_its_key_alone(
    engine: tuple[int, dict[str, bool]],
) -> None:
    port, behaviour = engine
    shard = this_process(Shard(spec=spec(port)))
    assert await still_ours(shard)
    assert shard.process is not None and shard.process.pid == os.getpid()

    # Something that answers anyone is not the engine started with that key.
    behaviour["open"] = True
    assert not await still_ours(this_process(Shard(spec=spec(port))))


async def test_a_reused_pid_or_a_gone_process_is_not_ours(
    engine: tuple[int, dict[str, bool]],
) -> None:
    port, _ = engine
    assert not await still_ours(Shard(spec=spec(port)))  # no pid recorded
    reused = this_process(Shard(spec=spec(port)))
    assert reused.create_time is not None
    reused.create_time -= 60  # the pid now belongs to a process started later
    assert not await still_ours(reused)

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = Shard(spec=spec(port), pid=child.pid)
    assert not await still_ours(gone)


async def test_a_worker_is_probed_as_its_engine_says(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    group = GroupSpec(rank=1, size=2, leader="10.0.0.1", bind="127.0.0.1")
    # llama.cpp's RPC worker: its port takes connections.
    assert await still_ours(this_process(Shard(spec=spec(port, group=group))))
    assert not await still_ours(this_process(Shard(spec=spec(free_port(), group=group))))
    # vLLM's worker serves nothing: running is enough.
    vllm = spec(free_port(), engine="vllm", group=group)
    assert await still_ours(this_process(Shard(spec=vllm)))


# --- ports ----------------------------------------------------------------------------


async def test_accepts_tells_a_listening_port_from_a_closed_one(
    listening: socket.socket,
) -> None:
    assert await accepts("127.0.0.1", listening.getsockname()[1])
    assert not await accepts("127.0.0.1", free_port())


def test_a_taken_port_is_refused_with_the_words_the_control_plane_reads(
    listening: socket.socket,
) -> None:
    port = listening.getsockname()[1]
    with pytest.raises(EngineError, match=f"port {port} on this node is taken.*address in use"):
        port_in_use("127.0.0.1", port)
    port_in_use("127.0.0.1", free_port())  # free: no complaint


@pytest.mark.parametrize(
    ("endpoint", "split"),
    [("10.0.0.2:50052", ("10.0.0.2", 50052)), ("[fd00::2]:50052", ("fd00::2", 50052))],
)
def test_split_endpoint(endpoint: str, split: tuple[str, int]) -> None:
    assert split_endpoint(endpoint) == split
