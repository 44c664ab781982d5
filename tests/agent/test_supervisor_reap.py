"""Every engine the supervisor started and saw end is waited for: a shard is reported
stopped or failed only once the loop has heard its process end.

On Python 3.11 asyncio's child watcher is a thread: it reaps the child (its pid is gone
at once, which is all ``Shard.alive`` sees) and tells the loop afterwards. An agent, or a
test, whose loop ended in between left the process "still running" in asyncio's eyes: a
ResourceWarning when it was collected, which failed CI in an unrelated test. Here the
watcher's word always comes late, as it may on two busy cores.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.agent.supervisor import REAP_WAIT, Supervisor
from llmgw.wire.messages import Message, ShardSpec
from llmgw.wire.states import ShardState
from tests.agent.test_supervisor_adopt import supervisor, until_ready, write_engine
from tests.e2e.cluster import free_port

# How late the watcher's word comes: past the supervisor's own polls (0.1 s while
# stopping, WATCH_POLL and the tail's 0.3 s for a crash), within its REAP_WAIT.
LATE = 2.0
assert LATE < REAP_WAIT


@pytest.fixture
def late_watcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child watcher's thread waits LATE seconds between reaping a child and telling
    the loop (a reap on the loop's own thread, as with a pidfd watcher, is not held)."""
    real = os.waitpid

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        reaped = real(pid, options)
        if threading.current_thread() is not threading.main_thread():
            time.sleep(LATE)
        return reaped

    monkeypatch.setattr(os, "waitpid", waitpid)


@pytest.fixture
async def started(tmp_path: Path, late_watcher: None) -> AsyncIterator[Supervisor]:
    """A supervisor with one stand-in llama-server ready as ``r``."""
    sent: list[Message] = []
    sup = supervisor(tmp_path / "shards", write_engine(tmp_path), sent)
    sup.start(
        ShardSpec(
            replica_id="r",
            engine="llama.cpp",
            source=str(tmp_path / "tiny.gguf"),
            port=free_port(),
            key="k-r",
            fingerprint="f",
        )
    )
    try:
        await until_ready(sup, "r")
        yield sup
    finally:
        await sup.stop("r", grace=2)
        await sup.close()


async def test_a_stopped_engine_is_heard_ended_before_stop_returns(started: Supervisor) -> None:
    shard = started.shards["r"]
    child = shard.child
    assert child is not None and child.returncode is None
    await started.stop("r", grace=5)
    assert shard.state == ShardState.STOPPED
    assert child.returncode == -signal.SIGTERM


async def test_an_engine_that_died_is_heard_ended_before_it_is_reported_failed(
    started: Supervisor,
) -> None:
    shard = started.shards["r"]
    child = shard.child
    assert child is not None and shard.pid is not None
    os.killpg(shard.pid, signal.SIGKILL)
    async with asyncio.timeout(30):
        while shard.state != ShardState.FAILED:
            await asyncio.sleep(0.02)
    assert child.returncode == -signal.SIGKILL
