"""KV-event routing through a real cluster: an agent runs two fake vLLM engines
(tests/support/fakevllmserve.py: vLLM's HTTP edges, its prefix cache and its KV events
on vLLM's wire) started with the flags `--kv-events` asks for; the agent sends their
caches up its stream, and the gateway, tokenizing through a replica's /tokenize and
hashing as vLLM does, sends each conversation back to the replica that holds it."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.catalog import ctl, ctl_json, scheduled, wait_ready
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.load import metrics_text

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
SYSTEMS = [
    "You answer questions about the cluster's nodes, tersely and exactly. " * 3,
    "You write short poems about network cables and nothing else at all. " * 3,
    "You translate every sentence into formal French, keeping the tone. " * 3,
]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def fake_vllm(path: Path) -> Path:
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo 0.11.1; exit 0; fi\n'
        f'PYTHONPATH={REPO} exec {sys.executable} -m tests.support.fakevllmserve "$@"\n'
    )
    path.chmod(0o755)
    return path


def counter(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}\{{([^}}]*)\}} (\S+)$", line)
        if m and all(part in m[1].split(",") for part in want.split(",")):
            total += float(m[2])
    return total


def test_each_conversation_goes_back_to_the_replica_whose_cache_holds_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    engine = fake_vllm(tmp_path / "vllm")
    cluster.start_agent("a", cluster.token(), ["--engine", f"vllm={engine}"])
    cluster.wait_state("a", "Ready", 20)
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    ctl(
        cluster,
        *("model", "serve", str(weights), "--name", "m", "--engine", "vllm"),
        *("--replicas", "2", "--slots", "4", "--memory", "1GiB", "--kv-events"),
    )
    shown = ctl_json(cluster, "model", "show", "m")
    assert shown["kv_events"] is True
    rows = wait_ready(cluster, "m", 2)
    key = ctl_json(cluster, "keys", "create", "--name", "kv")["key"]
    sdk = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0)
    try:

        def ask(system: str, *turns: str) -> str:
            messages = [{"role": "system", "content": system}]
            for i, turn in enumerate(turns):
                messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": turn})
            reply = sdk.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            content = reply.choices[0].message.content
            assert content is not None and content.startswith("served by port ")
            return content

        # Each conversation's first turn, then the blocks it left reported by the agent.
        first = {system: ask(system, "Where are we?") for system in SYSTEMS}

        def reported() -> bool:
            text = metrics_text(cluster)
            held = [counter(text, "llmgw_router_kv_blocks", replica=r["replica_id"]) for r in rows]
            return sum(held) >= 3 * 8  # three conversations of 8 full blocks or more

        wait_for(reported, 20, "the engines' blocks to reach the control plane")

        def routed(text: str) -> tuple[float, float]:
            kv = counter(text, "llmgw_router_decisions_total", reason="kv_events")
            return kv, counter(text, "llmgw_router_tokenize_failures_total")

        kv_before, failed_before = routed(metrics_text(cluster))
        for _ in range(2):
            for system in SYSTEMS:
                again = ask(system, "Where are we?", "Here.", "And the cards?")
                assert again == first[system]  # back where its history is cached
        text = metrics_text(cluster)
        kv_after, failed_after = routed(text)
        lines = "\n".join(x for x in text.splitlines() if x.startswith("llmgw_router"))
        # Every follow-up was routed by the cache its replica reported, but for one whose
        # tokenizer did not answer in time on a loaded machine (then the guess routes it).
        kv, failed = kv_after - kv_before, failed_after - failed_before
        assert kv + failed == 2 * len(SYSTEMS) and kv >= len(SYSTEMS), lines
        assert counter(text, "llmgw_router_kv_hits_total", model="m") >= kv, lines
    finally:
        sdk.close()

    # The engines run with the flags that make their hashes the router's.
    for row in rows:
        cmdline = Path(f"/proc/{row['pid']}/cmdline").read_bytes().split(b"\0")
        assert b"--kv-events-config" in cmdline and b"sha256_cbor" in cmdline
        environ = Path(f"/proc/{row['pid']}/environ").read_bytes().split(b"\0")
        assert b"PYTHONHASHSEED=0" in environ
