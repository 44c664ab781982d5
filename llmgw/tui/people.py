"""People and Organisations: everyone the caller may see, and the organisations they
may see with the highlighted one's teams, projects and members; the actions an admin
takes here (add a person, deactivate one, add a team, set a member) go to the admin
API, which refuses the caller what their role does not give them and says why (shown
as the form's error, or a notification)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from llmgw.client.adminbase import AdminError
from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, fill, highlighted
from llmgw.tui.dialogs import ConfirmDialog, Field, FormDialog, Values
from llmgw.wire.admin import MembershipJson, ProjectJson, TeamJson

PEOPLE_COLUMNS = ("LOGIN", "NAME", "ROLE", "SOURCE", "STATE")
ORG_COLUMNS = ("ORGANISATION", "ID")
ROLES = ("viewer", "operator", "admin")
ORG_ROLES = ("member", "manager", "admin")

PERSON_FIELDS = (
    Field("login", "Login", required=True, placeholder="what they sign in as"),
    Field("name", "Full name"),
    Field("email", "E-mail"),
    Field("role", "Cluster role", placeholder="viewer, operator, admin (none: leave empty)"),
)
TEAM_FIELDS = (Field("name", "Team", required=True),)
MEMBER_FIELDS = (
    Field("person", "Person", required=True, placeholder="login or id"),
    Field("role", "Role", default="member", placeholder="member, manager or admin"),
    Field("team", "Team", placeholder="a team's name (none: the organisation)"),
)


def person_body(values: Values) -> dict[str, object]:
    role = str(values["role"] or "").strip()
    if role and role not in ROLES:
        raise ValueError(f"Cluster role: {role!r} is not viewer, operator or admin")
    body: dict[str, object] = {"login": str(values["login"]).strip().lower()}
    for name in ("name", "email"):
        if values[name]:
            body[name] = values[name]
    if role:
        body["role"] = role
    return body


def member_body(values: Values) -> dict[str, object]:
    role = str(values["role"] or "member").strip()
    if role not in ORG_ROLES:
        raise ValueError(f"Role: {role!r} is not member, manager or admin")
    body: dict[str, object] = {"person": values["person"], "role": role}
    if values["team"]:
        body["team"] = values["team"]
    return body


def org_text(
    teams: list[TeamJson], projects: list[ProjectJson], members: list[MembershipJson]
) -> Text:
    """An organisation's teams (each with its projects) and members."""
    text = Text()
    text.append("Teams\n", style="bold")
    for t in sorted(teams, key=lambda t: t["name"]):
        names = sorted(p["name"] for p in projects if p["team_id"] == t["id"])
        text.append(f"  {t['name']}: {', '.join(names) or DASH}\n")
    if not teams:
        text.append(f"  {DASH}\n")
    text.append("Members\n", style="bold")
    for m in sorted(members, key=lambda m: (m["login"] or "", m["kind"])):
        where = "organisation" if m["kind"] == "org" else f"team {m['scope_name']}"
        hand = " (by hand)" if m["by_hand"] else ""
        text.append(f"  {m['login'] or m['person_id']}: {m['role']} of {where}{hand}\n")
    if not members:
        text.append(f"  {DASH}\n")
    return text


class PeoplePane(Pane):
    TITLE = "People"
    ID = "people"
    KEY = "9"
    KEYS = (("n", "Add person…"), ("d", "Deactivate"))
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "create", "Add person…"),
        Binding("d", "deactivate", "Deactivate"),
    ]

    def compose(self) -> ComposeResult:
        yield DataTable(id="people-table", cursor_type="row", zebra_stripes=True)

    def update_from(self, snapshot: Snapshot) -> None:
        rows = {
            p["id"]: (
                p["login"],
                p["name"] or DASH,
                p["role"] or DASH,
                p["source"],
                "active" if p["active"] else "deactivated",
            )
            for p in snapshot.people
        }
        fill(self.query_one(DataTable), PEOPLE_COLUMNS, rows)

    def action_create(self) -> None:
        async def create(values: Values) -> object:
            return await self.console.api.create_person(person_body(values))

        def after(result: object) -> None:
            if result is not None:
                self.console.action_refresh_now()

        dialog = FormDialog("Add a person", PERSON_FIELDS, submit="Add", action=create)
        self.app.push_screen(dialog, after)

    def action_deactivate(self) -> None:
        person_id = highlighted(self.query_one(DataTable))
        if person_id is None:
            self.app.notify("No person to deactivate", severity="warning")
            return

        def after(yes: bool | None) -> None:
            if yes:
                self.deactivate(person_id)

        question = (
            f"Deactivate {person_id}? Their sessions and personal tokens end at once, "
            "on every control plane."
        )
        self.app.push_screen(ConfirmDialog("Deactivate", question, "Deactivate"), after)

    @work(group="people-actions")
    async def deactivate(self, person_id: str) -> None:
        try:
            done = await self.console.api.change_person(person_id, {"active": False})
        except AdminError as exc:
            self.app.notify(str(exc), title="Deactivate", severity="error", timeout=10)
            return
        self.app.notify(f"{done['login']} is deactivated")
        self.console.action_refresh_now()


class OrgsPane(Pane):
    TITLE = "Organisations"
    ID = "orgs"
    KEY = "0"
    KEYS = (("t", "Add team…"), ("m", "Set member…"))
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("t", "team", "Add team…"),
        Binding("m", "member", "Set member…"),
    ]

    def compose(self) -> ComposeResult:
        yield DataTable(id="orgs-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="org-detail")

    def update_from(self, snapshot: Snapshot) -> None:
        rows = {o["id"]: (o["name"], o["id"]) for o in snapshot.orgs}
        fill(self.query_one(DataTable), ORG_COLUMNS, rows)
        self.show_detail()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail()

    @work(exclusive=True, group="org-detail")
    async def show_detail(self) -> None:
        org_id = highlighted(self.query_one(DataTable))
        detail = self.query_one("#org-detail", Static)
        if org_id is None:
            detail.update("No organisation you may see.")
            return
        try:
            teams, projects, members = await self.console.api.org_detail(org_id)
        except AdminError as exc:
            detail.update(f"Cannot read {org_id}: {exc}")
            return
        detail.update(org_text(teams, projects, members))

    def _org(self) -> str | None:
        org_id = highlighted(self.query_one(DataTable))
        if org_id is None:
            self.app.notify("No organisation to change", severity="warning")
        return org_id

    def action_team(self) -> None:
        org_id = self._org()
        if org_id is None:
            return

        async def create(values: Values) -> object:
            return await self.console.api.create_team(org_id, {"name": values["name"]})

        self.app.push_screen(
            FormDialog("Add a team", TEAM_FIELDS, submit="Add", action=create), self.after
        )

    def action_member(self) -> None:
        org_id = self._org()
        if org_id is None:
            return

        async def set_member(values: Values) -> object:
            return await self.console.api.set_member(org_id, member_body(values))

        self.app.push_screen(
            FormDialog("Set a member", MEMBER_FIELDS, submit="Set", action=set_member),
            self.after,
        )

    def after(self, result: object) -> None:
        """A form closed: what it changed is shown."""
        if result is not None:
            self.show_detail()
