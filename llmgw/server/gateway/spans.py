"""The span of a ``/v1`` request, in OpenTelemetry's GenAI semantic conventions.

Made only when tracing is on (``Gateway.handle`` asks first): a SERVER span named
``{gen_ai.operation.name} {gen_ai.request.model}``, continuing the client's W3C
``traceparent`` when it sent one. Its attributes, the conventions' where they have a
name and ``llmgw.*`` where they do not (docs/telemetry.md, Traces):

- ``gen_ai.operation.name`` (chat, text_completion, embeddings),
  ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``
  (absent when no answer was counted), ``gen_ai.request.stream``;
- ``http.request.method``, ``url.path``, ``http.response.status_code``, ``error.type``
  (the status, for a 4xx or 5xx);
- ``llmgw.time_to_first_token`` (seconds, when a token came), ``llmgw.replica``,
  ``llmgw.node``, ``llmgw.engine`` (the replica that answered last), ``llmgw.retries``
  (other replicas tried after one failed before the client had a byte) and
  ``llmgw.resumes`` (a stream carried on by another replica after its engine failed).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw.server.gateway.proxy import Trace
from llmgw.tracing import Span, Tracing, Value

# The conventions' operation names, by route.
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}

Answer = Callable[[web.BaseRequest, Trace], Awaitable[web.StreamResponse]]


async def traced(tracing: Tracing, request: web.BaseRequest, answer: Answer) -> web.StreamResponse:
    """``answer``'s response to ``request``, inside the request's span (which begins
    before the request's clock, so its time to first token lies within it)."""
    operation = OPERATIONS.get(request.path)
    with tracing.span(
        operation or f"{request.method} {request.path}",
        {"http.request.method": request.method, "url.path": request.path},
        parent=request.headers.get("traceparent"),
        kind="server",
    ) as span:
        trace = Trace(time.perf_counter())
        response = await answer(request, trace)
        describe(span, operation, trace, response.status)
    return response


def describe(span: Span, operation: str | None, trace: Trace, status: int) -> None:
    """What the request was and did, on its span."""
    said: dict[str, Value | None] = {
        "http.response.status_code": status,
        "error.type": str(status) if status >= 400 else None,
    }
    if operation is not None:
        said["gen_ai.operation.name"] = operation
        if trace.model:
            span.rename(f"{operation} {trace.model}")
            said["gen_ai.request.model"] = trace.model
        said["gen_ai.usage.input_tokens"] = trace.prompt
        said["gen_ai.usage.output_tokens"] = trace.completion
        if trace.first:
            said["llmgw.time_to_first_token"] = round(trace.first - trace.start, 6)
        if trace.replica:
            said["llmgw.replica"] = trace.replica
            said["llmgw.node"] = trace.node or None
            said["llmgw.engine"] = trace.engine or None
            said["llmgw.retries"] = trace.retries
            said["llmgw.resumes"] = trace.resumes
    span.set_all(said)
