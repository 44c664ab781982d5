"""Traces across the fleet: OpenTelemetry spans sent over OTLP, or nothing at all.

Both roles use it: the control plane (each reconcile pass a trace, each replica start a
span, each ``/v1`` request a span) and the agent (a replica start continued from the
control plane's span, through install, fetch, engine start and ready). The control
plane's span reaches the agent as a W3C ``traceparent`` in ``StartShard``.

Off (``tracing.endpoint`` unset, the default), ``OFF`` stands in: its methods do
nothing and hand back one shared no-op span, and no OpenTelemetry module is imported,
so the gateway's hot path costs what it did before (it asks ``enabled`` first and makes
no span at all). On, ``start`` imports the SDK and sends spans from its batch
processor's own thread: a bounded queue (spans past it are dropped, never waited for)
and a short export timeout, so a collector that is down or slow never holds a request.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from llmgw.config import ConfigError, TracingConfig

if TYPE_CHECKING:  # imported by ``start`` only: tracing off never loads the SDK
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span as OtelSpan
    from opentelemetry.trace import Tracer

log = logging.getLogger("llmgw.tracing")

Kind = Literal["internal", "server", "client"]
Value = str | int | float | bool
Attributes = Mapping[str, Value]

# Spans waiting for export: past this they are dropped (counted by the SDK), so a
# collector that is away costs a bounded amount of memory.
QUEUE_SIZE = 4096
BATCH_SIZE = 512
# How often a batch goes, and how long one export may take before it is given up.
EXPORT_EVERY = 1.0
EXPORT_TIMEOUT = 3.0


class Span:
    """A span as llmgw uses it; this base is the no-op one tracing off hands out."""

    __slots__ = ()

    def set(self, key: str, value: Value | None) -> None:
        """An attribute; None (a figure not read) leaves it absent."""

    def set_all(self, attributes: Mapping[str, Value | None]) -> None:
        """Several attributes at once; those None are left absent."""

    def rename(self, name: str) -> None:
        """A better name, known once the work is done (a request's model)."""

    def error(self, exc: BaseException) -> None:
        """The span ended in ``exc``: recorded as an exception event, status ERROR."""

    def end(self) -> None:
        """Ends a span from ``start_span`` (one from ``span`` ends with its block)."""

    @property
    def traceparent(self) -> str | None:
        """This span's W3C traceparent, to continue it in another process."""
        return None

    @property
    def trace_id(self) -> str | None:
        """Its trace id, 32 hex digits, as the logs and a tracing backend show it."""
        return None


NO_SPAN = Span()


class Tracing:
    """Tracing off: nothing is made, nothing is sent."""

    enabled = False

    def span(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: str | None = None,
        kind: Kind = "internal",
    ) -> AbstractContextManager[Span]:
        """A span current for the block (the logs inside carry its trace id), a child of
        the current span, or of ``parent`` (a traceparent) when given; ``parent=""``
        begins a trace of its own. An exception out of the block is recorded on it."""
        return nullcontext(NO_SPAN)

    def start_span(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: str | None = None,
        kind: Kind = "internal",
    ) -> Span:
        """A span that is not made current: for work that ends elsewhere (``end`` it)."""
        return NO_SPAN

    def shutdown(self) -> None:
        """Send what is queued (within the export timeout) and stop."""


OFF = Tracing()


class _LiveSpan(Span):
    __slots__ = ("otel",)

    def __init__(self, otel: OtelSpan) -> None:
        self.otel = otel

    def set(self, key: str, value: Value | None) -> None:
        if value is not None:
            self.otel.set_attribute(key, value)

    def set_all(self, attributes: Mapping[str, Value | None]) -> None:
        self.otel.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def rename(self, name: str) -> None:
        self.otel.update_name(name)

    def error(self, exc: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.otel.record_exception(exc)
        self.otel.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self.otel.set_attribute("error.type", type(exc).__name__)

    def end(self) -> None:
        self.otel.end()

    @property
    def traceparent(self) -> str | None:
        ctx = self.otel.get_span_context()
        if not ctx.is_valid:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    @property
    def trace_id(self) -> str | None:
        ctx = self.otel.get_span_context()
        return f"{ctx.trace_id:032x}" if ctx.is_valid else None


class _LiveTracing(Tracing):
    enabled = True

    def __init__(self, provider: TracerProvider, tracer: Tracer) -> None:
        # What each span needs, looked up once: the gateway makes one a request.
        from opentelemetry import context
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = tracer
        self._kinds = {
            "internal": SpanKind.INTERNAL,
            "server": SpanKind.SERVER,
            "client": SpanKind.CLIENT,
        }
        self._propagator = TraceContextTextMapPropagator()
        self._context = context
        self._in_context = set_span_in_context

    def _parent(self, parent: str | None) -> Context | None:
        if parent is None:
            return None
        if not parent:
            return self._context.Context()  # a new trace, whatever span is current
        # A malformed traceparent gives an empty context: the span starts a trace.
        return self._propagator.extract({"traceparent": parent})

    def start_span(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: str | None = None,
        kind: Kind = "internal",
    ) -> Span:
        otel = self.tracer.start_span(
            name,
            context=self._parent(parent),
            kind=self._kinds[kind],
            attributes=dict(attributes) if attributes else None,
        )
        return _LiveSpan(otel)

    def span(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: str | None = None,
        kind: Kind = "internal",
    ) -> AbstractContextManager[Span]:
        return self._current(self.start_span(name, attributes, parent=parent, kind=kind))

    @contextmanager
    def _current(self, span: Span) -> Iterator[Span]:
        assert isinstance(span, _LiveSpan)
        # Attached by hand, not with use_span: errors are recorded here, in llmgw's words.
        token = self._context.attach(self._in_context(span.otel))
        try:
            yield span
        except BaseException as exc:
            span.error(exc)
            raise
        finally:
            span.end()
            self._context.detach(token)

    def shutdown(self) -> None:
        # The SDK's shutdown waits for an export in flight and then sends the rest, each
        # up to its timeout (and retried): a collector that is down would hold a
        # stopping control plane or agent for many seconds. Past the one timeout what
        # is left is dropped, with the daemon thread that was sending it.
        sender = threading.Thread(target=self.provider.shutdown, daemon=True)
        sender.start()
        sender.join(EXPORT_TIMEOUT)


def exporter_for(endpoint: str) -> tuple[str, str]:
    """The OTLP protocol (``http`` or ``grpc``) and the URL an exporter is given for
    ``tracing.endpoint``; OTLP over HTTP posts to /v1/traces unless a path is named."""
    parts = urlsplit(endpoint)
    if parts.scheme in ("http", "https"):
        path = parts.path if parts.path.strip("/") else "/v1/traces"
        return "http", parts._replace(path=path).geturl()
    if parts.scheme in ("grpc", "grpcs"):
        return "grpc", parts.netloc
    raise ConfigError(f"tracing.endpoint: {endpoint!r} is not an http, https, grpc or grpcs URL")


def start(config: TracingConfig, service: str, instance: str | None = None) -> Tracing:
    """Tracing as ``config`` says: OFF when no endpoint is set; else spans of ``service``
    (``llmgw-server``, ``llmgw-agent``; ``instance``, the node's id, else the host name)
    sent to the endpoint, and the trace id added to the logs."""
    if config.endpoint is None:
        return OFF
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from llmgw import __version__

    protocol, url = exporter_for(config.endpoint)
    exporter: SpanExporter
    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter(endpoint=url, timeout=EXPORT_TIMEOUT)
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        insecure = config.endpoint.startswith("grpc://")
        exporter = GrpcExporter(endpoint=url, insecure=insecure, timeout=EXPORT_TIMEOUT)
    resource = {
        "service.name": service,
        "service.version": __version__,
        "service.instance.id": instance or socket.gethostname(),
    }
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(config.sample)),
        resource=Resource.create(resource),
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=QUEUE_SIZE,
            schedule_delay_millis=EXPORT_EVERY * 1000,
            max_export_batch_size=BATCH_SIZE,
            export_timeout_millis=EXPORT_TIMEOUT * 1000,
        )
    )
    install_log_filter()
    log.info(
        "tracing: %s of new traces sent to %s (OTLP over %s)",
        f"{config.sample:.0%}",
        config.endpoint,
        protocol.upper() if protocol == "http" else "gRPC",
    )
    return _LiveTracing(provider, provider.get_tracer("llmgw", __version__))


class TraceIdFilter(logging.Filter):
    """Adds `` trace_id=...`` to a record logged while a sampled span is current, so a
    line in the logs leads to its trace (and a trace's id to its lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trace_id", None) is not None:
            return True  # already marked, by the filter of another handler
        from opentelemetry.trace import get_current_span

        ctx = get_current_span().get_span_context()
        if ctx.is_valid and ctx.trace_flags.sampled:
            trace_id = f"{ctx.trace_id:032x}"
            record.trace_id = trace_id
            try:
                message = record.getMessage()
            except Exception:  # the handler says it, as it does for any such record
                return True  # a call whose arguments do not fit: left for handleError
            record.msg, record.args = f"{message} trace_id={trace_id}", None
        return True


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """The filter on every handler of ``logger`` (the root logger) that lacks it: a
    filter on a logger sees only its own records, one on a handler every record it
    writes. Called again after a handler is added (the agent's own log tail)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, TraceIdFilter) for f in handler.filters):
            handler.addFilter(TraceIdFilter())
