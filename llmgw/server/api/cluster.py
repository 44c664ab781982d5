"""The cluster's own routes: health, version, status, metrics, join tokens, enrollment.

Health, version, enrollment and the OpenAPI document are public; everything else
wants the admin token (the gate in ``routing.py`` decides, from each route's access).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from llmgw import __version__, jointoken, pki
from llmgw.server.admission import NODE_ID, check_token
from llmgw.server.api.routing import Call, Op
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
from llmgw.server.requests import Enroll, MintToken
from llmgw.server.store import Store

# An enrollment is a token id, a node id, a CSR and a MAC: a few KiB at most.
ENROLL_BODY = 16 * 1024


@dataclass(frozen=True)
class Enrollment:
    """What signing a node's certificate needs."""

    store: Store
    secret: bytes
    ca: pki.KeyPair
    registry: NodeRegistry
    addresses: list[str]


def routes(
    health: Callable[[], dict[str, Any]],
    status: Callable[[], dict[str, Any]],
    metrics_text: Callable[[], Awaitable[str]],
    mint: Callable[[int, str], Awaitable[jointoken.JoinToken]],
    enrollment: Enrollment,
    openapi: Callable[[], dict[str, Any]],
) -> list[Op]:
    async def version(call: Call) -> Any:
        return {"version": __version__}

    async def healthz(call: Call) -> Any:
        return health()

    async def show_status(call: Call) -> Any:
        return status()

    async def metrics(call: Call) -> Any:
        text = await metrics_text()
        media = "text/plain; version=0.0.4; charset=utf-8"
        if not takes_gzip(call.request.headers.get("accept-encoding", "")):
            return Response(text, media_type=media)
        # Prometheus asks for gzip: a large fleet's hundreds of megabytes of text go out
        # as a tenth of that, compressed in a worker thread (zlib lets go of the GIL).
        body = await asyncio.to_thread(gzipped, text)
        headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
        return Response(body, media_type=media, headers=headers)

    async def tokens(call: Call) -> Any:
        ask: MintToken = call.body
        return minted(await mint(ask.ttl_seconds, call.actor))

    async def enroll(call: Call) -> Any:
        ask: Enroll = call.body
        return await enroll_node(enrollment, ask.token_id, ask.node_id, ask.csr, ask.mac)

    async def document(call: Call) -> Any:
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
            "Prometheus text: the gateway's and the engines'",
            media="text/plain",
        ),
        Op(
            "POST",
            "/api/v1/tokens",
            tokens,
            "Mint a join token for a node",
            body=MintToken,
            body_optional=True,
            status=201,
            answer=token_answer,
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


def minted(token: jointoken.JoinToken) -> dict[str, Any]:
    """A new token as its route answers it (a node's or a control plane's)."""
    return {
        "token": token.encode(),
        "id": token.id,
        "expires_at": token.expires_at,
        "addresses": token.addresses,
    }


async def enroll_node(
    cp: Enrollment, token_id: str, node_id: str, csr: str, mac: str
) -> dict[str, Any]:
    """Check the token, sign the node's CSR, and answer with proof we hold the token."""
    if not NODE_ID.fullmatch(node_id):
        raise Refusal(
            400,
            "bad_node_id",
            f"node id {node_id!r} is not valid: use letters, digits, '.', '_' or '-', "
            "up to 63 characters, starting with a letter or digit",
        )
    secret = await check_token(
        cp.store, cp.secret, token_id, jointoken.enroll_mac, node_id, csr.encode(), mac
    )
    now = time.time()
    try:
        cert_pem, serial = pki.sign_csr(cp.ca, csr.encode(), node_id)
    except pki.PKIError as exc:
        raise Refusal(400, "bad_csr", str(exc)) from None
    if not await cp.store.use_join_token(token_id, node_id, now):
        raise Refusal(403, "token_used", "this join token was used by another node just now")
    await cp.registry.enrolled(node_id, serial)
    await cp.store.audit(f"join token {token_id}", "node.enroll", node_id, f"serial {serial}")
    ca_pem = cp.ca.cert_pem
    return {
        "node_id": node_id,
        "cert": cert_pem.decode(),
        "ca": ca_pem.decode(),
        "control_planes": cp.addresses,
        "mac": jointoken.answer_mac(secret, cert_pem, ca_pem),
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


def gzipped(text: str) -> bytes:
    """``text`` as a gzip member, at the fastest level: a scrape's text is repetitive."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    return packer.compress(text.encode()) + packer.flush()
