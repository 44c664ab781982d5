"""``Dispatch`` with tracing on: each pass is a trace of its own, each start a span in
it, and the StartShard carries that span's traceparent to the agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.config import SchedulingConfig, TracingConfig
from llmgw.server.catalog.dispatch import Dispatch
from llmgw.server.catalog.model import Model
from llmgw.server.store import SQLiteStore
from llmgw.tracing import start
from tests.server.catalog.test_dispatch import SECRET, Clock, Loop, starts
from tests.support import wiring
from tests.support.otlp import Receiver, receiver


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[tuple[Loop, Receiver]]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    clock = Clock()
    config = SchedulingConfig(backoff_base=10.0, park_after=1, interval=60.0)
    reconciler = wiring.reconciler(config, clock=clock, engine_version=lambda e: "b4321")
    registry = wiring.registry(store)
    models: dict[str, Model] = {}

    async def park(name: str, reason: str) -> None:
        pass

    with receiver() as otlp:
        tracing = start(TracingConfig(otlp.endpoint), "llmgw-server", "cp-a")
        dispatch = Dispatch(
            reconciler, registry, models, SECRET, config, asyncio.Event(), park, tracing=tracing
        )
        try:
            yield Loop(dispatch, reconciler, registry, clock, models), otlp
        finally:
            tracing.shutdown()
            await store.close()


async def test_a_start_carries_its_span_to_the_agent_in_the_pass_trace(
    traced: tuple[Loop, Receiver],
) -> None:
    loop, otlp = traced
    a = loop.node("a")
    loop.serve("m")
    await loop.dispatch.reconcile()  # places m on a
    await loop.dispatch.reconcile()  # nothing to do: a trace of its own all the same
    loop.dispatch.tracing.shutdown()  # what is queued, sent
    (sent,) = starts(a)
    assert sent.traceparent is not None
    _, trace_id, span_id, _ = sent.traceparent.split("-")
    (start_span,) = otlp.named("replica start")
    first, second = otlp.named("reconcile")
    assert (start_span.trace_id, start_span.span_id) == (trace_id, span_id)
    assert start_span.parent_id == first.span_id and first.trace_id == trace_id
    assert first.parent_id == "" and second.parent_id == "" and second.trace_id != trace_id
    assert start_span.attributes == {
        "llmgw.model": "m",
        "llmgw.profile": "default",
        "llmgw.replica": sent.spec.replica_id,
        "llmgw.node": "a",
        "llmgw.engine": "llama.cpp",
    }
    assert first.attributes["llmgw.reconcile.starts"] == 1
    assert second.attributes["llmgw.reconcile.starts"] == 0
    assert {s.instance for s in otlp.spans} == {"cp-a"}
