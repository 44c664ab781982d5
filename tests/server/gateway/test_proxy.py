"""The gateway in one process in front of fake engines: how answers are judged, that no
client request counts against a replica, streams counted and their usage kept from
clients that did not ask, stale connections, timeouts and a client going away."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.config import GatewayConfig
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.gateway import Gateway, key_hash
from llmgw.server.gateway.proxy import StreamTap
from llmgw.server.gateway.router import BREAKER_FAILURES
from llmgw.server.store import ApiKeyRecord, SQLiteStore
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.support.fakeengine import FakeEngine
from tests.support.gatewayserve import served

KEY = "sk-llmgw-test"


@dataclass
class Harness:
    gateway: Gateway
    engines: list[FakeEngine]
    url: str
    http: aiohttp.ClientSession
    nodes: Any
    catalog: Any

    async def post(
        self, body: dict[str, Any], path: str = "/v1/chat/completions"
    ) -> tuple[int, Any]:
        async with self.http.post(
            self.url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    def failures(self) -> int:
        return sum(self.gateway.router.failures.values())

    def opened(self) -> int:
        return sum(self.gateway.router.breaker_opens.values())


def model(engine: str = "llama.cpp", max_output: int | None = None) -> Model:
    profile = Profile(name="default", engine=engine, replicas=2)
    return Model(
        name="m",
        source="hf:a/b",
        engine=engine,
        profiles=(profile,),
        context=4096,
        max_output=max_output,
    )


@contextlib.asynccontextmanager
async def harness(
    tmp_path: Path,
    replicas: int = 2,
    close_after_stream: bool = True,
    config: GatewayConfig | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
) -> AsyncIterator[Harness]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    engines = [await FakeEngine(close_after_stream).start() for _ in range(replicas)]
    view = NodeView(id="a", cert_serial=1, state=NodeState.READY, address="127.0.0.1")
    for i, engine in enumerate(engines):
        rid = f"m.default.0000000{i}"
        view.shards[rid] = ShardStatus(replica_id=rid, state=ShardState.READY, port=engine.port)
    nodes = SimpleNamespace(nodes={"a": view}, version=1)
    catalog = SimpleNamespace(models={"m": model()}, version=1)
    # A gateway long started (start_wait 0) unless the test says otherwise.
    config = config or GatewayConfig(start_wait=0.0)
    gateway = Gateway(store, nodes, catalog, b"s" * 32, config, lambda name, start: None)
    gateway.keys.changed(ApiKeyRecord("k1", "tester", key_hash(KEY), rpm=rpm, tpm=tpm))
    try:
        async with served(gateway) as (url, http):
            yield Harness(gateway, engines, url, http, nodes, catalog)
    finally:
        for engine in engines:
            await engine.stop()
        await store.close()


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(tmp_path) as h:
        yield h


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_a_gateway_just_started_waits_for_a_replica_rather_than_answering_no_replica(
    tmp_path: Path,
) -> None:
    """In its first seconds a control plane does not know yet what its agents run: a
    request that finds no replica waits for the agent to report one (or the probe to
    prove one the store remembered), and is served."""
    async with harness(tmp_path, config=GatewayConfig(start_wait=30.0)) as h:
        view = h.nodes.nodes["a"]
        reported = dict(view.shards)
        view.shards.clear()
        h.nodes.version += 1
        picks = []
        pick = h.gateway.router.pick

        def counted(*args: Any, **kwargs: Any) -> Any:
            found = pick(*args, **kwargs)
            picks.append(found)
            return found

        h.gateway.router.pick = counted  # type: ignore[method-assign]
        asked = asyncio.ensure_future(h.post(CHAT))
        async with asyncio.timeout(10):
            while not picks:  # the request has looked, and found none
                await asyncio.sleep(0.01)
        assert picks[0] is None and not asked.done()
        view.shards.update(reported)  # the agent registers again
        h.nodes.version += 1
        status, body = await asked
        assert status == 200, body


async def test_a_gateway_long_started_answers_no_replica_at_once(gw: Harness) -> None:
    gw.nodes.nodes["a"].shards.clear()
    gw.nodes.version += 1
    status, body = await gw.post(CHAT)
    assert status == 503 and body["error"]["code"] == "no_replica"


async def test_answers_about_the_request_go_to_the_client_and_count_for_nothing(
    gw: Harness,
) -> None:
    status, body = await gw.post({**CHAT, "x_mode": "client_error"})
    assert status == 400 and body["error"]["message"] == "bad field"
    assert body["error"]["code"] == "400"  # OpenAI's shape, whatever the engine wrote
    for _ in range(BREAKER_FAILURES + 1):  # a replica that does not do what was asked
        status, body = await gw.post({**CHAT, "x_mode": "not_supported"})
        assert status == 400 and "--embeddings" in body["error"]["message"]
    status, body = await gw.post({**CHAT, "x_mode": "parse_error"})
    assert status == 400 and body["error"]["code"] == "invalid_request"
    assert "could not read the request" in body["error"]["message"]
    status, body = await gw.post({**CHAT, "temperature": 9})
    assert status == 400 and body["error"]["param"] == "temperature"
    assert gw.failures() == 0 and gw.opened() == 0
    # The engine never saw the request the gateway refused.
    assert all(r.get("temperature") != 9 for e in gw.engines for r in e.requests)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    modes=st.lists(
        st.sampled_from(
            ["client_error", "parse_error", "not_supported", "ok", "bad_field", "bad_json"]
        ),
        min_size=5,
        max_size=30,
    )
)
def test_no_sequence_of_client_requests_opens_a_breaker(tmp_path: Path, modes: list[str]) -> None:
    async def run() -> None:
        async with harness(tmp_path / "h") as h:
            for mode in modes:
                if mode == "bad_field":
                    status, _ = await h.post({**CHAT, "max_tokens": -1})
                elif mode == "bad_json":
                    async with h.http.post(
                        h.url + "/v1/chat/completions",
                        data=b'{"model": "m", "temperature": NaN}',
                        headers={"Authorization": f"Bearer {KEY}"},
                    ) as resp:
                        status = resp.status
                else:
                    status, _ = await h.post({**CHAT, "x_mode": mode})
                assert status in (200, 400)
            assert h.failures() == 0 and h.opened() == 0
            assert all(e.failures == 0 for e in h.gateway.router.endpoints_of("m"))

    import shutil

    shutil.rmtree(tmp_path / "h", ignore_errors=True)
    (tmp_path / "h").mkdir()
    asyncio.run(run())


async def test_a_request_marks_when_its_node_last_served(gw: Harness) -> None:
    """Lending by policy lends a node whose cards served nothing for a while."""
    assert gw.gateway.router.last_served == {}
    before = time.monotonic()
    status, _ = await gw.post(CHAT)
    assert status == 200
    assert list(gw.gateway.router.last_served) == ["a"]
    first = gw.gateway.router.last_served["a"]
    assert before <= first <= time.monotonic()
    status, _ = await gw.post(CHAT)
    assert status == 200 and gw.gateway.router.last_served["a"] > first


async def test_a_failing_replica_is_retried_elsewhere_and_its_breaker_opens(gw: Harness) -> None:
    # Both replicas crash: each request tries both, then answers the engine's 500.
    for _ in range(BREAKER_FAILURES):
        status, _ = await gw.post({**CHAT, "x_mode": "crash"})
        assert status == 500
    assert gw.opened() == 2 and gw.failures() == 2 * BREAKER_FAILURES
    status, body = await gw.post(CHAT)
    assert status == 503 and body["error"]["code"] == "no_replica"


async def test_stale_connections_are_retried_on_the_same_replica_and_never_count(
    tmp_path: Path,
) -> None:
    """An engine that closes after every stream while announcing keep-alive, as
    llama.cpp's does: streams and plain answers alternating never fail."""
    async with harness(tmp_path, replicas=1) as h:
        h.catalog.models = {"m": replace(model(), profiles=(Profile("default", "vllm", 1),))}
        h.catalog.version += 1  # an engine not known to close: its connections are pooled
        for i in range(40):
            status, _ = await h.post({**CHAT, "stream": i % 2 == 0})
            assert status == 200
        assert h.failures() == 0
        assert h.gateway.upstream.stale_retries > 0  # the pool did offer closed ones


async def test_a_llama_cpp_connection_is_closed_after_a_stream_not_pooled(gw: Harness) -> None:
    for i in range(20):
        status, _ = await gw.post({**CHAT, "stream": i % 2 == 0})
        assert status == 200
    assert gw.failures() == 0 and gw.gateway.upstream.stale_retries == 0


async def test_a_stream_is_counted_and_its_usage_kept_from_a_client_that_did_not_ask(
    gw: Harness,
) -> None:
    async with gw.http.post(
        gw.url + "/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={"Authorization": f"Bearer {KEY}"},
    ) as resp:
        text = await resp.text()
    assert resp.status == 200 and '"usage"' not in text and text.endswith("data: [DONE]\n\n")
    sent = gw.engines[0].requests[-1] if gw.engines[0].requests else gw.engines[1].requests[-1]
    assert sent["stream_options"] == {"include_usage": True}
    async with gw.http.post(
        gw.url + "/v1/chat/completions",
        json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        headers={"Authorization": f"Bearer {KEY}"},
    ) as resp:
        asked = await resp.text()
    assert '"usage"' in asked
    ((_, counts),) = gw.gateway.usage.pending.items()
    assert counts == [2, 14, 10]  # two streams: 7 prompt and 5 completion tokens each


async def test_a_tokens_a_minute_limit_holds_for_streams_as_for_plain_answers(
    tmp_path: Path,
) -> None:
    for stream in (False, True):
        async with harness(tmp_path / str(stream), tpm=20) as h:
            answers = []
            for _ in range(3):
                status, _ = await h.post({**CHAT, "stream": stream})
                answers.append(status)
            assert answers == [200, 200, 429], stream  # 12 tokens each: the third is over


async def test_a_request_past_the_timeout_is_a_504_and_the_engine_hears_it_go(
    tmp_path: Path,
) -> None:
    config = GatewayConfig(request_timeout=0.5)
    async with harness(tmp_path, replicas=1, config=config) as h:
        status, body = await h.post({**CHAT, "x_mode": "slow", "x_delay": 5})
        assert status == 504 and body["error"]["code"] == "request_timeout"
        assert "gateway.request_timeout" in body["error"]["message"]
        for _ in range(50):
            if h.engines[0].cancelled:
                break
            await asyncio.sleep(0.05)
        assert h.engines[0].cancelled == 1
        assert h.failures() == 0  # slow is not broken


async def test_a_client_that_goes_away_cancels_the_engines_request(gw: Harness) -> None:
    task = asyncio.create_task(gw.post({**CHAT, "x_mode": "slow", "x_delay": 30}))
    for _ in range(100):
        if any(e.requests for e in gw.engines):
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if sum(e.cancelled for e in gw.engines):
            break
        await asyncio.sleep(0.05)
    assert sum(e.cancelled for e in gw.engines) == 1


async def test_a_body_that_does_not_arrive_in_time_is_refused(tmp_path: Path) -> None:
    config = GatewayConfig(body_timeout=0.3)
    async with harness(tmp_path, replicas=1, config=config) as h:

        async def trickle() -> AsyncIterator[bytes]:
            yield b'{"model": "m", '
            await asyncio.sleep(2)
            yield b'"messages": []}'

        async with h.http.post(
            h.url + "/v1/chat/completions",
            data=trickle(),
            headers={"Authorization": f"Bearer {KEY}"},
        ) as resp:
            assert resp.status == 408
            assert (await resp.json())["error"]["code"] == "body_timeout"


def test_the_stream_tap_keeps_whole_events_and_strips_usage() -> None:
    tap = StreamTap(strip=True)
    usage_event = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
    stream = (
        b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
        + usage_event
        + b"\n\ndata: [DONE]\n\n"
    )
    out = b"".join(tap.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + tap.end()
    assert b"usage" not in out and out.endswith(b"data: [DONE]\n\n") and b'"a"' in out
    assert tap.tokens() == (3, 2)
    # llama.cpp's completions put the usage in the last choice's event: only it goes.
    tap = StreamTap(strip=True)
    last = (
        b'data: {"choices": [{"text": "", "finish_reason": "length"}], '
        b'"usage": {"prompt_tokens": 4, "completion_tokens": 1}}\n\n'
    )
    out = tap.feed(last)
    assert b"usage" not in out and b"finish_reason" in out and tap.tokens() == (4, 1)
    # Without any usage, the events are the estimate.
    tap = StreamTap(strip=False)
    tap.feed(b"data: {}\n\ndata: {}\n\ndata: [DONE]\n\n")
    assert tap.tokens() == (0, 2)
