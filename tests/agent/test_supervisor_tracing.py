"""A replica start on the node, traced: the supervisor carries on the control plane's
span (the StartShard's traceparent) through install, fetch, engine start and ready, each
a child span ended with its step; a start that fails records why on the step and the
start. A stand-in llama-server (tests/agent/test_supervisor_adopt.py) is the engine."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from pathlib import Path

from llmgw.agent.supervisor import Supervisor
from llmgw.agent.weights import WeightsError
from llmgw.config import TracingConfig
from llmgw.tracing import start
from llmgw.wire.messages import DownloadProgress, Message, ShardSpec
from llmgw.wire.states import ShardState
from tests.agent.test_supervisor_adopt import Fetched, Installed, until_ready, write_engine
from tests.e2e.cluster import free_port
from tests.support.otlp import receiver

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
STEPS = ["install", "fetch", "engine start", "ready"]


class Unfetchable(Fetched):
    async def fetch(
        self,
        source: str,
        *,
        allow_pickle: bool,
        replica_id: str,
        progress: Callable[[DownloadProgress], None],
        vouched: Mapping[str, str] | None = None,
        hub: str | None = None,
    ) -> Path:
        raise WeightsError(f"{source}: the hub answered 404")


def spec(tmp_path: Path, replica_id: str) -> ShardSpec:
    return ShardSpec(
        replica_id=replica_id,
        engine="llama.cpp",
        source=str(tmp_path / "tiny.gguf"),
        port=free_port(),
        key="k",
        fingerprint="f",
    )


async def test_a_start_continues_the_control_planes_trace_step_by_step(tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    sent: list[Message] = []
    with receiver() as otlp:
        tracing = start(TracingConfig(otlp.endpoint), "llmgw-agent", "node-a")
        sup = Supervisor(
            tmp_path / "shards",
            Installed(write_engine(tmp_path)),
            Fetched(model),
            sent.append,
            host="127.0.0.1",
            tracing=tracing,
        )
        try:
            sup.start(spec(tmp_path, "r"), TRACEPARENT)
            await until_ready(sup, "r")
        finally:
            await sup.stop("r", grace=2)
            await sup.close()
            tracing.shutdown()
        spans = {s.name: s for s in otlp.spans}
    assert sorted(spans) == sorted(["replica start", *STEPS])
    top = spans["replica start"]
    assert (top.trace_id, top.parent_id, top.service, top.instance) == (
        TRACE,
        PARENT,
        "llmgw-agent",
        "node-a",
    )
    assert top.attributes["llmgw.replica"] == "r" and top.status == 0
    for name in STEPS:
        step = spans[name]
        assert (step.trace_id, step.parent_id, step.status) == (TRACE, top.span_id, 0)
    # One after another, each ended before the next began, all within the start.
    times = [(spans[n].start_ns, spans[n].end_ns) for n in STEPS]
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(times))
    assert top.start_ns <= times[0][0] and times[-1][1] <= top.end_ns
    assert spans["install"].attributes["llmgw.engine.version"] == "b6000"
    assert isinstance(spans["engine start"].attributes["llmgw.pid"], int)


async def test_a_failed_fetch_is_recorded_on_the_step_and_the_start(tmp_path: Path) -> None:
    sent: list[Message] = []
    with receiver() as otlp:
        tracing = start(TracingConfig(otlp.endpoint), "llmgw-agent")
        sup = Supervisor(
            tmp_path / "shards",
            Installed(write_engine(tmp_path)),
            Unfetchable(tmp_path / "tiny.gguf"),
            sent.append,
            host="127.0.0.1",
            tracing=tracing,
        )
        try:
            sup.start(spec(tmp_path, "r"), TRACEPARENT)
            async with asyncio.timeout(30):
                while sup.shards["r"].state != ShardState.FAILED:
                    await asyncio.sleep(0.05)
        finally:
            await sup.close()
            tracing.shutdown()
        spans = {s.name: s for s in otlp.spans}
    assert sorted(spans) == ["fetch", "install", "replica start"]
    for name in ("fetch", "replica start"):
        assert spans[name].status == 2 and spans[name].events == ("exception",)
        assert spans[name].attributes["error.type"] == "WeightsError"
    assert spans["install"].status == 0
    assert "the hub answered 404" in sup.shards["r"].reason
