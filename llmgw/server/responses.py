"""The admin API's error answers: one JSON shape, ``{"error": {"type", "message"}}``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse


def error(status: int, kind: str, message: str, **details: Any) -> JSONResponse:
    """An error answer; ``details`` (a field's name, per-node verdicts) go beside the
    message for scripts, which the message already says in words."""
    return JSONResponse(
        {"error": {"type": kind, "message": message, **details}}, status_code=status
    )


def unauthorised() -> JSONResponse:
    return error(
        401,
        "unauthorized",
        "missing or wrong admin token: send 'Authorization: Bearer <token>' with the "
        "token from the data dir's admin.token",
    )


async def json_body(request: Request) -> dict[str, Any] | JSONResponse:
    """The request's JSON object, or the 400 that says why there is none."""
    try:
        body = await request.json()
    except ValueError:
        return error(400, "bad_request", "the request body is not JSON")
    if not isinstance(body, dict):
        return error(400, "bad_request", "the request body must be a JSON object")
    return body
