"""The cluster's three ways in side by side, for the Sign-in screens (the pages'
``/admin/signin``): OpenID Connect (or Entra ID), LDAP / Active Directory and SCIM
provisioning, each as its own service shows it (never a secret: a client secret, bind
password or SCIM token is only "set"), with when each last changed and by whom (the
newest audit entry of its setting), and the changes an admin makes there: turn one off,
try LDAP for a login, make SCIM's token, set SCIM's group maps.

Every call is a cluster admin's; the services each call check it again.
"""

from __future__ import annotations

from typing import Literal, TypedDict, get_args

from llmgw.server.ldap.service import LdapService, LdapTest
from llmgw.server.ldap.settings import SETTING as LDAP_SETTING
from llmgw.server.people.oidcsettings import SETTING as OIDC_SETTING
from llmgw.server.people.oidcsettings import OidcSettings
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.scim import views as scim_views
from llmgw.server.scim.service import ScimService
from llmgw.server.scim.settings import SETTING as SCIM_SETTING
from llmgw.server.store import Store
from llmgw.wire.admin import OidcJson
from llmgw.wire.admin.ldap import LdapSettingsJson, LdapTestJson
from llmgw.wire.admin.scim import ScimJson

Way = Literal["oidc", "ldap", "scim"]
WAYS: tuple[Way, ...] = get_args(Way)
SETTINGS: dict[Way, str] = {"oidc": OIDC_SETTING, "ldap": LDAP_SETTING, "scim": SCIM_SETTING}
# How far back the audit is read for a setting's last change (as the engines' history).
AUDIT_WINDOW = 5000


class ChangeJson(TypedDict):
    """A setting's newest audit entry: when, by whom, what (``auth.oidc.set`` ...)."""

    at: float
    actor: str
    action: str


class ChangesJson(TypedDict):
    # None: no change of it in the audit's last entries.
    oidc: ChangeJson | None
    ldap: ChangeJson | None
    scim: ChangeJson | None


class SignInsJson(TypedDict):
    oidc: OidcJson
    ldap: LdapSettingsJson
    scim: ScimJson
    changed: ChangesJson


def is_way(text: str) -> bool:
    return text in WAYS


def _refuse_admin(by: Principal) -> None:
    if not by.may("admin"):
        raise Refusal(403, "forbidden", "sign-in settings need the cluster's admin role")


class SignIns:
    def __init__(
        self, oidc: OidcSettings, ldap: LdapService, scim: ScimService, store: Store
    ) -> None:
        self.oidc = oidc
        self.ldap = ldap
        self.scim = scim
        self.store = store

    async def shown(self, by: Principal) -> SignInsJson:
        """The three without their secrets, and when each last changed."""
        _refuse_admin(by)
        return {
            "oidc": self.oidc.show(by),
            "ldap": await self.ldap.shown(by),
            "scim": scim_views.settings_json(self.scim),
            "changed": await self.changes(),
        }

    async def changes(self) -> ChangesJson:
        rows = await self.store.audit_log(limit=AUDIT_WINDOW)
        found: dict[str, ChangeJson] = {}
        targets = set(SETTINGS.values())
        for row in rows:  # newest first
            target = str(row.get("target"))
            if target in targets and target not in found:
                found[target] = {
                    "at": float(row["at"]),
                    "actor": str(row["actor"]),
                    "action": str(row["action"]),
                }
        return {
            "oidc": found.get(OIDC_SETTING),
            "ldap": found.get(LDAP_SETTING),
            "scim": found.get(SCIM_SETTING),
        }

    async def off(self, way: Way, by: Principal) -> None:
        """No more sign-in that way (SCIM: its token ends, its maps are kept)."""
        _refuse_admin(by)
        if way == "oidc":
            await self.oidc.off(by)
        elif way == "ldap":
            await self.ldap.off(by)
        else:
            await self.scim.auth.off(by)

    async def test_ldap(self, ask: LdapTest, by: Principal) -> LdapTestJson:
        _refuse_admin(by)
        return await self.ldap.test(ask, by)

    async def new_scim_token(self, by: Principal) -> str:
        """SCIM's new bearer token, for its one showing; the one before ends."""
        _refuse_admin(by)
        return await self.scim.auth.new_token(by)

    async def set_scim_maps(self, maps: list[str], by: Principal) -> None:
        _refuse_admin(by)
        await self.scim.set_maps(maps, by)
