"""Models: replicas per profile, context, longest answer."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import DataTable

from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, fill

COLUMNS = ("MODEL", "STATE", "READY", "ENGINE", "CONTEXT", "MAX OUTPUT", "PROFILES", "NOTE")


class ModelsPane(Pane):
    TITLE = "Models"
    ID = "models"
    KEY = "3"

    def compose(self) -> ComposeResult:
        yield DataTable(id="models-table", cursor_type="row", zebra_stripes=True)

    def update_from(self, snapshot: Snapshot) -> None:
        rows = {}
        for m in snapshot.models:
            profiles = ", ".join(
                f"{p['name']} {(p.get('status') or {}).get('ready', 0)}/{p['replicas']}"
                for p in m.get("profiles") or []
            )
            notes = [(p.get("status") or {}).get("note", "") for p in m.get("profiles") or []]
            rows[m["name"]] = (
                m["name"],
                m["state"],
                f"{m['ready']}/{m['desired']}",
                m["engine"],
                str(m["context"]),
                str(m["max_output"] or DASH),
                profiles or DASH,
                m.get("parked") or "; ".join(n for n in notes if n),
            )
        fill(self.query_one(DataTable), COLUMNS, rows)
