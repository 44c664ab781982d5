"""Overview: nodes, cards and replicas by state, serving or stopped, and alerts, each
alert a line that names what is wrong and where."""

from __future__ import annotations

from collections import Counter

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from llmgw.client.ctl_models import NO_STATUS
from llmgw.tui.api import Snapshot
from llmgw.tui.base import Pane, bar
from llmgw.wire.admin import NodeJson
from llmgw.wire.warnings import split_fix

# Replica states in the order they move through, so counts read left to right.
REPLICA_ORDER = ("ready", "loading", "downloading", "installing", "failed")
LABEL = 10


def counts(counter: Counter[str], order: tuple[str, ...] = ()) -> str:
    known = [s for s in order if counter.get(s)]
    rest = sorted(s for s in counter if s not in order)
    return " · ".join(f"{counter[s]} {s}" for s in [*known, *rest]) or "none"


def alerts(snapshot: Snapshot) -> list[tuple[str, str]]:
    """(severity, words): ``error`` for what stops serving, ``warn`` for what may."""
    out: list[tuple[str, str]] = []
    for n in snapshot.nodes:
        if n.get("state") != "Ready":
            reason = n.get("reason") or "no reason given"
            out.append(("error", f"node {n['id']} is {n.get('state')}: {reason}"))
        for w in n.get("warnings") or []:
            detail, fix = split_fix(w)
            out.append(("warn", f"node {n['id']}: {detail}" + (f" (fix: {fix})" if fix else "")))
    for m in snapshot.models:
        for p in m.get("profiles") or []:
            note = (p.get("status") or NO_STATUS)["note"]
            if note:
                out.append(("warn", f"model {m['name']} ({p['name']}): {note}"))
        if m.get("parked"):
            out.append(("error", f"model {m['name']} parked: {m['parked']}"))
    for r in snapshot.replicas:
        if r.get("state") == "failed":
            where = f" on {r['node']}" if r.get("node") else ""
            out.append(("error", f"replica {r['replica_id']}{where} failed: {r.get('reason')}"))
    return out


def node_line(states: Counter[str], total: int) -> str:
    # "Ready of total" first: the figure an operator looks for.
    others = Counter({s: k for s, k in states.items() if s != "Ready"})
    line = f"{states.get('Ready', 0)} Ready of {total}"
    return line + (f" · {counts(others, ('NotReady',))}" if others else "")


def card_load(nodes: list[NodeJson]) -> str:
    cards = [c for n in nodes for c in n.get("gpus") or []]
    if not cards:
        return "none"
    utils = [c["utilization"] for c in cards if c.get("utilization") is not None]
    used = sum(c.get("memory_used") or 0 for c in cards)
    total = sum(c.get("memory_total") or 0 for c in cards)
    busy = bar(sum(utils) / len(utils), 100.0, 8) if utils else "not read"
    return f"{len(cards)} · busy {busy} · memory {bar(used, total, 8)} of {total / 2**30:.0f} GiB"


def overview(snapshot: Snapshot) -> Text:
    nodes = snapshot.nodes
    serving = snapshot.status.get("serving", "serving") if snapshot.status else "serving"
    node_states: Counter[str] = Counter(str(n.get("state") or "unknown") for n in nodes)
    node_states.update(
        "draining" if n.get("draining") else "cordoned"
        for n in nodes
        if n.get("draining") or n.get("cordoned")
    )
    model_states: Counter[str] = Counter(str(m.get("state") or "unknown") for m in snapshot.models)
    replica_states: Counter[str] = Counter(
        str(r.get("state") or "unknown") for r in snapshot.replicas
    )
    found = alerts(snapshot)

    text = Text()
    if serving == "stopped":
        text.append("STOPPED", style="bold red")
        text.append("  every model at zero, /v1 answers 503 (`llmgw start` resumes)")
    else:
        text.append("Serving", style="bold green")
    text.append("\n\n")
    for label, value in (
        ("Nodes", node_line(node_states, len(nodes))),
        ("Cards", card_load(nodes)),
        ("Models", f"{len(snapshot.models)}: {counts(model_states, ('serving',))}"),
        ("Replicas", f"{len(snapshot.replicas)}: {counts(replica_states, REPLICA_ORDER)}"),
    ):
        text.append(f"{label:<{LABEL}}", style="bold")
        text.append(value + "\n")
    text.append("\n")
    text.append(f"Alerts ({len(found)})" if found else "Alerts: none", style="bold")
    for severity, words in found:
        text.append("\n")
        text.append(
            "✗ " if severity == "error" else "⚠ ", style="red" if severity == "error" else "yellow"
        )
        text.append(words)
    return text


class OverviewPane(Pane):
    TITLE = "Overview"
    ID = "overview"
    KEY = "1"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="overview-body")

    def update_from(self, snapshot: Snapshot) -> None:
        self.query_one("#overview-body", Static).update(overview(snapshot))
