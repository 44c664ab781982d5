"""``llmgw.tracing``: its settings, the sampler, the log filter, and that off it imports
nothing; spans checked as an OTLP collector receives them (tests/support/otlp.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from llmgw.config import (
    AgentConfig,
    ConfigError,
    ServerConfig,
    TracingConfig,
    agent_setting_keys,
    build,
    merge_agent_layers,
)
from llmgw.tracing import OFF, Tracing, exporter_for, install_log_filter, start
from llmgw.wire.codec import from_map, to_map
from llmgw.wire.messages import ShardSpec, StartShard
from tests.support.otlp import Receiver, receiver

SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
NOT_SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def sampled(traceparent: str | None) -> bool:
    """The traceparent's sampled flag (its other bits may say its id is random)."""
    assert traceparent is not None
    return bool(int(traceparent.split("-")[3], 16) & 1)


@pytest.fixture
def otlp() -> Iterator[Receiver]:
    with receiver() as got:
        yield got


@pytest.fixture
def made() -> Iterator[list[Tracing]]:
    """Every tracing a test starts, shut down after it (its export thread with it)."""
    out: list[Tracing] = []
    yield out
    for t in out:
        t.shutdown()


def test_tracing_is_off_unless_an_endpoint_is_set() -> None:
    assert ServerConfig().tracing == TracingConfig(endpoint=None, sample=1.0)
    assert AgentConfig().tracing.endpoint is None
    assert start(TracingConfig(), "llmgw-server") is OFF
    with OFF.span("x") as span:
        span.set("a", 1)
        assert span.traceparent is None and span.trace_id is None


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"endpoint": "collector:4318"}, "tracing.endpoint: must be an OTLP collector's URL"),
        ({"endpoint": "http://"}, "tracing.endpoint: must be an OTLP collector's URL"),
        ({"endpoint": "udp://x:1"}, "tracing.endpoint: must be an OTLP collector's URL"),
        ({"sample": 1.5}, "tracing.sample: must be from 0 to 1"),
        ({"sample": -0.1}, "tracing.sample: must be from 0 to 1"),
        ({"sample": "half"}, "tracing.sample: expected a number"),
        ({"endpoints": "http://x"}, "unknown key 'endpoints'"),
    ],
)
@pytest.mark.parametrize("cls", [ServerConfig, AgentConfig])
def test_a_bad_tracing_setting_is_refused_naming_its_key(
    cls: type[ServerConfig | AgentConfig], section: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigError) as err:
        build(cls, {"tracing": section}, "x.yaml")
    assert problem in str(err.value)


def test_good_tracing_settings_and_where_each_kind_of_endpoint_goes() -> None:
    config = build(
        ServerConfig, {"tracing": {"endpoint": "http://otel:4318", "sample": 0.25}}, "x.yaml"
    )
    assert config.tracing == TracingConfig("http://otel:4318", 0.25)
    assert exporter_for("http://otel:4318") == ("http", "http://otel:4318/v1/traces")
    assert exporter_for("https://otel/") == ("http", "https://otel/v1/traces")
    assert exporter_for("https://tempo/otlp/v1/traces") == ("http", "https://tempo/otlp/v1/traces")
    assert exporter_for("grpc://otel:4317") == ("grpc", "otel:4317")
    assert exporter_for("grpcs://otel:4317") == ("grpc", "otel:4317")


def test_the_cluster_sets_the_agents_tracing_key_by_key() -> None:
    """`ctl config set tracing.endpoint` for every node, `tracing.sample` for one: the
    node's layer changes only the key it names."""
    assert {"tracing.endpoint", "tracing.sample"} <= set(agent_setting_keys())
    merged = merge_agent_layers(
        {"tracing": {"endpoint": "http://otel:4318"}}, {"tracing": {"sample": 0.1}}
    )
    assert merged == {"tracing": {"endpoint": "http://otel:4318", "sample": 0.1}}
    assert build(AgentConfig, merged, "agent.yaml").tracing == TracingConfig(
        "http://otel:4318", 0.1
    )


def test_off_the_gateway_and_the_agent_load_no_opentelemetry_sdk() -> None:
    """The control plane and the agent built with tracing off: the SDK is never imported
    (the gateway's `if tracing.enabled` is all that runs per request)."""
    code = (
        "import sys\n"
        "import llmgw.server.app, llmgw.agent.service, llmgw.server.gateway.spans\n"
        "from llmgw.config import TracingConfig\n"
        "from llmgw.tracing import start\n"
        "start(TracingConfig(), 'llmgw-server')\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_sampler_keeps_its_share_of_new_traces_and_follows_a_parent(
    otlp: Receiver, made: list[Tracing]
) -> None:
    """Parent-based: at sample 0 no new trace is kept, but a child of a sampled parent
    (the control plane's start, at the agent) is, and one of an unsampled parent is not."""
    tracing = start(TracingConfig(otlp.endpoint, 0.0), "llmgw-agent", "n1")
    made.append(tracing)
    with tracing.span("new") as new:
        assert not sampled(new.traceparent)
    with tracing.span("kept", parent=SAMPLED) as kept:
        assert kept.trace_id == SAMPLED.split("-")[1]
    with tracing.span("dropped", parent=NOT_SAMPLED):
        pass
    tracing.shutdown()
    assert [(s.name, s.trace_id, s.parent_id) for s in otlp.spans] == [
        ("kept", SAMPLED.split("-")[1], SAMPLED.split("-")[2])
    ]
    assert otlp.spans[0].service == "llmgw-agent" and otlp.spans[0].instance == "n1"

    every = start(TracingConfig(otlp.endpoint, 1.0), "llmgw-server")
    made.append(every)
    with every.span("root", parent="") as root:
        assert sampled(root.traceparent)
        with every.span("child") as child:
            assert child.trace_id == root.trace_id
    every.shutdown()
    got = {s.name: s for s in otlp.spans}
    assert got["child"].parent_id == got["root"].span_id and got["root"].parent_id == ""


def test_an_error_out_of_a_span_is_recorded_on_it(otlp: Receiver, made: list[Tracing]) -> None:
    tracing = start(TracingConfig(otlp.endpoint), "llmgw-agent")
    made.append(tracing)
    with pytest.raises(RuntimeError), tracing.span("fetch"):
        raise RuntimeError("the hub said 404")
    tracing.shutdown()
    (span,) = otlp.named("fetch")
    assert span.status == 2 and span.events == ("exception",)
    assert span.attributes["error.type"] == "RuntimeError"


def test_the_traceparent_travels_in_start_shard() -> None:
    spec = ShardSpec(
        replica_id="m.default.00000001",
        source="/m.gguf",
        engine="llama.cpp",
        port=41000,
        fingerprint="f",
        key="k",
    )
    sent = StartShard(spec=spec, traceparent=SAMPLED)
    assert from_map(StartShard, to_map(sent)) == sent
    # Tracing off: the field is absent on the wire, and an older control plane's
    # message (without it) reads as no trace.
    assert "traceparent" not in to_map(StartShard(spec=spec))
    assert from_map(StartShard, to_map(StartShard(spec=spec))).traceparent is None


def test_log_lines_inside_a_sampled_span_carry_its_trace_id(
    otlp: Receiver, made: list[Tracing]
) -> None:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                lines.append(self.format(record))
            except TypeError:  # where a real handler calls handleError
                lines.append("unformattable")

    logger = logging.getLogger("llmgw.test_tracing")
    logger.propagate = False
    handler, other = Keep(), Keep()
    logger.addHandler(handler)
    logger.addHandler(other)
    try:
        install_log_filter(logger)
        install_log_filter(logger)  # twice: one filter a handler still
        assert len(handler.filters) == 1
        tracing = start(TracingConfig(otlp.endpoint), "llmgw-server")
        made.append(tracing)
        logger.warning("before %s", "any span")
        with tracing.span("reconcile") as span:
            logger.warning("starting %s", "m.default.1")
            logger.warning("a call whose arguments do not fit %d", "x")  # not raised here
        unsampled = start(TracingConfig(otlp.endpoint, 0.0), "llmgw-server")
        made.append(unsampled)
        with unsampled.span("quiet"):
            logger.warning("not kept")
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(other)
    assert lines == [
        "before any span",
        "before any span",
        f"starting m.default.1 trace_id={span.trace_id}",
        f"starting m.default.1 trace_id={span.trace_id}",
        "unformattable",
        "unformattable",
        "not kept",
        "not kept",
    ]
