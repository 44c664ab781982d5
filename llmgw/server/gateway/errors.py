"""The gateway's answers when it says no: OpenAI's error shape, before and during a stream."""

from __future__ import annotations

import json

from aiohttp import web

JSON = "application/json"


def fail(
    status: int, message: str, kind: str, code: str | None = None, param: str | None = None
) -> web.Response:
    """``{"error": {"message", "type", "param", "code"}}``, as OpenAI's clients read it."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.Response(status=status, body=json.dumps(body).encode(), content_type=JSON)


def bad_request(message: str, code: str, param: str | None = None) -> web.Response:
    return fail(400, message, "invalid_request_error", code, param)


async def stream_error(response: web.StreamResponse, message: str, code: str) -> None:
    """An error once a stream has begun: an event in OpenAI's error shape, then the end."""
    error = {"error": {"message": message, "type": "api_error", "param": None, "code": code}}
    await response.write(b"data: " + json.dumps(error).encode() + b"\n\n")
    await response.write_eof()
