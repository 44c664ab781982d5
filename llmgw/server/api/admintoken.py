"""``POST /api/v1/admin-token/rotate``: a new admin token, the only one from now on,
answered this once; a route over ``AdminTokens`` (``server/admintokens.py``), which owns
the workflow. A standby answers 409 ``not_leader``, as it does every change."""

from __future__ import annotations

from llmgw.server.admintokens import AdminTokens
from llmgw.server.api.routing import Call, Op, Ops
from llmgw.wire.admin import RotatedTokenJson


def routes(tokens: AdminTokens) -> Ops:
    async def rotate(call: Call[None, None]) -> RotatedTokenJson:
        token, kept_in = await tokens.rotate(call.principal)
        return {"token": token, "token_file": str(kept_in) if kept_in else None}

    return [
        Op(
            "POST",
            "/api/v1/admin-token/rotate",
            rotate,
            "Rotate the admin token: the new one is answered once, the old one and the "
            "page sessions opened with it end on every control plane within 2 s",
            answer={"type": "object", "required": ["token", "token_file"]},
            access="admin",
        )
    ]
