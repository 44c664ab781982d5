"""The admin API (``/api/v1``), enrollment, health and metrics: the only part of the
control plane that knows Starlette.

Each resource module declares its routes as ``Op``s over the services it is handed;
``build_app`` wraps every one in the same gate (``routing.py``) and answers unknown
paths and methods in the same JSON error shape.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from llmgw.server.access import Gate
from llmgw.server.api.responses import error
from llmgw.server.api.routing import Op, Ops, endpoint

__all__ = ["AdminApp", "Gate", "Op", "Ops", "build_app"]


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        answer = error(
            405, "method_not_allowed", f"{request.url.path} does not take {request.method}"
        )
        if exc.headers:
            answer.headers.update(exc.headers)
        return answer
    if exc.status_code == 404:
        return error(404, "not_found", f"no route {request.url.path}; see /api/v1/openapi.json")
    return error(exc.status_code, "http_error", exc.detail)


# The admin API's ASGI app; named here so that nothing else imports starlette.
AdminApp = Starlette


def build_app(
    ops: Ops, gate: Gate, body_timeout: float, pages: Sequence[BaseRoute] = ()
) -> AdminApp:
    """The admin API's routes, and the admin pages' (``llmgw.server.pages.site``)."""
    routes: list[BaseRoute] = [
        Route(op.path, endpoint(op, gate, body_timeout), methods=[op.method]) for op in ops
    ]
    routes += pages
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
