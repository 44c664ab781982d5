"""Nodes: state, CPU and memory bars, cards, engines and warnings."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.widgets import DataTable

from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, bar, fill

COLUMNS = ("NODE", "STATE", "ADDRESS", "CPU", "MEMORY", "CARDS", "ENGINES", "WARNINGS")


def node_row(n: dict[str, Any]) -> tuple[str, ...]:
    state = n.get("state") or DASH
    if n.get("draining"):
        state += ",Draining"
    elif n.get("cordoned"):
        state += ",Cordoned"
    total, avail = n.get("memory_total"), n.get("memory_available")
    used = total - avail if isinstance(total, int) and isinstance(avail, int) else None
    gpus = n.get("gpus") or []
    engines = n.get("engines")
    return (
        n["id"],
        state,
        n.get("address") or DASH,
        bar(n.get("cpu_percent"), 100.0) if n.get("cpu_percent") is not None else DASH,
        bar(used, total),
        f"{len(gpus)} {gpus[0].get('name', '')}".strip() if gpus else "0",
        ", ".join(e["name"] for e in engines) if engines else DASH,
        str(len(n.get("warnings") or [])) if n.get("warnings") else "",
    )


class NodesPane(Pane):
    TITLE = "Nodes"
    ID = "nodes"
    KEY = "2"

    def compose(self) -> ComposeResult:
        yield DataTable(id="nodes-table", cursor_type="row", zebra_stripes=True)

    def update_from(self, snapshot: Snapshot) -> None:
        rows = {n["id"]: node_row(n) for n in snapshot.nodes}
        fill(self.query_one(DataTable), COLUMNS, rows)
