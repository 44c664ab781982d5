"""Sign-in: the cluster's three ways in (OpenID Connect or Entra ID, LDAP / Active
Directory, SCIM provisioning), each on or off, its settings without a secret (the admin
API shows a secret only as "set"), its group maps, and when it last changed; ``o`` turns
the highlighted one off, which the admin API allows a cluster admin alone (anyone else
is told its reason). Read from ``/api/v1/auth/{oidc,ldap,scim}`` while the screen is
shown; setting them stays with ``llmgw ctl auth``."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from llmgw.client.adminbase import AdminError
from llmgw.client.tables import when
from llmgw.tui.api import Snapshot, refused
from llmgw.tui.base import DASH, Pane, fill, highlighted
from llmgw.tui.dialogs import ConfirmDialog
from llmgw.wire.admin import OidcJson
from llmgw.wire.admin.ldap import LdapSettingsJson
from llmgw.wire.admin.scim import ScimJson

COLUMNS = ("SIGN-IN", "STATE", "SETTINGS", "MAPS", "CHANGED")
NAMES = {"oidc": "OIDC / Entra ID", "ldap": "LDAP / AD", "scim": "SCIM"}
ADMINS_ONLY = "Sign-in settings need the cluster's admin role."


def state(on: bool) -> str:
    return "on" if on else "off"


def rows_of(
    oidc: OidcJson, ldap: LdapSettingsJson, scim: ScimJson
) -> dict[str, tuple[str, str, str, str, str]]:
    """One row per way in, keyed ``oidc``, ``ldap``, ``scim``: never a secret."""
    if oidc["enabled"]:
        kind = "Entra ID" if oidc["kind"] == "entra" else "OIDC"
        secret = "secret set" if oidc["client_secret"] else "no secret"
        oidc_settings = f"{kind} {oidc['issuer']} · client {oidc['client_id']} · {secret}"
    else:
        oidc_settings = DASH
    if ldap["enabled"]:
        ad = " (AD)" if ldap["ad"] else ""
        password = "password set" if ldap["bind_password"] else "no password"
        ldap_settings = f"{ldap['url']}{ad} as {ldap['bind_dn']} · {password}"
    else:
        ldap_settings = DASH
    ldap_changed = when(ldap["updated_at"])
    if ldap["updated_by"]:
        ldap_changed += f" by {ldap['updated_by']}"
    token = f"token made {when(scim['token_made_at'])}" if scim["token"] else "no token"
    scim_settings = f"{scim['endpoint']} · {scim['users']} people, {scim['groups']} groups"
    return {
        "oidc": (
            NAMES["oidc"],
            state(oidc["enabled"]),
            oidc_settings,
            str(len(oidc["maps"])),
            when(oidc["updated_at"]),
        ),
        "ldap": (
            NAMES["ldap"],
            state(ldap["enabled"]),
            ldap_settings,
            str(len(ldap["maps"])),
            ldap_changed,
        ),
        "scim": (
            NAMES["scim"],
            state(scim["token"] is not None),
            f"{scim_settings} · {token}",
            str(len(scim["maps"])),
            when(scim["token_made_at"]),
        ),
    }


def maps_text(way: str, oidc: OidcJson, ldap: LdapSettingsJson, scim: ScimJson) -> Text:
    """The highlighted way's group maps, as ``ctl auth`` takes them."""
    text = Text()
    text.append(f"{NAMES[way]}: group maps\n", style="bold")
    if way == "oidc":
        lines = [f"{m['group']}={m['target']}:{m['role']}" for m in oidc["maps"]]
    elif way == "ldap":
        lines = [f"{m['group']}={m['target']}:{m['role']}" for m in ldap["maps"]]
    else:
        lines = list(scim["maps"])
    for line in lines:
        text.append(f"  {line}\n")
    if not lines:
        text.append("  none: groups give nothing\n")
    return text


class SignInPane(Pane):
    TITLE = "Sign-in"
    ID = "signin"
    KEY = "i"
    KEYS = (("o", "Turn off"),)
    BINDINGS: ClassVar[list[BindingType]] = [Binding("o", "turn_off", "Turn off")]

    # The last answer of the three; None before it, or when refused.
    shown: tuple[OidcJson, LdapSettingsJson, ScimJson] | None = None

    def compose(self) -> ComposeResult:
        yield DataTable(id="signin-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="signin-detail")

    def on_show(self) -> None:
        self.load()

    def update_from(self, snapshot: Snapshot) -> None:
        # Read only while shown: three routes every refresh would be for no one.
        if self.display:
            self.load()

    @work(exclusive=True, group="signin-load")
    async def load(self) -> None:
        detail = self.query_one("#signin-detail", Static)
        try:
            self.shown = await self.console.api.signins()
        except AdminError as exc:
            self.shown = None
            fill(self.query_one(DataTable), COLUMNS, {})
            detail.update(ADMINS_ONLY if refused(exc) else f"Cannot read sign-in: {exc}")
            return
        fill(self.query_one(DataTable), COLUMNS, rows_of(*self.shown))
        self.show_detail()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail()

    def show_detail(self) -> None:
        way = highlighted(self.query_one(DataTable))
        if self.shown is None or way is None:
            return
        self.query_one("#signin-detail", Static).update(maps_text(way, *self.shown))

    def action_turn_off(self) -> None:
        way = highlighted(self.query_one(DataTable))
        if way is None:
            self.app.notify(ADMINS_ONLY, severity="warning")
            return

        def after(yes: bool | None) -> None:
            if yes:
                self.turn_off(way)

        question = f"Turn {NAMES[way]} sign-in off? " + (
            "Its token ends at once (its maps are kept)."
            if way == "scim"
            else "No one signs in that way until `llmgw ctl auth` sets it again."
        )
        self.app.push_screen(ConfirmDialog("Turn off", question, "Turn off"), after)

    @work(group="signin-actions")
    async def turn_off(self, way: str) -> None:
        try:
            await self.console.api.signin_off(way)
        except AdminError as exc:
            self.app.notify(str(exc), title="Turn off", severity="error", timeout=10)
            return
        self.app.notify(f"{NAMES[way]} sign-in is off")
        self.load()
