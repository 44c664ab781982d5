"""The gateway with the official openai SDK against real llama-server replicas: chat,
streams, embeddings, models, keys and their limits, a replica killed under load, and
`llmgw stop` / `llmgw start`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.catalog import (
    ctl,
    ctl_json,
    join,
    passes,
    replicas,
    scheduled,
    serve,
    serve_tiny,
    wait_ready,
)
from tests.e2e.cluster import Cluster, run, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    # On-demand models go back to zero after 4 s idle here.
    c = scheduled(tmp_path, "  on_demand_idle: 4\n")
    try:
        yield c
    finally:
        c.stop()


def make_key(cluster: Cluster, *extra: str) -> str:
    made = ctl_json(cluster, "keys", "create", "--name", "tester", *extra)
    assert made["key"].startswith("sk-llmgw-") and made["state"] == "active"
    return str(made["key"])


_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    """Every SDK client a test made is closed after it, so no socket is left to GC."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def client(cluster: Cluster, key: str) -> openai.OpenAI:
    sdk = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0)
    _OPEN.append(sdk)
    return sdk


CHAT = {"role": "user", "content": "hello"}


def test_sdk_chat_stream_embeddings_and_models(cluster: Cluster, binary: Path, model: Path) -> None:
    join(cluster, "a", binary)
    serve(cluster, model, "tiny", "--max-output", "8")
    serve(cluster, model, "tiny-embed", "--arg=--embeddings", "--arg=--pooling", "--arg=mean")
    wait_ready(cluster, "tiny", 1)
    wait_ready(cluster, "tiny-embed", 1)
    key = make_key(cluster)
    sdk = client(cluster, key)

    assert sorted(m.id for m in sdk.models.list()) == ["tiny", "tiny-embed"]

    reply = sdk.chat.completions.create(model="tiny", messages=[CHAT], max_tokens=500)
    assert reply.choices[0].message.content is not None
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 8  # max_output

    chunks = list(
        sdk.chat.completions.create(
            model="tiny",
            messages=[CHAT],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(chunks) > 2
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    text = sdk.completions.create(model="tiny", prompt="once upon", max_tokens=4)
    assert text.choices[0].text is not None

    vectors = sdk.embeddings.create(model="tiny-embed", input=["one", "two"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) > 0

    async def async_calls() -> list[str]:
        aclient = openai.AsyncOpenAI(
            base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0
        )
        async with aclient:
            answers = await asyncio.gather(
                *(
                    aclient.chat.completions.create(model="tiny", messages=[CHAT], max_tokens=3)
                    for _ in range(4)
                )
            )
        return [a.choices[0].finish_reason or "" for a in answers]

    assert len(asyncio.run(async_calls())) == 4

    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="nope", messages=[CHAT])
    assert missing.value.code == "model_not_found"
    status, _, body = cluster.post("/v1/chat/completions", b"{not json", key)
    assert status == 400 and body["error"]["code"] == "invalid_json"
    # A long prompt past aiohttp's default 1 MiB: accepted, and answered.
    long = json.dumps(
        {"model": "tiny", "messages": [CHAT], "max_tokens": 1, "pad": "x" * (3 * 2**20)}
    ).encode()
    status, _, body = cluster.post("/v1/chat/completions", long, key)
    assert status == 200, body
    status, _, body = cluster.post("/v1/chat/completions", b" " * (33 * 2**20), key)
    assert status == 400 and body["error"]["code"] == "body_too_large"
    assert "32 MiB" in body["error"]["message"]
    status, _, body = cluster.post("/v1/chat/completions", b'{"messages": []}', key)
    assert status == 400 and body["error"]["param"] == "model"
    assert set(body["error"]) == {"message", "type", "param", "code"}

    req = urllib.request.Request(
        f"http://{cluster.listen}/metrics",
        headers={"authorization": f"Bearer {cluster.admin_token}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        metrics = resp.read().decode()
    assert 'llmgw_requests_total{model="tiny",code="200"} ' in metrics
    assert 'llmgw_errors_total{model="",type="not_found_error"} 1' in metrics
    assert 'llmgw_time_to_first_token_seconds_bucket{model="tiny",le="+Inf"}' in metrics
    assert 'llmgw_tokens_total{model="tiny",kind="completion"}' in metrics
    assert 'llmgw_replica_inflight{model="tiny",replica="tiny.default.' in metrics
    # llama-server's own metrics, scraped with the replica's key, relabelled and renamed
    # to Prometheus's rules (llama.cpp's colons and its counter without _total).
    assert 'llamacpp_prompt_tokens_total{model="tiny",replica="tiny.default.' in metrics
    assert "# TYPE llamacpp_n_tokens_max_total counter" in metrics
    assert not re.search(r"^(# TYPE )?llamacpp:", metrics, re.M)
    # With an engine serving, the whole of /metrics is clean to promtool: nothing said.
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs Debian's prometheus package"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=metrics, capture_output=True, text=True, timeout=30
    )
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")


def test_keys_revoked_expired_not_allowed_and_over_rpm(cluster: Cluster, binary: Path) -> None:
    serve_tiny(cluster, binary)

    with pytest.raises(openai.AuthenticationError):
        client(cluster, "sk-llmgw-unknown").models.list()

    revoked = make_key(cluster)
    client(cluster, revoked).models.list()
    key_id = next(k["id"] for k in ctl_json(cluster, "keys", "list") if k["state"] == "active")
    assert ctl_json(cluster, "keys", "revoke", key_id)["state"] == "revoked"
    with pytest.raises(openai.AuthenticationError):
        client(cluster, revoked).models.list()

    # Far enough ahead that making the key and using it once fit on a loaded machine;
    # then asked until the moment has passed and the key is refused as expired.
    at = float(int(time.time()) + 15)  # whole seconds, as --expires takes it
    expiring = make_key(cluster, "--expires", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)))
    client(cluster, expiring).models.list()
    assert time.time() < at, "the key was used only after it expired: the check proved nothing"

    def refused() -> openai.AuthenticationError | None:
        try:
            client(cluster, expiring).models.list()
        except openai.AuthenticationError as exc:
            return exc
        return None

    expired = wait_for(refused, 30, "the key to be refused once expired", step=0.5)
    assert expired.code == "expired_api_key" and time.time() >= at

    others = make_key(cluster, "--models", "other*,qwen-*")
    assert client(cluster, others).models.list().data == []
    with pytest.raises(openai.NotFoundError):
        client(cluster, others).chat.completions.create(model="tiny", messages=[CHAT])

    limited = make_key(cluster, "--rpm", "2")
    sdk = client(cluster, limited)
    for _ in range(2):
        sdk.chat.completions.create(model="tiny", messages=[CHAT], max_tokens=2)
    body = json.dumps({"model": "tiny", "messages": [CHAT], "max_tokens": 2}).encode()
    status, headers, answer = cluster.post("/v1/chat/completions", body, limited)
    assert status == 429 and answer["error"]["type"] == "rate_limit_error"
    assert "requests per minute" in answer["error"]["message"]
    assert 1 <= int(headers["Retry-After"]) <= 60


def test_a_replica_killed_under_load_fails_over_before_streaming(
    cluster: Cluster, binary: Path, model: Path
) -> None:
    join(cluster, "a", binary)
    serve(cluster, model, "tiny", "--replicas", "2")
    rows = wait_ready(cluster, "tiny", 2)
    sdk = client(cluster, make_key(cluster))
    errors: list[BaseException] = []
    done = 0
    stop = threading.Event()

    def load() -> None:
        nonlocal done
        while not stop.is_set():
            try:
                sdk.chat.completions.create(model="tiny", messages=[CHAT], max_tokens=2)
                done += 1
            except Exception as exc:  # every failure is counted, none hidden
                errors.append(exc)

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    wait_for(lambda: done >= 20, 30, "requests to flow")
    os.kill(rows[0]["pid"], signal.SIGKILL)
    before = done
    wait_for(lambda: done >= before + 40, 30, "requests to go on")
    stop.set()
    for w in workers:
        w.join(10)
    assert errors == []


def test_stop_and_start(cluster: Cluster, binary: Path) -> None:
    serve_tiny(cluster, binary)
    key = make_key(cluster)
    out = run("stop", "--data-dir", str(cluster.data_dir))
    assert out.stdout.startswith("stopped")
    body = json.dumps({"model": "tiny", "messages": [CHAT]}).encode()
    status, _, answer = cluster.post("/v1/chat/completions", body, key)
    assert status == 503 and answer["error"]["code"] == "system_stopped"
    wait_for(lambda: not replicas(cluster, "tiny"), 30, "every replica to stop")
    assert ctl_json(cluster, "model", "show", "tiny")["replicas"] == 1  # catalog unchanged
    status_json = json.loads(run("status", "--json", "--data-dir", str(cluster.data_dir)).stdout)
    assert status_json["serving"] == "stopped"

    run("start", "--data-dir", str(cluster.data_dir))
    wait_ready(cluster, "tiny", 1)
    reply = client(cluster, key).chat.completions.create(
        model="tiny", messages=[CHAT], max_tokens=2
    )
    assert reply.choices


def test_tokens_a_minute_a_budget_and_usage(cluster: Cluster, binary: Path) -> None:
    serve_tiny(cluster, binary)
    body = json.dumps({"model": "tiny", "messages": [CHAT], "max_tokens": 3}).encode()
    for flag, words in (("--tpm", "tokens per minute"), ("--budget", "tokens a month")):
        key = make_key(cluster, flag, "5")
        status, _, first = cluster.post("/v1/chat/completions", body, key)
        assert status == 200 and first["usage"]["total_tokens"] > 5
        status, headers, answer = cluster.post("/v1/chat/completions", body, key)
        assert status == 429 and words in answer["error"]["message"]
        assert int(headers["Retry-After"]) >= 1

    streamer = make_key(cluster)
    sdk = client(cluster, streamer)
    # A stream without include_usage: the engine is asked for it, the client never sees it.
    chunks = list(
        sdk.chat.completions.create(model="tiny", messages=[CHAT], max_tokens=4, stream=True)
    )
    assert chunks and all(c.usage is None and c.choices for c in chunks)
    rows = ctl_json(cluster, "usage")
    tester = [r for r in rows if r["key_name"] == "tester"]
    assert sum(r["requests"] for r in tester) == 3  # the two keys' first requests, the stream
    assert all(r["model"] == "tiny" and r["replica"].startswith("tiny.default.") for r in rows)
    assert sum(r["completion_tokens"] for r in tester) >= 3
    streamed = [r for r in rows if r["key_id"] == ctl_json(cluster, "keys", "list")[-1]["id"]]
    assert streamed and streamed[0]["prompt_tokens"] > 0  # counted as a plain answer is
    by_model = ctl(cluster, "usage", "--by", "model").stdout.splitlines()
    assert by_model[0].split() == ["MODEL", "REQUESTS", "PROMPT", "COMPLETION", "TOKENS"]
    assert by_model[1].split()[:2] == ["tiny", "3"]


def test_a_tokens_a_minute_limit_holds_for_streams_as_for_plain_answers(
    cluster: Cluster, binary: Path
) -> None:
    serve_tiny(cluster, binary)
    body = {"model": "tiny", "messages": [CHAT], "max_tokens": 12, "ignore_eos": True}
    raw = json.dumps(body).encode()
    _, _, first = cluster.post("/v1/chat/completions", raw, make_key(cluster))
    each = first["usage"]["total_tokens"]
    for stream in (False, True):
        key = make_key(cluster, "--tpm", str(2 * each - 1))
        statuses = []
        for _ in range(3):
            sent = json.dumps({**body, "stream": stream}).encode()
            statuses.append(cluster.post("/v1/chat/completions", sent, key)[0])
        assert statuses == [200, 200, 429], (stream, statuses)


def test_streams_and_plain_answers_alternating_never_fail(cluster: Cluster, binary: Path) -> None:
    """llama.cpp closes its connection after a stream while announcing keep-alive: no
    request may land on such a connection."""
    serve_tiny(cluster, binary)
    sdk = client(cluster, make_key(cluster))
    for i in range(120):
        if i % 2:
            assert sdk.chat.completions.create(model="tiny", messages=[CHAT], max_tokens=2)
        else:
            assert list(
                sdk.chat.completions.create(
                    model="tiny", messages=[CHAT], max_tokens=2, stream=True
                )
            )


def test_an_external_provider_with_keys_rate_limited_and_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    from aiohttp import web

    from tests.support.engines import LoopThread

    seen: list[tuple[str, str]] = []

    async def chat(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        body = await request.json()
        seen.append((auth, body["model"]))
        if auth == "Bearer key-limited":
            return web.json_response(
                {"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "120"}
            )
        if auth != "Bearer key-good":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "from the provider"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            }
        )

    loop = LoopThread()

    async def serve() -> tuple[web.AppRunner, int]:
        app = web.Application()
        app.router.add_post("/openai/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    runner, port = loop.run(serve())
    try:
        files = []
        for name in ("good", "limited", "refused"):
            path = tmp_path / f"{name}.key"
            path.write_text(f"key-{name}\n")
            files.append(str(path))
        shown = ctl_json(
            cluster,
            "model",
            "external",
            "gpt",
            "--base-url",
            f"http://127.0.0.1:{port}/openai/v1",
            "--key-file",
            files[0] + ":1",
            "--key-file",
            files[1] + ":4",
            "--key-file",
            files[2] + ":4",
            "--upstream-model",
            "big-model-2",
        )
        assert [e["name"] for e in shown["external"]["endpoints"]] == [
            "external:gpt#1",
            "external:gpt#2",
            "external:gpt#3",
        ]
        sdk = client(cluster, make_key(cluster))
        for _ in range(6):
            reply = sdk.chat.completions.create(model="gpt", messages=[CHAT])
            assert reply.choices[0].message.content == "from the provider"
        # The heavier keys were tried first, then passed over: each once.
        tried = [auth for auth, _ in seen]
        assert tried.count("Bearer key-limited") == 1 and tried.count("Bearer key-refused") == 1
        assert tried.count("Bearer key-good") == 6
        assert {model for _, model in seen} == {"big-model-2"}
        state = {
            e["name"]: e for e in ctl_json(cluster, "model", "show", "gpt")["external"]["endpoints"]
        }
        assert state["external:gpt#1"]["state"] == "ok"
        assert "429" in state["external:gpt#2"]["problem"]
        assert "401" in state["external:gpt#3"]["problem"]
        # Keys are never shown, nor logged.
        everything = (
            json.dumps(cluster.api("/api/v1/models")) + (cluster.root / "server.log").read_text()
        )
        assert "key-good" not in everything and "key-refused" not in everything
        usage = {r["replica"] for r in ctl_json(cluster, "usage")}
        assert usage == {"external:gpt#1"}
    finally:
        loop.run(runner.cleanup())
        loop.close()


def test_on_demand_starts_on_the_first_request_and_idles_back_to_zero(
    cluster: Cluster, binary: Path, model: Path
) -> None:
    join(cluster, "a", binary)
    serve(cluster, model, "lazy", "--on-demand")
    passes(cluster)
    assert replicas(cluster, "lazy") == []
    sdk = client(cluster, make_key(cluster))
    started = time.monotonic()
    reply = sdk.chat.completions.create(model="lazy", messages=[CHAT], max_tokens=2)
    assert reply.choices and time.monotonic() - started < 60
    assert len(replicas(cluster, "lazy")) == 1
    # Idle past on_demand_idle: back to zero, and the catalog still has it.
    wait_for(lambda: not replicas(cluster, "lazy"), 30, "the idle model to go to zero")
    assert ctl_json(cluster, "model", "show", "lazy")["state"] == "idle"

    # A stream asked at zero begins at once, kept alive while the replica starts.
    key = make_key(cluster)
    body = json.dumps(
        {"model": "lazy", "messages": [CHAT], "max_tokens": 3, "stream": True}
    ).encode()
    req = urllib.request.Request(
        f"http://{cluster.listen}/v1/chat/completions",
        data=body,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        streamed = resp.read().decode()
    assert streamed.startswith(": llmgw: starting a replica of lazy\n\n")
    assert '"delta"' in streamed and streamed.rstrip().endswith("data: [DONE]")
    chunks = list(
        client(cluster, key).chat.completions.create(
            model="lazy", messages=[CHAT], max_tokens=3, stream=True
        )
    )
    assert chunks
