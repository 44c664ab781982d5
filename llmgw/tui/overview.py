"""Overview: nodes, cards and replicas by state, serving or stopped, and alerts."""

from __future__ import annotations

from collections import Counter

from textual.app import ComposeResult
from textual.widgets import Static

from llmgw.tui.api import Snapshot
from llmgw.tui.base import Pane


class OverviewPane(Pane):
    TITLE = "Overview"
    ID = "overview"
    KEY = "1"

    def compose(self) -> ComposeResult:
        yield Static(id="overview-body")

    def update_from(self, snapshot: Snapshot) -> None:
        status = snapshot.status
        nodes = snapshot.nodes
        ready = sum(1 for n in nodes if n.get("state") == "Ready")
        cards = sum(len(n.get("gpus") or []) for n in nodes)
        states = Counter(r.get("state") for r in snapshot.replicas)
        serving = status.get("serving", "serving")
        lines = [
            f"[b]{'STOPPED' if serving == 'stopped' else 'Serving'}[/b]"
            + ("  (`llmgw start` resumes)" if serving == "stopped" else ""),
            "",
            f"Nodes     {ready} Ready of {len(nodes)}",
            f"Cards     {cards}",
            f"Models    {len(snapshot.models)}",
            "Replicas  "
            + (", ".join(f"{n} {s}" for s, n in sorted(states.items(), key=str)) or "none"),
            "",
            "[b]Alerts[/b]",
        ]
        alerts = []
        for n in nodes:
            if n.get("state") != "Ready":
                alerts.append(f"node {n['id']} is {n.get('state')}: {n.get('reason') or ''}")
            for w in n.get("warnings") or []:
                alerts.append(f"node {n['id']}: {w}")
        for m in snapshot.models:
            for p in m.get("profiles") or []:
                note = (p.get("status") or {}).get("note")
                if note:
                    alerts.append(f"model {m['name']} ({p['name']}): {note}")
            if m.get("parked"):
                alerts.append(f"model {m['name']} parked: {m['parked']}")
        for r in snapshot.replicas:
            if r.get("state") == "failed":
                alerts.append(f"replica {r['replica_id']} failed: {r.get('reason')}")
        lines += alerts or ["none"]
        self.query_one("#overview-body", Static).update("\n".join(lines))
