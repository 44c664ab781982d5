"""The gateway's span of each ``/v1`` request (GenAI semantic conventions), sent to an
OTLP receiver; and a collector that is down (a closed port, or one that takes the
connection and never answers) neither slows nor fails a request."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from llmgw.config import GatewayConfig, TracingConfig
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.gateway import Gateway, key_hash
from llmgw.server.store import ApiKeyRecord, SQLiteStore
from llmgw.tracing import Tracing, start
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.server.gateway.test_proxy import CHAT, KEY, model
from tests.server.gateway.test_resume import ASKED
from tests.support.fakeengine import FakeEngine
from tests.support.gatewayserve import served
from tests.support.otlp import Received, black_hole, closed_port, receiver

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
SERVER = 2  # the span kind, as OTLP numbers it
# A request answered by a fake engine takes milliseconds; one that waited on an export
# would take its 3 s timeout.
DEADLINE = 2.0


@dataclass
class Traced:
    gateway: Gateway
    url: str
    http: aiohttp.ClientSession
    engines: list[FakeEngine]

    async def post(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> int:
        async with self.http.post(
            self.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}", **(headers or {})},
        ) as resp:
            await resp.read()
            return resp.status


@contextlib.asynccontextmanager
async def traced_gateway(tmp_path: Path, tracing: Tracing) -> AsyncIterator[Traced]:
    """A gateway in front of two fake engines on node ``a``, tracing as given."""
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    engines = [await FakeEngine().start() for _ in range(2)]
    view = NodeView(id="a", cert_serial=1, state=NodeState.READY, address="127.0.0.1")
    for i, engine in enumerate(engines):
        rid = f"m.default.0000000{i}"
        view.shards[rid] = ShardStatus(
            replica_id=rid, state=ShardState.READY, port=engine.port, engine="llama.cpp"
        )
    nodes = SimpleNamespace(nodes={"a": view}, version=1)
    catalog = SimpleNamespace(models={"m": model()}, version=1)
    gateway = Gateway(
        store,
        nodes,
        catalog,
        b"s" * 32,
        GatewayConfig(start_wait=0.0),
        lambda name, start: None,
        tracing=tracing,
    )
    gateway.keys.changed(ApiKeyRecord("k1", "tester", key_hash(KEY)))
    try:
        async with served(gateway) as (url, http):
            yield Traced(gateway, url, http, engines)
    finally:
        for engine in engines:
            await engine.stop()
        await store.close()
        tracing.shutdown()


def by_status(spans: list[Received], status: int) -> list[Received]:
    return [s for s in spans if s.attributes.get("http.response.status_code") == status]


async def test_each_request_is_a_span_with_the_genai_attributes(tmp_path: Path) -> None:
    with receiver() as otlp:
        tracing = start(TracingConfig(otlp.endpoint), "llmgw-server", "cp-a")
        async with traced_gateway(tmp_path, tracing) as gw:
            assert await gw.post(CHAT, {"traceparent": CLIENT_PARENT}) == 200
            assert await gw.post({**CHAT, "stream": True}) == 200
            # Both replicas fail it: one retry, then the client's error.
            assert await gw.post({**CHAT, "x_mode": "crash"}) >= 500
            assert await gw.post({**CHAT, "model": "nope"}) == 404
        spans = otlp.spans  # shut down: everything queued was sent
    chats = by_status(spans, 200)
    assert [s.name for s in chats] == ["chat m", "chat m"]
    plain, streamed = chats
    assert plain.kind == SERVER and plain.service == "llmgw-server"
    # The client's trace is carried on.
    assert (plain.trace_id, plain.parent_id) == (CLIENT_TRACE, "00f067aa0ba902b7")
    assert streamed.parent_id == "" and streamed.trace_id != CLIENT_TRACE
    for span in chats:
        a = span.attributes
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.request.model"] == "m"
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (7, 5)
        assert a["llmgw.node"] == "a" and str(a["llmgw.replica"]).startswith("m.default.")
        assert a["llmgw.engine"] == "llama.cpp"
        assert (a["llmgw.retries"], a["llmgw.resumes"]) == (0, 0)
        ttft = a["llmgw.time_to_first_token"]
        assert isinstance(ttft, float) and 0 < ttft < (span.end_ns - span.start_ns) / 1e9
        assert a["url.path"] == "/v1/chat/completions" and "error.type" not in a
    (failed,) = [s for s in spans if s.attributes.get("llmgw.retries") == 1]
    assert failed.name == "chat m" and failed.attributes["error.type"] == str(
        failed.attributes["http.response.status_code"]
    )
    # Nothing was counted: the tokens are absent, not 0.
    assert "gen_ai.usage.input_tokens" not in failed.attributes
    (unknown,) = by_status(spans, 404)
    assert unknown.name == "chat" and "gen_ai.request.model" not in unknown.attributes


async def test_a_stream_carried_on_by_another_replica_says_so(tmp_path: Path) -> None:
    """Its engine dies after three tokens: the span names the replica that ended the
    answer, one resume, no retry, and the tokens of both parts."""
    with receiver() as otlp:
        tracing = start(TracingConfig(otlp.endpoint), "llmgw-server")
        async with traced_gateway(tmp_path, tracing) as gw:
            first, second = gw.gateway.router.endpoints_of("m")
            second.outstanding += 1  # the first pick goes to engine 0
            gw.engines[0].dies_after = 3
            assert await gw.post(ASKED) == 200
            second.outstanding -= 1
        (span,) = otlp.spans
    a = span.attributes
    assert (a["llmgw.resumes"], a["llmgw.retries"]) == (1, 0)
    assert a["llmgw.replica"] == second.replica_id != first.replica_id
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (7, 8)


async def test_a_collector_that_never_answers_neither_slows_nor_fails_a_request(
    tmp_path: Path,
) -> None:
    """The export of the first spans hangs on a collector that took the connection and
    says nothing (for the whole export timeout, 3 s); the requests made meanwhile are
    each answered in milliseconds, as with no collector at all. The deadline, 2 s, is
    far above that on two loaded cores and under the 3 s a request waiting on the
    export would take."""
    with black_hole() as hole:
        tracing = start(TracingConfig(hole.endpoint), "llmgw-server")
        async with traced_gateway(tmp_path, tracing) as gw:
            assert await gw.post(CHAT) == 200
            deadline = time.monotonic() + 10
            while hole.accepted == 0:  # the exporter is now stuck in its export
                assert time.monotonic() < deadline, "the exporter never connected"
                await gw.post(CHAT)
            slowest = 0.0
            for _ in range(20):
                began = time.monotonic()
                assert await gw.post(CHAT) == 200
                slowest = max(slowest, time.monotonic() - began)
            assert hole.accepted >= 1 and slowest < DEADLINE


async def test_a_closed_port_as_collector_fails_no_request(tmp_path: Path) -> None:
    """The exporter retries a refused connection for its whole timeout (3 s): none of
    it on a request's way."""
    tracing = start(TracingConfig(f"http://127.0.0.1:{closed_port()}"), "llmgw-server")
    async with traced_gateway(tmp_path, tracing) as gw:
        slowest = 0.0
        for _ in range(20):
            began = time.monotonic()
            assert await gw.post(CHAT) == 200
            slowest = max(slowest, time.monotonic() - began)
        assert slowest < DEADLINE
