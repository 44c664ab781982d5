"""The cluster's own routes: health, version, status, metrics, join tokens, enrollment.

Health, version, enrollment and the OpenAPI document are public; everything else
wants the admin token (the gate in ``routing.py`` decides, from each route's access).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from starlette.responses import Response, StreamingResponse

from llmgw import __version__, jointoken
from llmgw.server.admission import JoinTokens
from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.requests import Enroll, MintToken
from llmgw.server.scrape import Scrape, TargetJson
from llmgw.server.store import Writability
from llmgw.wire.admin import TokenJson, VersionJson

# An enrollment is a token id, a node id, a CSR and a MAC: a few KiB at most.
ENROLL_BODY = 16 * 1024


def routes(
    writable: Callable[[], Writability],
    status: Callable[[], object],
    scrape: Scrape,
    tokens: JoinTokens,
    openapi: Callable[[], object],
) -> Ops:
    async def version(call: Call[None, None]) -> VersionJson:
        return {"version": __version__}

    async def healthz(call: Call[None, None]) -> object:
        """200 while this process answers; ``ok`` false, with each problem in words,
        when part of it does not work (serving goes on from memory)."""
        now = writable()
        problems = [] if now.ok else [f"store: {now.problem}"]
        return {"ok": not problems, "problems": problems, "store_writable": now.ok}

    async def show_status(call: Call[None, None]) -> object:
        return status()

    async def metrics(call: Call[None, None]) -> object:
        # Prometheus asks for gzip: a large fleet's hundreds of megabytes of text go out
        # as a tenth of that, compressed in a worker thread (zlib lets go of the GIL).
        gzip = takes_gzip(call.request.headers.get("accept-encoding", ""))
        pieces = await scrape.body(gzip)
        media = "text/plain; version=0.0.4; charset=utf-8"
        headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if gzip else {}
        if len(pieces) == 1:
            return Response(pieces[0], media_type=media, headers=headers)
        # Every piece is made before the first goes: its length is known, so the answer
        # is not chunked (fewer writes, and a client reads it as one body).
        headers["Content-Length"] = str(sum(len(p) for p in pieces))
        return StreamingResponse(_each(pieces), media_type=media, headers=headers)

    async def targets(call: Call[None, None]) -> list[TargetJson]:
        return scrape.targets()

    async def mint(call: Call[MintToken, None]) -> TokenJson:
        return minted(await tokens.mint(call.body.ttl_seconds, call.principal))

    async def enroll(call: Call[Enroll, None]) -> object:
        return await tokens.enroll(call.body)

    async def document(call: Call[None, None]) -> object:
        return openapi()

    token_answer = {"type": "object", "required": ["token", "id", "expires_at", "addresses"]}
    return [
        Op(
            "GET",
            "/healthz",
            healthz,
            "Whether this control plane works, and what does not",
            access="public",
            answer={"type": "object", "required": ["ok"]},
        ),
        Op(
            "GET",
            "/api/v1/version",
            version,
            "This control plane's version",
            access="public",
            answer={"type": "object", "required": ["version"]},
        ),
        Op("GET", "/api/v1/openapi.json", document, "This document", access="public"),
        Op(
            "GET",
            "/api/v1/status",
            show_status,
            "The control plane, its nodes and its store",
            answer={"type": "object", "required": ["version", "serving", "store_writable"]},
        ),
        Op(
            "GET",
            "/metrics",
            metrics,
            "Prometheus text: the gateway's and the engines', the fleet's with fleet detail",
            media="text/plain",
            access="metrics",
        ),
        Op(
            "GET",
            "/api/v1/prometheus/targets",
            targets,
            "The agents serving their own metrics, for Prometheus's http_sd_configs",
            access="metrics",
            answer={"type": "array", "items": {"type": "object"}},
        ),
        Op(
            "POST",
            "/api/v1/tokens",
            mint,
            "Mint a join token for a node",
            body=MintToken,
            body_optional=True,
            status=201,
            answer=token_answer,
            access="admin",
        ),
        Op(
            "POST",
            "/api/v1/enroll",
            enroll,
            "An agent's enrollment (used by `agent run`)",
            access="public",
            body=Enroll,
            max_body=ENROLL_BODY,
            errors=(403,),
            answer={"type": "object", "required": ["node_id", "cert", "ca", "mac"]},
        ),
    ]


def minted(token: jointoken.JoinToken) -> TokenJson:
    """A new token as its route answers it (a node's or a control plane's)."""
    return {
        "token": token.encode(),
        "id": token.id,
        "expires_at": token.expires_at,
        "addresses": token.addresses,
    }


def takes_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header takes gzip (``gzip;q=0`` refuses it)."""
    for item in accept_encoding.lower().split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip() not in ("gzip", "x-gzip"):
            continue
        q = params.strip()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False


async def _each(pieces: list[bytes]) -> AsyncIterator[bytes]:
    """A large exposition sent a piece at a time, the event loop free in between."""
    for piece in pieces:
        yield piece
