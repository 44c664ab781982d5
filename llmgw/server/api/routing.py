"""Every admin route declared once: who may call it, what it takes, what it answers.

An ``Op`` names its method and path, its handler, the least its caller needs
(``access.Access``: ``public``, ``member``, or a cluster role; when not named, ``viewer``
to read and ``operator`` to change), the typed body and query it takes (``schema.py``
dataclasses) and what it answers. ``endpoint`` wraps each one in the same steps, in
this order, so no route can skip one:

1. authorise at the one gate (``server/access.py``), from the headers alone: a request
   without a token is a 401, one whose role falls short a 403, both before a byte of its
   body is read; the handler is handed the caller as a ``Principal``;
2. refuse a body past the route's limit, from its Content-Length or as it arrives, and
   one that does not arrive within the body timeout;
3. read the body and query into their types, or 400 naming the field;
4. run the handler; a ``Refusal`` it raises, a store that cannot be written, or any
   other failure becomes the same JSON error shape, ``{"error": {"type", "message"}}``.

The same declarations write ``/api/v1/openapi.json`` (``openapi.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmgw.server import schema
from llmgw.server.access import Access, Denied, Gate
from llmgw.server.api.responses import error
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.store import StoreUnavailable

log = logging.getLogger("llmgw.api")

# The largest body any admin route takes; enrollment takes far less.
MAX_BODY = 1 << 20


@dataclass(frozen=True)
class Empty:
    """No fields: the route takes an empty object, or no body at all."""


B = TypeVar("B")
Q = TypeVar("Q")


@dataclass(frozen=True)
class Call(Generic[B, Q]):
    """One request as a handler sees it: who called, and what they sent, typed: ``body``
    is the route's body type (``None`` where it takes none), ``query`` its query's."""

    request: Request
    principal: Principal
    params: dict[str, str]
    body: B
    query: Q

    @property
    def actor(self) -> str:
        return self.principal.name


@dataclass(frozen=True)
class Op(Generic[B, Q]):
    """A route: its handler takes a ``Call`` of the body and query types named here, so
    mypy checks each handler against the request it declares."""

    method: str
    path: str
    handler: Callable[[Call[B, Q]], Awaitable[object]]
    summary: str
    # The least the caller needs; None: viewer to read, operator to change.
    access: Access | None = None
    body: type[B] | None = None
    # The body may be left out (read as an empty object).
    body_optional: bool = False
    query: type[Q] | None = None
    max_body: int = MAX_BODY
    status: int = 200
    # JSON Schema of the success answer, for the docs; a handler returning a Response
    # (a stream, Prometheus text) says its media type instead.
    answer: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    media: str = "application/json"
    # Statuses this route may answer besides those every route may (see openapi.py).
    errors: tuple[int, ...] = ()
    # Changes nothing though not a GET (a plan): a standby answers it too.
    reads: bool = False

    @property
    def writes(self) -> bool:
        return self.method != "GET" and not self.reads

    @property
    def needs(self) -> Access:
        """The least a caller needs, as the gate checks it."""
        if self.access is not None:
            return self.access
        return "viewer" if self.method == "GET" or self.reads else "operator"

    def typed(self, body: object, query: Mapping[str, str]) -> tuple[B, Q]:
        """The body (decoded JSON) and query read into this route's types."""
        typed_body = schema.read(self.body, body) if self.body is not None else None
        typed_query = schema.read_query(self.query, query) if self.query is not None else None
        # A route without a body or query declares its handler's B or Q as None.
        return typed_body, typed_query  # type: ignore[return-value]


# The routes of every resource, whatever their types (a list holds them all).
Ops = list[Op[Any, Any]]


def denied(exc: Denied) -> JSONResponse:
    return error(exc.status, "unauthorized" if exc.status == 401 else "forbidden", exc.message)


def not_leader(leader: Mapping[str, object]) -> JSONResponse:
    where = str(leader.get("api_address") or "unknown (it does not answer)")
    return error(
        409,
        "not_leader",
        f"this control plane is a standby and changes nothing; send this to the leader, "
        f"{leader.get('name') or '?'} at {where}",
        leader=where,
    )


async def read_json(request: Request, limit: int, timeout: float) -> object:
    """The body as JSON (None when empty), refused past ``limit`` bytes before it is
    read when it says its length, else as soon as it passes it."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise Refusal(400, "bad_request", "Content-Length is not a number")
        if int(length) > limit:
            raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise Refusal(
            408, "body_timeout", f"the request body did not arrive within {timeout:g} s"
        ) from None
    raw = b"".join(chunks)
    if not raw.strip():
        return None
    try:
        return schema.decode_json(raw)
    except RecursionError:
        raise Refusal(400, "bad_request", "the request body is nested too deeply") from None
    except ValueError as exc:
        raise Refusal(400, "bad_request", f"the request body is not JSON: {exc}") from None


def too_large(limit: int) -> Refusal:
    size = f"{limit // 1024} KiB" if limit < 1 << 20 else f"{limit >> 20} MiB"
    return Refusal(413, "body_too_large", f"the request body is over {size}; this route takes less")


def endpoint(
    op: Op[Any, Any], gate: Gate, body_timeout: float
) -> Callable[[Request], Awaitable[Response]]:
    """``op`` wrapped in the steps every route takes (the module's docstring)."""

    async def run(request: Request) -> Response:
        try:
            principal = gate.principal(request, op.needs)
        except Denied as exc:
            return denied(exc)
        if op.writes:
            leader = gate.standby()
            if leader is not None:
                return not_leader(leader)
        try:
            data: object = None
            if op.body is not None:
                data = await read_json(request, op.max_body, body_timeout)
                if data is None:
                    if not op.body_optional:
                        raise Refusal(400, "bad_request", "the request needs a JSON body")
                    data = {}
            body, query = op.typed(data, request.query_params)
            call = Call(request, principal, dict(request.path_params), body, query)
            result = await op.handler(call)
        except Refusal as exc:
            return JSONResponse(exc.as_json(), status_code=exc.status)
        except schema.Invalid as exc:
            details = {"field": exc.field} if exc.field else {}
            return error(400, "bad_request", str(exc), **details)
        except StoreUnavailable as exc:
            return error(503, "store_unavailable", str(exc))
        except Exception:
            log.exception("%s %s failed", op.method, op.path)
            return error(
                500,
                "internal_error",
                "the control plane failed to answer this request; its log says why",
            )
        if isinstance(result, Response):
            return result
        return JSONResponse(result, status_code=op.status)

    run.__name__ = op.handler.__name__
    return run
