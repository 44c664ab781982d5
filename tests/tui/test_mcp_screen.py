"""The console's MCP screen against the admin API's client answering from a table
(``tests/support/fakeadmin.py``), driven by Pilot: each server's state (on, off, out
while its breaker is open), address, tools, rate and timeout; the highlighted one's
headers by name (sealed marked, no value) and who is granted its tools; a viewer told
their role does not read them."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Static

from llmgw.tui.api import ConsoleApi
from llmgw.tui.app import ConsoleApp
from llmgw.tui.mcp import NOT_YOURS, McpPane
from llmgw.wire.admin import McpGrantJson, McpServerJson
from tests.tui.test_node_screens import until
from tests.tui.test_slurm_screen import fake_admin, refusal

SERVERS: list[McpServerJson] = [
    {
        "name": "llmgw:admin",
        "url": None,
        "builtin": True,
        "enabled": True,
        "up": True,
        "out_until": None,
        "headers": [],
        "timeout": 30.0,
        "rate": None,
        "description": "llmgw's own tools, answered by the control plane",
        "tools": 6,
        "updated_at": None,
        "updated_by": None,
    },
    {
        "name": "tickets",
        "url": "https://tickets.example/mcp",
        "builtin": False,
        "enabled": True,
        "up": False,
        "out_until": 4_000_000_000.0,
        "headers": [
            {"name": "X-Org", "sealed": False, "value": "acme"},
            {"name": "Authorization", "sealed": True, "value": None},
        ],
        "timeout": 10.0,
        "rate": 5,
        "description": "",
        "tools": None,
        "updated_at": 1_760_000_000.0,
        "updated_by": "admin@10.0.0.1",
    },
    {
        "name": "wiki",
        "url": "https://wiki.example/mcp",
        "builtin": False,
        "enabled": False,
        "up": False,
        "out_until": None,
        "headers": [],
        "timeout": 30.0,
        "rate": None,
        "description": "the team wiki",
        "tools": 3,
        "updated_at": None,
        "updated_by": None,
    },
]
GRANTS: list[McpGrantJson] = [
    {
        "level": "team",
        "id": "t1",
        "label": "team vision",
        "org": "acme",
        "patterns": ["tickets.*"],
        "closed": False,
    },
    {"level": "key", "id": "k1", "label": "key ci", "org": None, "patterns": [], "closed": True},
]


def plain(app: ConsoleApp, selector: str) -> str:
    shown = app.query_one(selector, Static).content
    return shown.plain if isinstance(shown, Text) else str(shown)


def cells(table: DataTable[Any], key: str) -> list[str]:
    return [str(c) for c in table.get_row(key)]


def admin_with_servers() -> Any:
    admin = fake_admin()
    admin.answer("GET", "/api/v1/mcp/servers", SERVERS)
    admin.answer("GET", "/api/v1/mcp/grants?server=llmgw%3Aadmin", [GRANTS[1]])
    admin.answer("GET", "/api/v1/mcp/grants?server=tickets", GRANTS)
    admin.answer("GET", "/api/v1/mcp/grants?server=wiki", [GRANTS[1]])
    return admin


async def test_servers_their_state_and_who_is_granted_their_tools() -> None:
    admin = admin_with_servers()
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: app.snapshot.at, "the first snapshot")
        await pilot.press(McpPane.KEY)
        table = app.query_one("#mcp-table", DataTable)
        await until(pilot, lambda: table.row_count == 3, "the servers")
        assert cells(table, "llmgw:admin") == [
            "llmgw:admin",
            "on",
            "in the control plane",
            "6",
            "-",
            "30 s",
        ]
        tickets = cells(table, "tickets")
        assert tickets[0] == "tickets" and tickets[1].startswith("out for ")
        # Tools never listed: a dash, not 0.
        assert tickets[2:] == ["https://tickets.example/mcp", "-", "5/min", "10 s"]
        assert cells(table, "wiki")[:4] == ["wiki", "off", "https://wiki.example/mcp", "3"]
        assert plain(app, "#mcp-summary") == "3 servers · 1 out (their breaker is open)"
        detail = plain(app, "#mcp-detail")
        assert detail.startswith("llmgw:admin  llmgw's own tools, answered by the control plane")
        assert "Granted to no one" in detail and "Closed: key ci" in detail

        table.focus()
        await pilot.press("down")
        await until(pilot, lambda: "Headers" in plain(app, "#mcp-detail"), "tickets")
        detail = plain(app, "#mcp-detail")
        assert "Headers: X-Org, Authorization (sealed)" in detail
        assert "acme" not in detail  # a plain header's value is not shown either
        assert "team vision: tickets.*" in detail
        assert "Changed by admin@10.0.0.1" in detail


async def test_a_viewer_is_told() -> None:
    admin = fake_admin()
    path = "/api/v1/mcp/servers"
    admin.answer("GET", path, refusal(path, 403, "reading MCP servers needs the operator role"))
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: app.snapshot.at, "the first snapshot")
        await pilot.press(McpPane.KEY)
        await until(pilot, lambda: plain(app, "#mcp-summary") == NOT_YOURS, "the refusal")
        assert app.query_one("#mcp-table", DataTable).row_count == 0
