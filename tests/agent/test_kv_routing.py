"""KV-event routing from end to end of llmgw's own parts: the supervisor starts two fake
vLLM engines (tests/support/fakevllmserve.py: vLLM's HTTP edges, prefix cache and KV
events on vLLM's wire) with the flags and environment kv_events asks for; the agent's
subscribers mirror their caches and send the net changes (KvBlocks); the control
plane's router takes them and, with the prompt's tokens from an engine's /tokenize
hashed as vLLM hashes them, sends each conversation back to the replica whose cache
holds it, even when that replica is busier."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from llmgw import pki
from llmgw.agent.cachewatch import CacheWatch
from llmgw.agent.supervisor import Supervisor
from llmgw.server.catalog.model import Model, Profile, new_replica_id
from llmgw.server.gateway import kvroute
from llmgw.server.gateway import router as gw
from llmgw.server.gateway.router import Endpoint, Router
from llmgw.wire.messages import (
    KV_HASH_SEED,
    KvBlocks,
    Message,
    ShardSpec,
    ShardStatus,
)
from llmgw.wire.states import NodeState, ShardState
from tests.e2e.cluster import free_port
from tests.support.engines import StandInEngines
from tests.support.fakevllmserve import block_hashes, tokens_of

REPO = Path(__file__).resolve().parents[2]
SECRET = b"cluster-secret"
SYSTEM_A = "You answer questions about the cluster's nodes, tersely and exactly. " * 4
SYSTEM_B = "You write short poems about network cables and nothing else at all. " * 4


class Weights:
    async def fetch(self, source: str, **kw: Any) -> Path:
        return Path("/w/model")


async def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def chat(system: str, *turns: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    for i, turn in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": turn})
    return {"model": "m", "messages": messages}


@pytest.mark.parametrize("encoding", ["map", "array"])
async def test_conversations_go_back_to_the_replica_whose_cache_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    vllm = tmp_path / "vllm"
    vllm.write_text(
        f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m tests.support.fakevllmserve "$@"\n'
    )
    vllm.chmod(0o755)
    monkeypatch.setenv("FAKE_VLLM_ENCODING", encoding)  # the engines inherit it
    sent: list[Message] = []
    cache = CacheWatch(tmp_path / "kv", sent.append)
    sup = Supervisor(
        tmp_path / "shards",
        StandInEngines(vllm, "0.11.1"),
        Weights(),
        sent.append,
        host="127.0.0.1",
        cache=cache,
    )
    ids = [new_replica_id("m", "default") for _ in range(2)]
    for rid in ids:
        key = pki.engine_key(SECRET, rid)
        sup.start(ShardSpec(rid, "vllm", "/w/model", free_port(), key, "fp", "m", kv_events=True))
    try:
        await until(
            lambda: all(sup.shards[r].state == ShardState.READY for r in ids), "both engines"
        )
        # The engines were started to publish their events where the agent listens.
        for rid in ids:
            cmdline = sup.shards[rid].process.cmdline()  # type: ignore[union-attr]
            assert "--kv-events-config" in cmdline and "sha256_cbor" in cmdline
            assert str(cache.watched[rid].port) in " ".join(cmdline)

        statuses = {rid: sup.shards[rid].status() for rid in ids}
        node = SimpleNamespace(
            id="n1",
            address="127.0.0.1",
            state=NodeState.READY,
            shards=statuses,
            routable=lambda: statuses,  # the agent's word alone: no control plane restart
        )
        model = Model(
            "m", "/w/model", "vllm", (Profile("default", "vllm"),), 4096, slots=4, kv_events=True
        )
        world: Any = SimpleNamespace(
            version=1, nodes={"n1": node}, models={"m": model}, answers=lambda rid: True
        )
        router = Router(world, world, world, SECRET)
        delivered = 0

        def deliver() -> None:  # the agent's stream, as the control plane reads it
            nonlocal delivered
            for msg in sent[delivered:]:
                if isinstance(msg, KvBlocks):
                    router.kv_blocks("n1", msg)
            delivered = len(sent)

        async with aiohttp.ClientSession() as http:

            async def ask(body: dict[str, Any]) -> Endpoint:
                """What the gateway does: tokens, hashes, a pick, the request."""
                deliver()
                blocks = None
                sizes = router.kv_sizes("m")
                if sizes:
                    teller = router.endpoints_of("m")[0]
                    request = kvroute.tokenize_body(body)
                    assert request is not None
                    tokens = await kvroute.tokenize(http, teller.url, teller.key, request)
                    assert tokens == tokens_of(request)
                    blocks = kvroute.prompt_hashes(tokens, sizes)
                chosen = router.pick("m", blocks=blocks)
                assert chosen is not None
                async with http.post(
                    chosen.url + "/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {chosen.key}"},
                ) as resp:
                    assert resp.status == 200, await resp.text()
                return chosen

            def holds(endpoint: Endpoint, body: dict[str, Any]) -> bool:
                deliver()
                held = router.kv.held(endpoint.replica_id)
                want = block_hashes(tokens_of(body), KV_HASH_SEED)  # vLLM's rules, by cbor2
                return held is not None and held.block_size == 16 and set(want) <= held.blocks

            a1 = chat(SYSTEM_A, "How many nodes are there?")
            first = await ask(a1)
            await until(lambda: holds(first, a1), "the first replica's blocks to reach the router")
            other = next(e for e in router.endpoints_of("m") if e is not first)
            first.outstanding = 1  # busy: a new conversation goes to the other
            b1 = chat(SYSTEM_B, "A poem, please.")
            assert await ask(b1) is other
            await until(lambda: holds(other, b1), "the second replica's blocks")

            # Each conversation comes back to its cache, the busier replica included.
            first.outstanding = 1
            a2 = chat(SYSTEM_A, "How many nodes are there?", "Four.", "And cards?")
            assert await ask(a2) is first
            b2 = chat(SYSTEM_B, "A poem, please.", "Cables hum.", "Another.")
            other.outstanding = 2
            first.outstanding = 0
            assert await ask(b2) is other
            assert router.decisions[("m", gw.KV_EVENTS)] == 2
            assert router.kv_hits == {"m": 2}

            # Past its slots: the cache no longer wins over an idle replica.
            first.outstanding = 6
            other.outstanding = 0
            a3 = chat(SYSTEM_A, "How many nodes are there?", "Four.", "And disks?")
            assert await ask(a3) is other

        # A new stream gets every replica's whole set, as a reset.
        before = len(sent)
        cache.attach()
        copies = [m for m in sent[before:] if isinstance(m, KvBlocks)]
        assert {m.replica_id for m in copies} == set(ids) and all(m.reset for m in copies)
        for rid in ids:  # each copy is exactly what the agent holds of that replica
            copy = next(m for m in copies if m.replica_id == rid)
            assert set(copy.added) == cache.watched[rid].blocks.hashes() != set()
    finally:
        for rid in ids:
            await sup.stop(rid, grace=2)
        # Each engine's reaper sees it exit before the supervisor lets go of it.
        await asyncio.wait([t for r in ids for t in sup.shards[r].helpers], timeout=5)
        await cache.close()
        await sup.close()
    statuses_after: list[ShardStatus] = [m for m in sent if isinstance(m, ShardStatus)]
    assert {m.replica_id for m in statuses_after if m.state == ShardState.STOPPED} == set(ids)
    assert cache.watched == {}
