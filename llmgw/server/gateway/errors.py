"""The gateway's answers when it says no: OpenAI's error shape, before and during a stream."""

from __future__ import annotations

import json

from aiohttp import web

from llmgw.server.refusal import Refusal

JSON = "application/json"
# OpenAI's error type for a status a gateway service refuses with.
_KINDS = {429: "rate_limit_error", 503: "service_unavailable"}


def fail(
    status: int, message: str, kind: str, code: str | None = None, param: str | None = None
) -> web.Response:
    """``{"error": {"message", "type", "param", "code"}}``, as OpenAI's clients read it."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.Response(status=status, body=json.dumps(body).encode(), content_type=JSON)


def refused(refusal: Refusal) -> web.Response:
    """A gateway service's ``Refusal`` in OpenAI's shape; its ``retry_after`` detail, if
    any, as the ``Retry-After`` header."""
    kind = _KINDS.get(refusal.status, "invalid_request_error")
    answer = fail(refusal.status, refusal.message, kind, refusal.code, refusal.field)
    retry = refusal.details.get("retry_after")
    if retry is not None:
        answer.headers["Retry-After"] = str(retry)
    return answer


def bad_request(message: str, code: str, param: str | None = None) -> web.Response:
    return fail(400, message, "invalid_request_error", code, param)


async def stream_error(response: web.StreamResponse, message: str, code: str) -> None:
    """An error once a stream has begun: an event in OpenAI's error shape, then the end."""
    error = {"error": {"message": message, "type": "api_error", "param": None, "code": code}}
    await response.write(b"data: " + json.dumps(error).encode() + b"\n\n")
    await response.write_eof()
