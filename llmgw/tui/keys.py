"""Keys: the gateway's API keys the caller may see, without the keys themselves; create
one for a project or of one's own (shown once) and revoke one."""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.coordinate import Coordinate
from textual.widgets import DataTable

from llmgw.client.adminbase import AdminError
from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, fill
from llmgw.tui.dialogs import ConfirmDialog, Field, FormDialog, MessageDialog, Values
from llmgw.wire.admin import NewKeyJson

COLUMNS = ("ID", "NAME", "STATE", "MODELS", "RPM", "TPM", "BUDGET")

CREATE_FIELDS = (
    Field("name", "Name", required=True, placeholder="whose key it is"),
    Field("models", "Models", placeholder="name patterns, comma-separated (default: all)"),
    Field("rpm", "Requests a minute", "int"),
    Field("tpm", "Tokens a minute", "int"),
    Field("budget", "Tokens a month", "int"),
    Field("expires", "Expires", placeholder="2027-01-31 or a date and time"),
    Field("org", "Organisation", placeholder="name or id (default: the default one)"),
    Field("project", "Project", placeholder="TEAM/PROJECT, name or id (default: the default)"),
    Field("personal", "Your own key", "bool"),
)


def create_body(values: Values) -> dict[str, object]:
    body: dict[str, object] = {"name": values["name"]}
    if values["models"]:
        body["models"] = [m.strip() for m in str(values["models"]).split(",") if m.strip()]
    for name in ("rpm", "tpm", "budget", "expires", "org", "project"):
        if values[name] is not None:
            body[name] = values[name]
    if values["personal"]:
        body["personal"] = True
    return body


class KeysPane(Pane):
    TITLE = "Keys"
    ID = "keys"
    KEY = "6"
    KEYS = (("n", "Create…"), ("v", "Revoke"))
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "create", "Create…"),
        Binding("v", "revoke", "Revoke"),
    ]

    def compose(self) -> ComposeResult:
        yield DataTable(id="keys-table", cursor_type="row", zebra_stripes=True)

    def update_from(self, snapshot: Snapshot) -> None:
        rows = {
            k["id"]: (
                k["id"],
                k["name"],
                k["state"],
                ",".join(k["models"]) or "all",
                str(k["rpm"] or DASH),
                str(k["tpm"] or DASH),
                str(k["budget"] or DASH),
            )
            for k in snapshot.keys
        }
        fill(self.query_one(DataTable), COLUMNS, rows)

    def action_create(self) -> None:
        made: list[NewKeyJson] = []

        async def create(values: Values) -> NewKeyJson:
            key = await self.console.api.create_key(create_body(values))
            made.append(key)
            return key

        def after(result: object) -> None:
            if result is None or not made:
                return
            key = made[-1]
            self.console.action_refresh_now()
            self.app.push_screen(
                MessageDialog(
                    f"Key {key.get('id')} for {key.get('name')}",
                    "Use it as the OpenAI API key, with base URL http://CONTROL_PLANE/v1:",
                    copy=str(key.get("key", "")),
                    warning="Shown this once: the control plane keeps only its hash. "
                    "Copy it now (c, or select it with the mouse).",
                )
            )

        dialog = FormDialog("Create a key", CREATE_FIELDS, submit="Create", action=create)
        self.app.push_screen(dialog, after)

    def action_revoke(self) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            self.app.notify("No key to revoke: create one with n", severity="warning")
            return
        key_id = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value
        name = str(table.get_row_at(table.cursor_row)[1])

        def after(yes: bool | None) -> None:
            if yes and key_id is not None:
                self.revoke(key_id)

        question = f"Revoke key {key_id} ({name})? Requests with it are refused at once."
        self.app.push_screen(ConfirmDialog(f"Revoke {key_id}", question, "Revoke"), after)

    @work(group="key-actions")
    async def revoke(self, key_id: str) -> None:
        try:
            done = await self.console.api.revoke_key(key_id)
        except AdminError as exc:
            self.app.notify(str(exc), title="Revoke", severity="error", timeout=10)
            return
        self.app.notify(f"Key {done.get('id')} ({done.get('name')}) is {done.get('state')}")
        self.console.action_refresh_now()
