"""``/api/v1/auth/ldap``: LDAP / Active Directory sign-in's settings and their test
(``ctl auth ldap``), over ``LdapService``, which checks the caller. The cluster's admins
only; the service account's password is taken, never answered."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.ldap.service import LdapService, LdapTest
from llmgw.server.ldap.settings import LdapSet
from llmgw.wire.admin.ldap import LdapSettingsJson, LdapTestJson

SETTINGS = {"type": "object", "required": ["enabled", "url", "bind_dn", "bind_password", "maps"]}
TEST = {"type": "object", "required": ["ok", "failed", "message", "steps"]}


def routes(ldap: LdapService) -> Ops:
    async def show(call: Call[None, None]) -> LdapSettingsJson:
        return await ldap.shown(call.principal)

    async def put(call: Call[LdapSet, None]) -> LdapSettingsJson:
        return await ldap.set(call.body, call.principal)

    async def off(call: Call[None, None]) -> LdapSettingsJson:
        return await ldap.off(call.principal)

    async def test(call: Call[LdapTest, None]) -> LdapTestJson:
        return await ldap.test(call.body, call.principal)

    return [
        Op(
            "GET",
            "/api/v1/auth/ldap",
            show,
            'LDAP sign-in\'s settings (the bind password only as "set")',
            access="admin",
            answer=SETTINGS,
        ),
        Op(
            "POST",
            "/api/v1/auth/ldap",
            put,
            "Set LDAP / Active Directory sign-in (checked, audited, the password sealed)",
            access="admin",
            body=LdapSet,
            answer=SETTINGS,
        ),
        Op(
            "DELETE",
            "/api/v1/auth/ldap",
            off,
            "Turn LDAP sign-in off: its settings and sealed password go",
            access="admin",
            answer=SETTINGS,
        ),
        Op(
            "POST",
            "/api/v1/auth/ldap/test",
            test,
            "Try LDAP sign-in for a login from this control plane, step by step",
            access="admin",
            body=LdapTest,
            answer=TEST,
            errors=(404,),
            # Changes nothing: a standby tries from where it stands too.
            reads=True,
        ),
    ]
