"""Guard: the guard policies (``GET /api/v1/guard/policies``), one row each (its judge,
what an instruction or personal data found does, its wait and what a judgment past it
does), and this control plane's recent decisions (``GET /api/v1/guard/decisions``),
newest first: when, the policy, the verdict, the key, where (a prompt, a tool's
arguments or answer) and what kind of data was found, never the data itself.

The pane reads both routes itself, only while it is shown; a role that does not read
them (a viewer) is told so. Policies are changed with ``llmgw ctl guard policy`` or on
the Guard page."""

from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.events import Show
from textual.widgets import DataTable, Static

from llmgw.client import routes
from llmgw.client.adminbase import AdminError
from llmgw.tui.api import Snapshot, refused
from llmgw.tui.base import DASH, Pane, fill
from llmgw.tui.fabrics import said
from llmgw.wire.admin import GuardDecisionJson, GuardPolicyJson

POLICY_COLUMNS = ("POLICY", "JUDGE", "INSTRUCTIONS", "PERSONAL DATA", "WAIT", "PAST THE WAIT")
DECISION_COLUMNS = ("WHEN", "POLICY", "VERDICT", "KEY", "WHERE", "FOUND")
NOT_YOURS = "Your role does not read guard policies (an operator's or admin's does)."
NONE_YET = "No guard policy: keys read and send as they are. `llmgw ctl guard policy add` adds one."
# The decisions shown: the control plane keeps more, newest first.
SHOWN_DECISIONS = 200


def policy_row(p: GuardPolicyJson) -> tuple[str, ...]:
    return (
        p["name"],
        p["judge"] or "pattern rules only",
        p["injection"],
        p["pii"],
        f"{p['wait_ms']} ms",
        "refuse" if p["fail"] == "closed" else "let through, flagged",
    )


def decision_row(d: GuardDecisionJson) -> tuple[str, ...]:
    return (
        time.strftime("%H:%M:%S", time.gmtime(d["at"])),
        d["policy"],
        d["verdict"],
        d["key"],
        d["where"],
        d["found"] or DASH,
    )


def summary(policies: list[GuardPolicyJson], decisions: list[GuardDecisionJson]) -> Text:
    """How many policies and decisions, and each policy's warnings with what to change."""
    if not policies:
        text = Text(NONE_YET, style="dim")
    else:
        text = Text(f"{len(policies)} polic{'y' if len(policies) == 1 else 'ies'}", style="bold")
    text.append(f" · {len(decisions)} recent decision{'' if len(decisions) == 1 else 's'}")
    for p in policies:
        for warning in p["warnings"]:
            text.append(f"\n⚠ {p['name']}: ", style="yellow")
            text.append(warning)
    return text


class GuardPane(Pane):
    TITLE = "Guard"
    ID = "guard"
    KEY = "g"

    DEFAULT_CSS = """
    GuardPane #guard-summary {
        height: auto;
        max-height: 8;
    }
    GuardPane #guard-policies {
        height: auto;
        max-height: 12;
    }
    GuardPane #guard-decisions {
        height: 1fr;
        border-top: solid $primary-lighten-2;
    }
    """

    def compose(self) -> ComposeResult:
        yield Static(Text("Reading the guard's policies…", style="dim"), id="guard-summary")
        yield DataTable(id="guard-policies", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="guard-decisions", cursor_type="row", zebra_stripes=True)

    def update_from(self, snapshot: Snapshot) -> None:
        if self.display:
            self.fetch()

    def on_show(self, event: Show) -> None:
        self.fetch()

    @work(exclusive=True, group="guard")
    async def fetch(self) -> None:
        api = self.console.api
        top = self.query_one("#guard-summary", Static)
        try:
            policies = await api.call(routes.GUARD_POLICIES)
            decisions = await api.call(routes.GUARD_DECISIONS)
        except AdminError as exc:
            if refused(exc):
                top.update(Text(NOT_YOURS, style="dim"))
            else:
                why = said(exc, api.base_url + routes.GUARD_POLICIES.path)
                top.update(Text(f"Cannot read the guard: {why}", style="red"))
            return
        self.show(policies, decisions[:SHOWN_DECISIONS])

    def show(self, policies: list[GuardPolicyJson], decisions: list[GuardDecisionJson]) -> None:
        self.query_one("#guard-summary", Static).update(summary(policies, decisions))
        fill(
            self.query_one("#guard-policies", DataTable),
            POLICY_COLUMNS,
            {p["name"]: policy_row(p) for p in policies},
        )
        # Keyed by position: two decisions may share every field.
        fill(
            self.query_one("#guard-decisions", DataTable),
            DECISION_COLUMNS,
            {f"{i}:{d['at']}": decision_row(d) for i, d in enumerate(decisions)},
        )
