"""The control planes' routes: who leads (``/leader``, for load balancers and
keepalived), every control plane, tokens for new ones, their joining, and removal."""

from __future__ import annotations

from starlette.responses import JSONResponse

from llmgw.server.admission import JoinTokens
from llmgw.server.api.cluster import minted
from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.ha.leadership import Leadership
from llmgw.server.ha.membership import Membership
from llmgw.server.requests import JoinServer, MintToken
from llmgw.wire.admin import ServerRemovedJson, TokenJson

# A join is a token id, a name, a CSR, three addresses and their SANs.
JOIN_BODY = 32 * 1024


def routes(
    ha: Leadership,
    tokens: JoinTokens,
    members: Membership,
) -> Ops:
    async def leader(call: Call[None, None]) -> object:
        state = ha.state()
        return JSONResponse(state, status_code=200 if state["role"] == "leader" else 503)

    async def servers(call: Call[None, None]) -> object:
        return members.listing()

    async def token(call: Call[MintToken, None]) -> TokenJson:
        return minted(await tokens.mint(call.body.ttl_seconds, call.principal, server=True))

    async def join(call: Call[JoinServer, None]) -> object:
        return await members.join(call.body)

    async def remove(call: Call[None, None]) -> ServerRemovedJson:
        name = call.params["name"]
        return {"name": name, "removed": await members.remove(name, call.principal)}

    server_list = {"type": "array", "items": {"type": "object", "required": ["name", "role"]}}
    return [
        Op(
            "GET",
            "/leader",
            leader,
            "Whether this control plane leads: 200 on the leader, 503 on a standby",
            access="public",
            answer={"type": "object", "required": ["name", "role", "term", "leader"]},
            errors=(503,),
            reads=True,
        ),
        Op("GET", "/api/v1/servers", servers, "Every control plane", answer=server_list),
        Op(
            "POST",
            "/api/v1/servers/tokens",
            token,
            "Mint a token for a new control plane (`server join`)",
            body=MintToken,
            body_optional=True,
            status=201,
            answer={"type": "object", "required": ["token", "id", "expires_at"]},
            access="admin",
        ),
        Op(
            "POST",
            "/api/v1/servers/join",
            join,
            "A new control plane's joining (used by `server join`)",
            access="public",
            body=JoinServer,
            max_body=JOIN_BODY,
            errors=(403, 409),
            answer={"type": "object", "required": ["name", "cert", "ca", "sealed", "mac"]},
        ),
        Op(
            "DELETE",
            "/api/v1/servers/{name}",
            remove,
            "Remove a control plane: its certificate is refused from now on",
            errors=(404, 409),
            access="admin",
        ),
    ]
