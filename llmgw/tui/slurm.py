"""Slurm: the nodes llmgw shares with Slurm (``GET /api/v1/slurm``), one row each: its
part (slurmctld, slurmd, both), its stage on llmgw's side (serving, lending, lent,
reclaiming), Slurm's state and reason as its agent last read them, its jobs, Slurm's
version and what a lending or reclaiming node waits for. Under the table the highlighted
node in full (its jobs with their end, the daemons running there, its problem with the
fix), then the cluster's warnings and what the lending policy would do next.

``l`` lends the highlighted node to Slurm and ``c`` reclaims it, each after a question;
the control plane decides (``POST /api/v1/slurm/lend``, ``/reclaim``) and its refusal
(an administrator's drain, a replica with nowhere to go) is shown as it said it.

The pane reads the route itself, only while it is shown."""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.events import Show
from textual.widgets import DataTable, Static

from llmgw.client import routes
from llmgw.client.adminbase import AdminError
from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, append_problem, fill, highlighted
from llmgw.tui.dialogs import ConfirmDialog
from llmgw.tui.fabrics import is_not_found, said
from llmgw.wire.admin import SlurmJobJson, SlurmJson, SlurmNodeJson

COLUMNS = ("NODE", "PART", "STAGE", "SLURM STATE", "REASON", "JOBS", "VERSION", "WAITING FOR")
# Said for a control plane without the route (older than Slurm beside llmgw).
NO_SLURM = "This control plane has no Slurm (GET /api/v1/slurm answers 404)."
OFF = "Slurm is off: `llmgw ctl slurm setup` turns it on."
QUESTIONS = {
    "lend": (
        "Lend {node} to Slurm? Its replicas are placed on other nodes before they stop; "
        "then it is cordoned in llmgw and resumed in Slurm."
    ),
    "reclaim": (
        "Take {node} back from Slurm? It is drained in Slurm at once and stays cordoned "
        "in llmgw until its last job step ends; then it serves again."
    ),
}
STAGE_STYLE = {"lent": "magenta", "lending": "yellow", "reclaiming": "yellow"}


def jobs_cell(jobs: list[SlurmJobJson] | None) -> str:
    """How many jobs; a dash when slurmctld could not be asked."""
    return DASH if jobs is None else str(len(jobs))


def slurm_row(n: SlurmNodeJson) -> tuple[str, ...]:
    stage = n["stage"]
    if not n["connected"]:
        stage += " (agent away)"
    return (
        n["node"],
        n["part"],
        stage,
        n["state"] or DASH,
        n["reason"] or DASH,
        jobs_cell(n["jobs"]),
        n["version"] or DASH,
        n["waiting_for"] or DASH,
    )


def ends(end: float | None, now: float) -> str:
    if end is None:
        return "no end set"
    left = end - now
    if left <= 0:
        return "past its end"
    if left < 120:
        return f"ends in {left:.0f} s"
    if left < 7200:
        return f"ends in {left / 60:.0f} min"
    return f"ends in {left / 3600:.0f} h"


def node_text(n: SlurmNodeJson | None, now: float) -> Text:
    """The highlighted node in full: Slurm's name for it, its state, what runs there,
    each job, what it does or waits for, and its problem with the fix."""
    text = Text()
    if n is None:
        text.append("No node in Slurm's set.", style="dim")
        return text
    text.append(n["node"], style="bold")
    if n["name"] != n["node"]:
        text.append(f"  (NodeName {n['name']})")
    text.append(f"  {n['part']} · ")
    text.append(n["stage"], style=STAGE_STYLE.get(n["stage"], ""))
    if n["lent"]:
        text.append(" · Slurm's to schedule")
    if n["state"]:
        text.append(f"\nSlurm: {n['state']}")
        if n["reason"]:
            text.append(f" ({n['reason']})")
    if n["admin_drain"]:
        text.append(
            "\nDrained by a Slurm administrator: llmgw never resumes or overwrites it.",
            style="yellow",
        )
    if n["running"]:
        text.append(f"\nRunning here: {', '.join(n['running'])}")
    if n["steps"] is not None:
        text.append(f"\nJob steps on the machine: {n['steps']}")
    if n["jobs"] is None:
        text.append("\nJobs: not read (slurmctld could not be asked)", style="dim")
    else:
        for job in n["jobs"]:
            who = f" by {job['user']}" if job["user"] else ""
            text.append(
                f"\n  job {job['id']} {job['name'] or DASH}{who} "
                f"{job['state'] or DASH}, {ends(job['end'], now)}"
            )
    if n["doing"]:
        text.append(f"\n… {n['doing']}", style="dim")
    if n["waiting_for"]:
        text.append(f"\nWaiting for {n['waiting_for']}", style="yellow")
    if n["problem"]:
        append_problem(text, n["problem"])
    return text


def cluster_text(found: SlurmJson) -> Text:
    """Where slurmctld runs, the warnings with their fix, and what the policy would do
    next."""
    text = Text()
    if not found["enabled"]:
        text.append(OFF, style="dim")
    else:
        text.append("Slurm on", style="bold")
        text.append(f" · controller {found['controller'] or DASH}")
        if found["conf_server"]:
            text.append(f" ({found['conf_server']})")
        text.append(f" · partition {found['partition']}")
        if found["root"]:
            text.append(f" · root {found['root']}")
    for warning in found["warnings"]:
        append_problem(text, warning)
    policy = found["policy"]
    if policy["lend_idle_after"] is None and policy["reclaim_when_queued"] is None:
        text.append("\nPolicy: off", style="dim")
    else:
        parts = []
        if policy["lend_idle_after"] is not None:
            parts.append(f"lend after {policy['lend_idle_after'] / 60:g} min idle")
        parts.append(f"keep {policy['keep_free_gpus']} card(s) free")
        if policy["reclaim_when_queued"] is not None:
            parts.append(f"reclaim when queued {policy['reclaim_when_queued']:g} s")
        text.append(f"\nPolicy: {', '.join(parts)}")
        for step in found["next"] or ["nothing to do"]:
            text.append(f"\n  next: {step}")
    return text


class SlurmPane(Pane):
    TITLE = "Slurm"
    ID = "slurm"
    KEY = "u"
    KEYS = (("l", "Lend…"), ("c", "Reclaim…"))
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("l", "lend", "Lend…"),
        Binding("c", "reclaim", "Reclaim…"),
    ]

    DEFAULT_CSS = """
    SlurmPane #slurm-cluster {
        height: auto;
        max-height: 10;
    }
    SlurmPane #slurm-table {
        height: auto;
        max-height: 16;
    }
    SlurmPane #slurm-scroll {
        height: 1fr;
        border-top: solid $primary-lighten-2;
    }
    """

    found: SlurmJson | None
    nodes: dict[str, SlurmNodeJson]

    def compose(self) -> ComposeResult:
        self.found, self.nodes = None, {}
        yield Static(Text("Reading Slurm's state…", style="dim"), id="slurm-cluster")
        yield DataTable(id="slurm-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="slurm-scroll"):
            yield Static(id="slurm-detail")

    def update_from(self, snapshot: Snapshot) -> None:
        if self.display:
            self.fetch()

    def on_show(self, event: Show) -> None:
        self.fetch()

    @work(exclusive=True, group="slurm")
    async def fetch(self) -> None:
        api = self.console.api
        cluster = self.query_one("#slurm-cluster", Static)
        try:
            found = await api.slurm()
        except AdminError as exc:
            if is_not_found(exc):
                cluster.update(Text(NO_SLURM, style="dim"))
            else:
                why = said(exc, api.base_url + routes.SLURM.path)
                cluster.update(Text(f"Cannot read Slurm's state: {why}", style="red"))
            return
        self.show(found)

    def show(self, found: SlurmJson) -> None:
        self.found = found
        self.nodes = {n["node"]: n for n in found["nodes"]}
        fill(self.query_one(DataTable), COLUMNS, {k: slurm_row(n) for k, n in self.nodes.items()})
        self.query_one("#slurm-cluster", Static).update(cluster_text(found))
        self.show_detail()

    @property
    def highlighted(self) -> str | None:
        return highlighted(self.query_one(DataTable))

    def show_detail(self) -> None:
        node_id = self.highlighted
        node = self.nodes.get(node_id) if node_id else None
        self.query_one("#slurm-detail", Static).update(node_text(node, time.time()))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail()

    def action_lend(self) -> None:
        self.ask("lend")

    def action_reclaim(self) -> None:
        self.ask("reclaim")

    def ask(self, action: str) -> None:
        node_id = self.highlighted
        if node_id is None:
            self.app.notify(f"No node to {action}", severity="warning")
            return

        def after(yes: bool | None) -> None:
            if yes:
                self.change(action, node_id)

        question = QUESTIONS[action].format(node=node_id)
        title = action.capitalize()
        self.app.push_screen(ConfirmDialog(title, question, title), after)

    @work(group="slurm-actions")
    async def change(self, action: str, node_id: str) -> None:
        api = self.console.api
        try:
            if action == "lend":
                found = await api.slurm_lend([node_id])
            else:
                found = await api.slurm_reclaim([node_id])
        except AdminError as exc:
            route = routes.SLURM_LEND if action == "lend" else routes.SLURM_RECLAIM
            why = said(exc, api.base_url + route.path)
            self.app.notify(why, title=action.capitalize(), severity="error", timeout=15)
            return
        stage = next((n["stage"] for n in found["nodes"] if n["node"] == node_id), None)
        self.app.notify(f"{node_id}: {stage or action}")
        self.show(found)
