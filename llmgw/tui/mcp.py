"""MCP: the tool servers the gateway's ``/mcp`` reaches (``GET /api/v1/mcp/servers``),
one row each: its state (on, off, or out while its breaker has it out), address, tools
listed, each caller's rate and its timeout; under the table the highlighted server in
full: its headers by name (a sealed one marked, never a value) and who is granted its
tools (``GET /api/v1/mcp/grants?server=NAME``).

The pane reads the routes itself, only while it is shown; a role that does not read
them is told so. Servers are added and changed with ``llmgw ctl mcp`` or on the MCP
page."""

from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.events import Show
from textual.widgets import DataTable, Static

from llmgw.client import routes
from llmgw.client.adminbase import AdminError
from llmgw.tui.api import Snapshot, refused
from llmgw.tui.base import DASH, Pane, fill, highlighted
from llmgw.tui.fabrics import said
from llmgw.wire.admin import McpGrantJson, McpServerJson

COLUMNS = ("SERVER", "STATE", "ADDRESS", "TOOLS", "RATE", "TIMEOUT")
NOT_YOURS = "Your role does not read MCP servers (an operator's or admin's does)."


def state_of(s: McpServerJson, now: float) -> str:
    if not s["enabled"]:
        return "off"
    if s["up"]:
        return "on"
    until = s["out_until"]
    return f"out for {max(0.0, until - now):.0f} s" if until is not None else "out"


def server_row(s: McpServerJson, now: float) -> tuple[str, ...]:
    return (
        s["name"],
        state_of(s, now),
        "in the control plane" if s["builtin"] else s["url"] or DASH,
        DASH if s["tools"] is None else str(s["tools"]),
        DASH if s["rate"] is None else f"{s['rate']}/min",
        f"{s['timeout']:g} s",
    )


def server_text(s: McpServerJson | None, grants: list[McpGrantJson] | None) -> Text:
    """The highlighted server: what it is for, its headers and who may call its tools."""
    text = Text()
    if s is None:
        text.append("No MCP server.", style="dim")
        return text
    text.append(s["name"], style="bold")
    if s["description"]:
        text.append(f"  {s['description']}")
    if s["headers"]:
        text.append("\nHeaders: ")
        text.append(
            ", ".join(f"{h['name']}{' (sealed)' if h['sealed'] else ''}" for h in s["headers"])
        )
    if s["updated_by"]:
        text.append(f"\nChanged by {s['updated_by']}", style="dim")
    if grants is None:
        text.append("\nGranted to: not read", style="dim")
        return text
    granted = [g for g in grants if not g["closed"]]
    closed = [g for g in grants if g["closed"]]
    if not granted:
        text.append("\nGranted to no one", style="yellow")
    for g in granted:
        text.append(f"\n  {g['label']}: ")
        text.append(", ".join(g["patterns"]), style="cyan")
    if closed:
        text.append(f"\nClosed: {', '.join(g['label'] for g in closed)}", style="dim")
    return text


class McpPane(Pane):
    TITLE = "MCP"
    ID = "mcp"
    KEY = "m"

    DEFAULT_CSS = """
    McpPane #mcp-table {
        height: auto;
        max-height: 16;
    }
    McpPane #mcp-scroll {
        height: 1fr;
        border-top: solid $primary-lighten-2;
    }
    """

    servers: dict[str, McpServerJson]
    grants: dict[str, list[McpGrantJson]]

    def compose(self) -> ComposeResult:
        self.servers, self.grants = {}, {}
        yield Static(Text("Reading the MCP servers…", style="dim"), id="mcp-summary")
        yield DataTable(id="mcp-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="mcp-scroll"):
            yield Static(id="mcp-detail")

    def update_from(self, snapshot: Snapshot) -> None:
        if self.display:
            self.fetch()

    def on_show(self, event: Show) -> None:
        self.fetch()

    @work(exclusive=True, group="mcp")
    async def fetch(self) -> None:
        api = self.console.api
        top = self.query_one("#mcp-summary", Static)
        try:
            servers = await api.call(routes.MCP_SERVERS)
            grants = {
                s["name"]: await api.call(routes.MCP_GRANTS, query={"server": s["name"]})
                for s in servers
            }
        except AdminError as exc:
            if refused(exc):
                top.update(Text(NOT_YOURS, style="dim"))
            else:
                why = said(exc, api.base_url + routes.MCP_SERVERS.path)
                top.update(Text(f"Cannot read the MCP servers: {why}", style="red"))
            return
        self.show(servers, grants)

    def show(self, servers: list[McpServerJson], grants: dict[str, list[McpGrantJson]]) -> None:
        now = time.time()
        self.servers, self.grants = {s["name"]: s for s in servers}, grants
        out = sum(1 for s in servers if s["enabled"] and not s["up"])
        summary = f"{len(servers)} server{'' if len(servers) == 1 else 's'}"
        if out:
            summary += f" · {out} out (their breaker is open)"
        self.query_one("#mcp-summary", Static).update(Text(summary, style="bold"))
        rows = {s["name"]: server_row(s, now) for s in servers}
        fill(self.query_one(DataTable), COLUMNS, rows)
        self.show_detail()

    def show_detail(self) -> None:
        name = highlighted(self.query_one(DataTable))
        server = self.servers.get(name) if name else None
        grants = self.grants.get(name) if name else None
        self.query_one("#mcp-detail", Static).update(server_text(server, grants))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail()
