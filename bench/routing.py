"""Routing policies side by side on a multi-turn chat workload: round robin, least
outstanding, the approximate prefix guess and vLLM's KV events, through llmgw's own
router (``llmgw.server.gateway.router``).

Four simulated engines stand in for vLLM replicas: each has a prefix cache of a fixed
number of 16-token blocks (LRU), hashes blocks by vLLM's rules
(``llmgw.server.gateway.blockhash``), serves ``--slots`` requests at once, and takes
``--base-ms`` plus ``--prefill-us`` per uncached prompt token to its first token, then
``--decode-ms`` to finish. Each store and eviction is reported to the router as the
agent reports it (``KvBlocks``), ``--event-delay-ms`` later. The KV policy pays
``--tokenize-ms`` per request for the engine's /tokenize.

The workload: ``--conversations`` chats, each under one of ``--systems`` shared system
prompts, ``--turns`` turns each (a user turn, then the answer appended), run by
``--clients`` concurrent clients that pick a random open conversation each time, so
conversations come back to a router that may or may not send them where their history
is cached. The same seed gives the same workload to every policy.

    .venv/bin/python bench/routing.py
    .venv/bin/python bench/routing.py --json /tmp/routing.json

Prints per policy: cache hit rate (prompt tokens found cached / prompt tokens), mean and
P90 time to first token, requests a second.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmgw.server.gateway.blockhash import block_hashes  # noqa: E402
from llmgw.server.gateway.kvroute import prompt_hashes  # noqa: E402
from llmgw.server.gateway.router import Endpoint, Router, prompt_prefix  # noqa: E402
from llmgw.wire.messages import KV_HASH_SEED, KvBlocks  # noqa: E402

BLOCK = 16
POLICIES = ("round_robin", "least_outstanding", "approximate_prefix", "kv_events")
WORDS = [f"w{i}" for i in range(4000)]


@dataclass
class Engine:
    rid: str
    capacity: int
    slots: int
    base: float
    prefill: float
    decode: float
    report: Callable[[KvBlocks], None]
    delay: float
    cache: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.free = asyncio.Semaphore(self.slots)

    async def serve(self, tokens: list[int], answer: list[int]) -> tuple[float, int]:
        """(seconds to the first token, prompt tokens found cached). The answer's tokens
        are cached with the prompt's, as vLLM caches a request's full blocks."""
        start = time.perf_counter()
        async with self.free:
            hashes = block_hashes(tokens, BLOCK, KV_HASH_SEED)
            held = 0
            for h in hashes:
                if h not in self.cache:
                    break
                held += 1
            cached = held * BLOCK
            await asyncio.sleep(self.base + self.prefill * (len(tokens) - cached))
            first = time.perf_counter() - start
            hashes = block_hashes(tokens + answer, BLOCK, KV_HASH_SEED)
            new = [h for h in hashes if h not in self.cache]
            for h in hashes:
                self.cache[h] = None
                self.cache.move_to_end(h)
            evicted = []
            while len(self.cache) > self.capacity:
                evicted.append(self.cache.popitem(last=False)[0])
            msg = KvBlocks(self.rid, BLOCK, added=new, removed=evicted)
            asyncio.get_running_loop().call_later(self.delay, self.report, msg)
            await asyncio.sleep(self.decode)
        return first, cached


@dataclass
class Conversation:
    system: list[str]
    turns: list[list[str]]
    answers: list[list[str]]
    done: int = 0

    def messages(self) -> list[dict[str, str]]:
        out = [{"role": "system", "content": " ".join(self.system)}]
        for i in range(self.done + 1):
            out.append({"role": "user", "content": " ".join(self.turns[i])})
            if i < self.done:
                out.append({"role": "assistant", "content": " ".join(self.answers[i])})
        return out


def tokenize(messages: list[dict[str, str]]) -> list[int]:
    """Word ids with role markers: the engines' and the router's tokenizer alike."""
    out: list[int] = []
    for m in messages:
        out.append(5000 + ("system", "user", "assistant").index(m["role"]))
        out.extend(int(w[1:]) for w in m["content"].split())
    out.append(5002)  # the generation prompt
    return out


def workload(args: argparse.Namespace) -> list[Conversation]:
    rng = random.Random(args.seed)
    systems = [rng.choices(WORDS, k=args.system_tokens) for _ in range(args.systems)]
    return [
        Conversation(
            rng.choice(systems),
            [rng.choices(WORDS, k=args.user_tokens) for _ in range(args.turns)],
            [rng.choices(WORDS, k=args.answer_tokens) for _ in range(args.turns)],
        )
        for _ in range(args.conversations)
    ]


async def run_policy(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    conversations = workload(args)
    rids = [f"m.default.e{i}" for i in range(args.engines)]
    nodes = {
        f"n{i}": SimpleNamespace(id=f"n{i}", address=None, shards={rid: None})
        for i, rid in enumerate(rids)
    }
    world: Any = SimpleNamespace(version=1, nodes=nodes, models={}, answers=lambda r: True)
    router = Router(world, world, world, b"bench")
    endpoints = []
    for i, rid in enumerate(rids):
        e = Endpoint(rid, f"http://{rid}/v1", "k", 0)
        e.node, e.kv, e.slots = f"n{i}", True, args.slots
        endpoints.append(e)
    router._table = {"m": endpoints}
    router._version = (1, 1, 1)
    engines = {
        rid: Engine(
            rid,
            args.cache_blocks,
            args.slots,
            args.base_ms / 1000,
            args.prefill_us / 1e6,
            args.decode_ms / 1000,
            lambda msg, node=f"n{i}": router.kv_blocks(node, msg),
            args.event_delay_ms / 1000,
        )
        for i, rid in enumerate(rids)
    }
    turn = itertools.count()
    cycle = itertools.cycle(endpoints)
    rng = random.Random(args.seed + 1)
    open_ = list(range(len(conversations)))
    busy: set[int] = set()
    firsts: list[float] = []
    prompt_total = cached_total = 0

    async def client() -> None:
        nonlocal prompt_total, cached_total
        while True:
            ready = [c for c in open_ if c not in busy]
            if not ready:
                if not open_:
                    return
                await asyncio.sleep(0.001)
                continue
            c = rng.choice(ready)
            busy.add(c)
            conv = conversations[c]
            messages = conv.messages()
            tokens = tokenize(messages)
            started = time.perf_counter()
            if policy == "round_robin":
                chosen = next(cycle)
            elif policy == "least_outstanding":
                chosen = router.pick("m")
            elif policy == "approximate_prefix":
                chosen = router.pick("m", prefix=prompt_prefix({"messages": messages}))
            else:
                await asyncio.sleep(args.tokenize_ms / 1000)  # the engine's /tokenize
                blocks = prompt_hashes(tokens, router.kv_sizes("m") or {BLOCK})
                chosen = router.pick("m", blocks=blocks)
            assert chosen is not None
            chosen.outstanding += 1
            try:
                answer = [int(w[1:]) for w in conv.answers[conv.done]]
                _, cached = await engines[chosen.replica_id].serve(tokens, answer)
            finally:
                chosen.outstanding -= 1
            firsts.append(time.perf_counter() - started)
            prompt_total += len(tokens)
            cached_total += cached
            next(turn)
            conv.done += 1
            busy.discard(c)
            if conv.done >= len(conv.turns):
                open_.remove(c)

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(args.clients)))
    elapsed = time.perf_counter() - began
    ordered = sorted(firsts)
    return {
        "policy": policy,
        "requests": len(firsts),
        "hit_rate": round(cached_total / prompt_total, 4),
        "ttft_mean_ms": round(1000 * statistics.fmean(firsts), 2),
        "ttft_p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 2),
        "requests_per_s": round(len(firsts) / elapsed, 1),
        "decisions": {reason: n for (_, reason), n in sorted(router.decisions.items())},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--slots", type=int, default=4, help="requests an engine serves at once")
    p.add_argument("--cache-blocks", type=int, default=5000, help="16-token blocks per engine")
    p.add_argument("--base-ms", type=float, default=20.0)
    p.add_argument(
        "--prefill-us",
        type=float,
        default=200.0,
        help="per uncached prompt token (a 70B on one card)",
    )
    p.add_argument("--decode-ms", type=float, default=80.0)
    p.add_argument("--event-delay-ms", type=float, default=50.0)
    p.add_argument("--tokenize-ms", type=float, default=2.0)
    p.add_argument("--conversations", type=int, default=96)
    p.add_argument("--systems", type=int, default=6)
    p.add_argument("--system-tokens", type=int, default=150)
    p.add_argument("--user-tokens", type=int, default=100)
    p.add_argument("--answer-tokens", type=int, default=200)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--json", nargs="?", const="-", help="write the results as JSON (- for stdout)")
    args = p.parse_args()
    results = [asyncio.run(run_policy(policy, args)) for policy in args.policies.split(",")]
    if args.json:
        text = json.dumps({"args": vars(args), "results": results}, indent=2)
        if args.json == "-":
            print(text)
            return 0
        Path(args.json).write_text(text)
    head = ("policy", "requests", "hit rate", "TTFT mean", "TTFT P90", "req/s")
    print("{:<20} {:>8} {:>9} {:>10} {:>9} {:>7}".format(*head))
    for r in results:
        print(
            f"{r['policy']:<20} {r['requests']:>8} {r['hit_rate']:>9.1%} "
            f"{r['ttft_mean_ms']:>8.1f}ms {r['ttft_p90_ms']:>7.1f}ms {r['requests_per_s']:>7.1f}"
        )
    by = {r["policy"]: r for r in results}
    if "kv_events" in by and "least_outstanding" in by:
        kv, lo = by["kv_events"], by["least_outstanding"]
        hits = kv["hit_rate"] / max(lo["hit_rate"], 1e-9)
        p90 = kv["ttft_p90_ms"] / lo["ttft_p90_ms"]
        print(f"\nKV events vs least outstanding: hit rate x{hits:.2f}, P90 TTFT x{p90:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
