"""The agent's watch over its vLLM replicas' caches: ports kept for adoption, net changes
sent as KvBlocks, a whole copy (a reset) on every new stream, and large sets in chunks."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.agent import cachewatch
from llmgw.agent.cachewatch import CacheWatch, wants_events
from llmgw.wire.messages import GroupSpec, KvBlocks, Message, ShardSpec
from tests.support.fakevllm import FakeVllm, Removed, Stored


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def blocks(sent: list[Message]) -> list[KvBlocks]:
    return [m for m in sent if isinstance(m, KvBlocks)]


def test_only_a_vllm_leader_that_asked_publishes() -> None:
    base = ShardSpec("r", "vllm", "s", 1, "k", "fp", kv_events=True)
    assert wants_events(base)
    assert not wants_events(ShardSpec("r", "vllm", "s", 1, "k", "fp"))
    assert not wants_events(ShardSpec("r", "llama.cpp", "s", 1, "k", "fp", kv_events=True))
    worker = GroupSpec(rank=1, size=2, leader="10.0.0.1", workers=[], peers=[])
    assert not wants_events(
        ShardSpec("r~1", "vllm", "s", 1, "k", "fp", kv_events=True, group=worker)
    )


async def test_changes_go_up_netted_and_a_new_stream_gets_the_whole_set(tmp_path: Path) -> None:
    sent: list[Message] = []
    watch = CacheWatch(tmp_path, sent.append)
    flags, env = await watch.prepare("m.default.a1")
    config = json.loads(flags[flags.index("--kv-events-config") + 1])
    port, replay = watch.watched["m.default.a1"].port, watch.watched["m.default.a1"].replay_port
    assert config["endpoint"] == f"tcp://127.0.0.1:{port}"
    assert config["replay_endpoint"] == f"tcp://127.0.0.1:{replay}"
    assert env["PYTHONHASHSEED"] == "0" and env["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] == "1"
    try:
        async with FakeVllm(port, replay) as engine:
            await asyncio.wait_for(engine.subscribed.wait(), 10)
            await engine.publish(Stored([1, 2, 3], block_size=16))
            await engine.publish(Stored([4]), Removed([2]))
            await until(lambda: any(4 in m.added for m in blocks(sent)), "the changes")
            added = {h for m in blocks(sent) for h in m.added}
            removed = {h for m in blocks(sent) for h in m.removed}
            assert added - removed == {1, 3, 4} and all(m.block_size == 16 for m in blocks(sent))
            before = len(sent)
            watch.attach()
            (copy,) = blocks(sent[before:])
            assert copy.reset and set(copy.added) == {1, 3, 4} and copy.removed == []
    finally:
        await watch.close()


async def test_an_adopted_shard_listens_again_on_its_ports(tmp_path: Path) -> None:
    first = CacheWatch(tmp_path, lambda m: None)
    await first.prepare("m.default.a1")
    port = first.watched["m.default.a1"].port
    await first.close()  # the agent restarts; vLLM keeps its ports
    sent: list[Message] = []
    again = CacheWatch(tmp_path, sent.append)
    for _ in range(50):  # ZeroMQ lets go of a closed port a moment later
        if again.adopt("m.default.a1"):
            break
        await asyncio.sleep(0.05)
    try:
        assert again.watched["m.default.a1"].port == port
        replay = again.watched["m.default.a1"].replay_port
        async with FakeVllm(port, replay) as engine:
            await asyncio.wait_for(engine.subscribed.wait(), 10)
            await engine.publish(Stored([7], block_size=16))
            await until(lambda: any(7 in m.added for m in blocks(sent)), "the adopted engine's")
        await again.drop("m.default.a1")
        assert "m.default.a1" not in again.watched
        assert not again.adopt("m.default.a1")  # its ports are forgotten with it
    finally:
        await again.close()


def test_a_large_copy_goes_in_chunks_with_one_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[Message] = []
    watch = CacheWatch(tmp_path, sent.append)
    monkeypatch.setattr(cachewatch, "CHUNK", 3)
    watch._send("r", cachewatch.BlockChanges(frozenset(range(7)), frozenset(), True, 16))
    parts = blocks(sent)
    assert [len(m.added) for m in parts] == [3, 3, 1]
    assert [m.reset for m in parts] == [True, False, False]
    assert sorted(h for m in parts for h in m.added) == list(range(7))
