"""A stream that survives its replica, with real llama-server replicas: the engine
serving a streamed chat answer is killed mid-answer, and the official openai SDK sees one
stream that ends normally, with the content of both replicas and the usage once."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from tests.e2e.catalog import ctl_json, join, replicas, scheduled, serve, wait_ready
from tests.e2e.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e

CHAT = {"role": "user", "content": "hello"}
# The tiny model never ends an answer itself: it says this many tokens, or fills its
# context (512) first. At about half a millisecond a token on one core, the answer is
# being generated for a fifth of a second after its first token.
MAX_TOKENS = 400
INFLIGHT = re.compile(r'^llmgw_replica_inflight\{model="tiny",replica="([^"]+)"\} (\d+)$', re.M)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def metrics(cluster: Cluster) -> str:
    req = urllib.request.Request(
        f"http://{cluster.listen}/metrics",
        headers={"authorization": f"Bearer {cluster.admin_token}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(resp.read().decode())


def resumed(cluster: Cluster) -> int:
    found = re.search(
        r'^llmgw_gateway_stream_resumed_total\{model="tiny"\} (\d+)$', metrics(cluster), re.M
    )
    return int(found[1]) if found else 0


def content(chunk: Any) -> str:
    return (chunk.choices[0].delta.content or "") if chunk.choices else ""


@contextlib.contextmanager
def stopped(pids: dict[str, int]) -> Iterator[None]:
    """Every engine stopped where it is (SIGSTOP), and let go again after."""
    for pid in pids.values():
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def stream_and_kill(
    cluster: Cluster, key: str, pids: dict[str, int]
) -> tuple[list[Any], int, str | None]:
    """A streamed answer read with the SDK; at its first content both engines are
    stopped where they are, the one serving it (the gateway's inflight) is killed and the
    other let go. The chunks, the content chunks read before the kill, and the replica
    killed (None when the answer had already left its engine whole)."""
    sdk = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0)
    with sdk:
        answer = sdk.chat.completions.create(
            model="tiny",
            messages=[CHAT],  # type: ignore[list-item]
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks: list[Any] = []
        before = 0
        killed: str | None = None
        decided = False
        for chunk in answer:
            chunks.append(chunk)
            if decided or not content(chunk):
                continue
            decided = True
            before = sum(1 for c in chunks if content(c))
            with stopped(pids):
                # The gateway still scrapes the stopped engines: 2 s, then it answers.
                busy = [r for r, n in INFLIGHT.findall(metrics(cluster)) if int(n) and r in pids]
                if busy:
                    (killed,) = busy
                    os.kill(pids[killed], signal.SIGKILL)
        return chunks, before, killed


def live_engines(cluster: Cluster) -> dict[str, int]:
    """Both replicas Ready with their engines alive: after an attempt's kill, the control
    plane shows the killed one Ready until its agent has seen it exit, then failed ("the
    engine exited") until its replacement is Ready."""

    def alive(pid: int | None) -> bool:
        try:
            return bool(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def check() -> dict[str, int] | None:
        ready = [r for r in replicas(cluster, "tiny") if r["state"] == "ready"]
        pids = {r["replica_id"]: r["pid"] for r in ready}
        return pids if len(pids) == 2 and all(alive(pid) for pid in pids.values()) else None

    found: dict[str, int] = wait_for(check, 120, "two replicas with live engines")
    return found


def test_a_stream_whose_engine_is_killed_goes_on_from_the_other_replica(
    cluster: Cluster, binary: Path, model: Path
) -> None:
    join(cluster, "a", binary)
    serve(
        cluster, model, "tiny", "--replicas", "2", "--context", "512", "--slots", "1",
        "--cpu-cores", "1",
    )  # fmt: skip
    rows = wait_ready(cluster, "tiny", 2)
    plain = ctl_json(cluster, "keys", "create", "--name", "plain")["key"]
    sdk = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=plain, max_retries=0)
    with sdk:
        reference = sdk.chat.completions.create(model="tiny", messages=[CHAT], max_tokens=1)  # type: ignore[list-item]
    assert reference.usage is not None
    prompt = reference.usage.prompt_tokens

    # The setup's condition, not a sleep: the kill must land while the answer is being
    # generated, and early in it. An answer that had left its engine whole is tried
    # again; so is one stopped late: the tiny model's words are whole tokens when it
    # says them but letters when its tokenizer reads them back, so past about 120 of
    # them the continuation's prompt is over its context of 512 (its engine refuses it;
    # a real model reads its own words back as it said them).
    late = "exceeds the available context size"
    # A loaded machine reads the first word late, when the whole answer may have left
    # its engine already: up to ten tries.
    for attempt in range(10):
        pids = live_engines(cluster)
        already = resumed(cluster)
        key = ctl_json(cluster, "keys", "create", "--name", f"streamer-{attempt}")["key"]
        try:
            chunks, before, killed = stream_and_kill(cluster, key, pids)
        except openai.APIError as exc:
            if late in str(exc):
                continue
            raise
        if killed is not None and resumed(cluster) == already + 1:
            break
    else:
        pytest.fail("the kill never landed early in an answer being generated")

    # One stream: the first engine's id throughout, one role chunk, a normal end.
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].delta.role for c in chunks if c.choices][0] == "assistant"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    texts = [content(c) for c in chunks if content(c)]
    # Killed mid-answer: the first engine had said part of it, the other the rest.
    assert 0 < before < len(texts)
    # The usage once, in the last chunk: every content chunk is one of the tiny model's
    # tokens, and the prompt is the original's, as the other replica counted it.
    usages = [c.usage for c in chunks if c.usage is not None]
    assert len(usages) == 1 and chunks[-1].usage is usages[0]
    usage = usages[0]
    assert usage.completion_tokens == len(texts)
    assert usage.prompt_tokens == prompt
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # Recorded once for the key, as the client was told, under the replica that ended it.
    rows = [r for r in ctl_json(cluster, "usage") if r["key_name"] == f"streamer-{attempt}"]
    assert len(rows) == 1 and rows[0]["requests"] == 1, rows
    assert rows[0]["replica"] != killed
    assert (rows[0]["prompt_tokens"], rows[0]["completion_tokens"]) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    text = metrics(cluster)
    assert f'llmgw_replica_failures_total{{model="tiny",replica="{killed}"}}' in text
