"""The admin API's error answers: one JSON shape,
``{"error": {"type", "message", "code", "param"}}`` (``code`` the same as ``type``,
``param`` the field to blame or null: the shape OpenAI's clients read, so one parser
reads every error of the control plane)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


def error(status: int, kind: str, message: str, **details: Any) -> JSONResponse:
    """An error answer; ``details`` (a field's name, per-node verdicts) go beside the
    message for scripts, which the message already says in words."""
    body = {"type": kind, "message": message, "code": kind, "param": details.get("field")}
    return JSONResponse({"error": {**body, **details}}, status_code=status)
