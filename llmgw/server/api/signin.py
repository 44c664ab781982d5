"""``/api/v1/auth/oidc``: the cluster's OpenID Connect (or Entra ID) sign-in settings
(``ctl auth oidc|entra``), a cluster admin's alone; the client secret is never shown."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.people.oidcsettings import OidcSet, OidcSettings
from llmgw.wire.admin import OidcJson

DOC = {
    "type": "object",
    "required": ["enabled", "kind", "issuer", "client_id", "client_secret", "maps"],
}


def routes(settings: OidcSettings) -> Ops:
    async def show(call: Call[None, None]) -> OidcJson:
        return settings.show(call.principal)

    async def put(call: Call[OidcSet, None]) -> OidcJson:
        return await settings.set(call.body, call.principal)

    async def off(call: Call[None, None]) -> OidcJson:
        return await settings.off(call.principal)

    return [
        Op(
            "GET",
            "/api/v1/auth/oidc",
            show,
            "OIDC sign-in: the provider, client and group maps (the secret only as 'set')",
            answer=DOC,
            access="admin",
        ),
        Op(
            "POST",
            "/api/v1/auth/oidc",
            put,
            "Sign in with an OIDC provider or Entra ID: its issuer (or tenant), client and "
            "secret (sealed), groups claim and group maps (audited)",
            body=OidcSet,
            answer=DOC,
            access="admin",
        ),
        Op(
            "DELETE",
            "/api/v1/auth/oidc",
            off,
            "Turn OIDC sign-in off (people signed in keep their accounts)",
            answer=DOC,
            access="admin",
        ),
    ]
