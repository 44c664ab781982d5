"""Every admin route declared once: who may call it, what it takes, what it answers.

An ``Op`` names its method and path, its handler, its access (``public`` or ``admin``;
roles slot in here later), the typed body and query it takes (``schema.py``
dataclasses) and what it answers. ``endpoint`` wraps each one in the same steps, in
this order, so no route can skip one:

1. authorise, from the headers alone: a request without the right token is refused
   before a byte of its body is read;
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmgw.server import schema
from llmgw.server.api.responses import error
from llmgw.server.pages.session import COOKIE, Session, Sessions
from llmgw.server.refusal import Refusal
from llmgw.server.store import StoreUnavailable

log = logging.getLogger("llmgw.api")

Access = Literal["public", "admin"]
# The largest body any admin route takes; enrollment takes far less.
MAX_BODY = 1 << 20


@dataclass(frozen=True)
class Empty:
    """No fields: the route takes an empty object, or no body at all."""


@dataclass(frozen=True)
class Call:
    """One request as a handler sees it: who called, and what they sent, typed."""

    request: Request
    actor: str
    params: dict[str, str]
    body: Any = None
    query: Any = None


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    handler: Handler
    summary: str
    access: Access = "admin"
    body: type | None = None
    # The body may be left out (read as an empty object).
    body_optional: bool = False
    query: type | None = None
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


class Gate:
    """The one authorisation point: who the caller is, or None when they may not call."""

    def __init__(
        self,
        admin_token_ok: Callable[[str], bool],
        standby: Callable[[], dict[str, Any] | None] = lambda: None,
        sessions: Sessions | None = None,
    ) -> None:
        self.admin_token_ok = admin_token_ok
        # On a standby: the leader, where writes go; None while this one leads.
        self.standby = standby
        # The admin pages' signed sessions (pages/session.py); None: no pages.
        self.sessions = sessions

    def session(self, request: Request) -> Session | None:
        """The admin pages' caller: a valid session cookie, or None. Only pages read
        it; the API takes its bearer token alone, so no cookie can send an API call."""
        if self.sessions is None:
            return None
        return self.sessions.read(request.cookies.get(COOKIE))

    def actor(self, request: Request, access: Access) -> str | None:
        host = request.client.host if request.client else "?"
        if access == "public":
            return f"anonymous@{host}"
        header = request.headers.get("authorization", "")
        if header[:7].lower() == "bearer " and self.admin_token_ok(header[7:].strip()):
            return f"admin@{host}"
        return None


def unauthorised() -> JSONResponse:
    return error(
        401,
        "unauthorized",
        "missing or wrong admin token: send 'Authorization: Bearer <token>' with the "
        "token from the data dir's admin.token",
    )


def not_leader(leader: dict[str, Any]) -> JSONResponse:
    where = leader.get("api_address") or "unknown (it does not answer)"
    return error(
        409,
        "not_leader",
        f"this control plane is a standby and changes nothing; send this to the leader, "
        f"{leader.get('name') or '?'} at {where}",
        leader=where,
    )


async def read_json(request: Request, limit: int, timeout: float) -> Any:
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


def endpoint(op: Op, gate: Gate, body_timeout: float) -> Callable[[Request], Awaitable[Response]]:
    """``op`` wrapped in the steps every route takes (the module's docstring)."""

    async def run(request: Request) -> Response:
        actor = gate.actor(request, op.access)
        if actor is None:
            return unauthorised()
        if op.writes:
            leader = gate.standby()
            if leader is not None:
                return not_leader(leader)
        try:
            body: Any = None
            query: Any = None
            if op.body is not None:
                data = await read_json(request, op.max_body, body_timeout)
                if data is None:
                    if not op.body_optional:
                        raise Refusal(400, "bad_request", "the request needs a JSON body")
                    data = {}
                body = schema.read(op.body, data)
            if op.query is not None:
                query = schema.read_query(op.query, request.query_params)
            call = Call(request, actor, dict(request.path_params), body, query)
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
