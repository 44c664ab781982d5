"""Nodes: state, CPU and memory bars, cards, engines and warnings; under the table the
highlighted node's warnings in full with their fix, and Enter opens the node's page."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, append_problem, bar, fill, highlighted
from llmgw.wire.admin import CardJson, NodeJson

COLUMNS = ("NODE", "STATE", "CPU", "MEMORY", "CARDS", "ENGINES", "WARNINGS")


def slurm_stage(n: NodeJson) -> str | None:
    """The node's stage in Slurm's set (serving, lending, lent, reclaiming); None when
    it is not in the set, or the control plane is older than Slurm beside llmgw."""
    return n.get("slurm")


def node_state(n: NodeJson) -> str:
    state = n.get("state") or DASH
    if n.get("draining"):
        state += ",Draining"
    elif n.get("cordoned"):
        state += ",Cordoned"
    stage = slurm_stage(n)
    # Serving is the usual stage: only a node on its way to Slurm, or Slurm's, says so.
    if stage is not None and stage != "serving":
        state += f",{stage}"
    return state


def memory_used(n: NodeJson) -> int | None:
    total, avail = n.get("memory_total"), n.get("memory_available")
    return total - avail if isinstance(total, int) and isinstance(avail, int) else None


def cards_summary(gpus: list[CardJson]) -> str:
    """``8 × H100 80GB`` or, for a mixed node, each name with its count."""
    if not gpus:
        return "0"
    names: dict[str, int] = {}
    for g in gpus:
        name = str(g.get("name") or "card")
        names[name] = names.get(name, 0) + 1
    return ", ".join(f"{count} × {name}" for name, count in names.items())


def node_row(n: NodeJson) -> tuple[str, ...]:
    cpu = n.get("cpu_percent")
    engines = n.get("engines")
    warnings = n.get("warnings") or []
    return (
        n["id"],
        node_state(n),
        bar(cpu, 100.0, 8) if cpu is not None else DASH,
        bar(memory_used(n), n.get("memory_total"), 8),
        cards_summary(n.get("gpus") or []),
        ", ".join(e["name"] for e in engines) if engines else DASH,
        f"{len(warnings)} ⚠" if warnings else "",
    )


def node_detail(n: NodeJson | None, hint: bool = True) -> Text:
    """The line under the table: where the node is, why it is not Ready, and each
    warning with what to do about it."""
    if n is None:
        return Text("No nodes yet: `llmgw node add HOST` or `llmgw node token`.", style="dim")
    text = Text()
    text.append(n["id"], style="bold")
    facts = [n.get("address"), n.get("os"), n.get("cpu_model")]
    text.append("  " + " · ".join(str(f) for f in facts if f))
    labels = n.get("labels") or {}
    if labels:
        text.append("  labels " + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    stage = slurm_stage(n)
    if stage is not None:
        text.append(f"\nSlurm: {stage}" + (" (Slurm's to schedule)" if stage == "lent" else ""))
    if n.get("state") != "Ready":
        reason = n.get("reason") or "no reason given"
        text.append(f"\n✗ {n.get('state') or 'unknown'}: {reason}", style="red")
    for warning in n.get("warnings") or []:
        append_problem(text, warning)
    if n.get("engine_message"):
        text.append(f"\n… {n['engine_message']}", style="dim")
    if hint:
        text.append("\nEnter opens the node's page.", style="dim")
    return text


class NodesPane(Pane):
    TITLE = "Nodes"
    ID = "nodes"
    KEY = "2"
    KEYS = (("enter", "node's page"),)

    DEFAULT_CSS = """
    NodesPane #nodes-detail {
        height: auto;
        max-height: 12;
        border-top: solid $primary-lighten-2;
    }
    """

    nodes: dict[str, NodeJson]

    def compose(self) -> ComposeResult:
        self.nodes = {}
        yield DataTable(id="nodes-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="nodes-detail")

    def update_from(self, snapshot: Snapshot) -> None:
        self.nodes = {n["id"]: n for n in snapshot.nodes}
        rows = {node_id: node_row(n) for node_id, n in self.nodes.items()}
        fill(self.query_one(DataTable), COLUMNS, rows)
        self.show_detail()

    @property
    def highlighted(self) -> str | None:
        return highlighted(self.query_one(DataTable))

    def show_detail(self) -> None:
        node_id = self.highlighted
        self.query_one("#nodes-detail", Static).update(
            node_detail(self.nodes.get(node_id) if node_id else None)
        )

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.console.open_node(str(event.row_key.value))
