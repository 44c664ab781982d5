"""The admin API's error answers: one JSON shape, ``{"error": {"type", "message"}}``."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


def error(status: int, kind: str, message: str, **details: Any) -> JSONResponse:
    """An error answer; ``details`` (a field's name, per-node verdicts) go beside the
    message for scripts, which the message already says in words."""
    return JSONResponse(
        {"error": {"type": kind, "message": message, **details}}, status_code=status
    )
