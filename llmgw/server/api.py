"""The admin API (/api/v1), node enrollment, and the placeholders of what comes later.

Every /api/v1 route but enrollment and version wants the admin token as a bearer token;
errors are JSON objects ``{"error": {"type": ..., "message": ...}}`` that say what to do.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
import time
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmgw import __version__, jointoken, pki
from llmgw.server.keys import routes as key_routes
from llmgw.server.models import routes as model_routes
from llmgw.server.planner import routes as plan_routes
from llmgw.server.replicas import routes as replica_routes
from llmgw.server.responses import error, json_body, unauthorised
from llmgw.server.store import JoinTokenRecord

if TYPE_CHECKING:
    from llmgw.server.controlplane import ControlPlane

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MAX_TTL = 7 * 24 * 3600


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def build_app(cp: ControlPlane) -> Starlette:
    authorised = cp.authorised

    async def version(request: Request) -> Response:
        return JSONResponse({"version": __version__})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def nodes(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        return JSONResponse([v.as_json() for _, v in sorted(cp.registry.nodes.items())])

    async def node(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        view = cp.registry.nodes.get(request.path_params["node_id"])
        if view is None:
            return error(404, "not_found", f"no node {request.path_params['node_id']!r}")
        return JSONResponse(view.as_json())

    async def metrics(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        return Response(await cp.gateway.metrics_text(), media_type="text/plain; version=0.0.4")

    async def status(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        return JSONResponse(cp.status())

    async def tokens(request: Request) -> Response:
        if not authorised(request):
            return unauthorised()
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        ttl = body.get("ttl_seconds", 3600)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 0 < ttl <= MAX_TTL:
            return error(400, "bad_request", f"ttl_seconds must be 1 to {MAX_TTL} (7 days)")
        token = await cp.mint_join_token(ttl)
        return JSONResponse(
            {
                "token": token.encode(),
                "id": token.id,
                "expires_at": token.expires_at,
                "addresses": token.addresses,
            },
            status_code=201,
        )

    async def enroll(request: Request) -> Response:
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        fields = {k: body.get(k) for k in ("token_id", "node_id", "csr", "mac")}
        missing = [k for k, v in fields.items() if not isinstance(v, str) or not v]
        if missing:
            return error(400, "bad_request", f"missing fields: {', '.join(missing)}")
        return await enroll_node(cp, **{k: str(v) for k, v in fields.items()})

    async def admin_placeholder(request: Request) -> Response:
        return Response(
            "llmgw admin pages are not in this version yet; use `llmgw ctl`.\n",
            status_code=503,
            media_type="text/plain",
        )

    routes = [
        Route("/healthz", healthz),
        Route("/api/v1/version", version),
        Route("/api/v1/status", status),
        Route("/metrics", metrics),
        Route("/api/v1/nodes", nodes),
        Route("/api/v1/nodes/{node_id}", node),
        Route("/api/v1/tokens", tokens, methods=["POST"]),
        Route("/api/v1/enroll", enroll, methods=["POST"]),
        Route("/admin", admin_placeholder),
        Route("/admin/{rest:path}", admin_placeholder),
        *replica_routes(cp),
        *model_routes(cp, cp.models),
        *plan_routes(cp),
        *key_routes(cp),
    ]
    return Starlette(routes=routes)


async def enroll_node(
    cp: ControlPlane, token_id: str, node_id: str, csr: str, mac: str
) -> JSONResponse:
    """Check the token, sign the node's CSR, and answer with proof we hold the token."""
    if not NODE_ID.match(node_id):
        return error(
            400,
            "bad_node_id",
            f"node id {node_id!r} is not valid: use letters, digits, '.', '_' or '-', "
            "up to 63 characters, starting with a letter or digit",
        )
    record = await cp.store.get_join_token(token_id)
    if record is None:
        return error(
            403,
            "token_forged",
            "this join token was not issued by this control plane (forged, or from another "
            "cluster); make one with `llmgw node token` on the control plane",
        )
    secret = pki.unseal(cp.cluster_secret, record.secret_sealed)
    if not jointoken.check(jointoken.enroll_mac(secret, node_id, csr.encode()), mac):
        return error(
            403,
            "token_forged",
            "the join token's secret does not match the one issued (forged or altered); "
            "make a new one with `llmgw node token`",
        )
    if record.used_at is not None:
        return error(
            403,
            "token_used",
            f"this join token was already used by node {record.used_by!r} at "
            f"{_iso(record.used_at)}; each token joins one node, make a new one with "
            "`llmgw node token`",
        )
    now = time.time()
    if now >= record.expires_at:
        return error(
            403,
            "token_expired",
            f"this join token expired at {_iso(record.expires_at)}; make a new one with "
            "`llmgw node token`",
        )
    try:
        cert_pem, serial = pki.sign_csr(cp.ca, csr.encode(), node_id)
    except pki.PKIError as exc:
        return error(400, "bad_csr", str(exc))
    if not await cp.store.use_join_token(token_id, node_id, now):
        return error(403, "token_used", "this join token was used by another node just now")
    await cp.registry.enrolled(node_id, serial)
    await cp.store.audit(f"join token {token_id}", "node.enroll", node_id, f"serial {serial}")
    ca_pem = cp.ca.cert_pem
    return JSONResponse(
        {
            "node_id": node_id,
            "cert": cert_pem.decode(),
            "ca": ca_pem.decode(),
            "control_planes": cp.agent_addresses,
            "mac": jointoken.answer_mac(secret, cert_pem, ca_pem),
        }
    )


def new_token_record(cp: ControlPlane, ttl: int, secret: bytes) -> JoinTokenRecord:
    now = time.time()
    return JoinTokenRecord(
        id=secrets.token_hex(8),
        secret_sealed=pki.seal(cp.cluster_secret, secret),
        created_at=now,
        expires_at=now + ttl,
        created_by="admin",
    )
