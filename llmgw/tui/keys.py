"""Keys: the gateway's API keys, without the keys themselves."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import DataTable

from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, fill

COLUMNS = ("ID", "NAME", "STATE", "MODELS", "RPM", "TPM", "BUDGET")


class KeysPane(Pane):
    TITLE = "Keys"
    ID = "keys"
    KEY = "6"

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
