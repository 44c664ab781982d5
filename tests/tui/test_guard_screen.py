"""The console's Guard screen against the admin API's client answering from a table
(``tests/support/fakeadmin.py``), driven by Pilot: each policy with its judge, what it
does and its wait, a policy's warning with what to change, the recent decisions (never
the data found), a viewer told their role does not read them, and a control plane
that cannot answer said so."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Static

from llmgw.client.adminbase import AdminError
from llmgw.tui.api import ConsoleApi
from llmgw.tui.app import ConsoleApp
from llmgw.tui.guard import NOT_YOURS, GuardPane
from llmgw.wire.admin import GuardDecisionJson, GuardPolicyJson
from tests.tui.test_node_screens import until
from tests.tui.test_slurm_screen import fake_admin, refusal

POLICIES: list[GuardPolicyJson] = [
    {
        "name": "pii",
        "judge": None,
        "injection": "flag",
        "pii": "redact",
        "wait_ms": 2000,
        "fail": "closed",
        "warnings": [],
    },
    {
        "name": "strict",
        "judge": "tiny",
        "injection": "block",
        "pii": "block",
        "wait_ms": 500,
        "fail": "open",
        "warnings": ["tiny keeps its prompt cache: serve it with --arg=--cache-ram --arg=0"],
    },
]
DECISIONS: list[GuardDecisionJson] = [
    {
        "at": 1_760_000_000.0,
        "policy": "pii",
        "verdict": "redact",
        "key": "k-ci",
        "where": "tool_answer tickets.get",
        "found": "email at 12-30 (redacted: j***@***)",
    },
    {
        "at": 1_759_999_990.0,
        "policy": "strict",
        "verdict": "timeout",
        "key": "k-ci",
        "where": "prompt",
        "found": "",
    },
]


def plain(app: ConsoleApp, selector: str) -> str:
    shown = app.query_one(selector, Static).content
    return shown.plain if isinstance(shown, Text) else str(shown)


def cells(table: DataTable[Any], index: int) -> list[str]:
    return [str(c) for c in table.get_row_at(index)]


async def test_policies_and_recent_decisions() -> None:
    admin = fake_admin()
    admin.answer("GET", "/api/v1/guard/policies", POLICIES)
    admin.answer("GET", "/api/v1/guard/decisions", DECISIONS)
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: app.snapshot.at, "the first snapshot")
        await pilot.press(GuardPane.KEY)
        policies = app.query_one("#guard-policies", DataTable)
        await until(pilot, lambda: policies.row_count == 2, "the policies")
        assert cells(policies, 0) == [
            "pii",
            "pattern rules only",
            "flag",
            "redact",
            "2000 ms",
            "refuse",
        ]
        assert cells(policies, 1) == [
            "strict",
            "tiny",
            "block",
            "block",
            "500 ms",
            "let through, flagged",
        ]
        decisions = app.query_one("#guard-decisions", DataTable)
        assert decisions.row_count == 2
        assert cells(decisions, 0) == [
            "08:53:20",
            "pii",
            "redact",
            "k-ci",
            "tool_answer tickets.get",
            "email at 12-30 (redacted: j***@***)",
        ]
        # Nothing found (a judge's timeout): a dash.
        assert cells(decisions, 1)[1:] == ["strict", "timeout", "k-ci", "prompt", "-"]
        top = plain(app, "#guard-summary")
        assert top.startswith("2 policies · 2 recent decisions")
        assert "⚠ strict: tiny keeps its prompt cache" in top
        # Read only while shown, and again on each refresh.
        asked = [a for a in admin.asked if a[1] == "/api/v1/guard/decisions"]
        app.action_refresh_now()
        await until(
            pilot,
            lambda: len([a for a in admin.asked if a[1] == "/api/v1/guard/decisions"]) > len(asked),
            "a second reading",
        )


async def test_a_viewer_is_told_and_a_failure_said() -> None:
    admin = fake_admin()
    path = "/api/v1/guard/policies"
    admin.answer("GET", path, refusal(path, 403, "reading guard policies needs the operator role"))
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: app.snapshot.at, "the first snapshot")
        await pilot.press(GuardPane.KEY)
        await until(pilot, lambda: plain(app, "#guard-summary") == NOT_YOURS, "the refusal")
        assert app.query_one("#guard-policies", DataTable).row_count == 0
        admin.answer("GET", path, AdminError("http://cp: connection refused"))
        app.action_refresh_now()
        await until(
            pilot,
            lambda: plain(app, "#guard-summary").startswith("Cannot read the guard:"),
            "the failure",
        )
