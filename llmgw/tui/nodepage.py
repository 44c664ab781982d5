"""A node's page: its cards with memory and utilisation, its shards, its disks, and a
log followed live (the agent's by default, or a shard's). Pushed over the console's
frame from the Nodes pane; Escape goes back and stops the follow."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar
from urllib.parse import quote, urlencode

import aiohttp
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Log, Static

from llmgw.client.admin import AdminError
from llmgw.tui.api import ConsoleApi
from llmgw.tui.base import DASH, bar, fill, gib
from llmgw.tui.nodes import cards_summary, memory_used, node_detail, node_state
from llmgw.tui.replicas import compute

CARD_COLUMNS = ("#", "CARD", "MEMORY GiB", "MEMORY", "WORK")
SHARD_COLUMNS = ("SHARD", "STATE", "MODEL", "PORT", "PID", "CARDS", "COMPUTE")
DISK_COLUMNS = ("PATH", "FREE GiB", "TOTAL GiB", "USED", "")
LOG_LINES = 200
# Past the node's keep-alive (an empty batch every 20 s), a quiet stream is a lost one.
STREAM_QUIET_SECONDS = 45.0
RECONNECT_SECONDS = 2.0


class LogStreamError(RuntimeError):
    """The followed log could not be opened, or the node said it has no such log."""


async def follow_log(api: ConsoleApi, path: str) -> AsyncIterator[list[str]]:
    """Batches of lines from a followed log (newline-delimited JSON lists), as the
    control plane sends them. Async so that closing the page closes the connection."""
    client = api.client
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=STREAM_QUIET_SECONDS)
    headers = {"authorization": f"Bearer {client.token}"}
    async with (
        aiohttp.ClientSession(timeout=timeout, read_bufsize=2**20) as session,
        session.get(client.base_url + path, headers=headers) as resp,
    ):
        if resp.status != 200:
            try:
                message = (await resp.json())["error"]["message"]
            except (ValueError, KeyError, TypeError, aiohttp.ContentTypeError):
                message = f"HTTP {resp.status}"
            raise LogStreamError(message)
        async for line in resp.content:
            if not line.strip():
                continue
            batch = json.loads(line)
            if isinstance(batch, dict):
                raise LogStreamError(str(batch.get("error") or batch))
            yield [str(x) for x in batch]


def card_row(card: dict[str, Any]) -> tuple[str, ...]:
    total, used = card.get("memory_total"), card.get("memory_used")
    util = card.get("utilization")
    return (
        str(card.get("index", DASH)),
        str(card.get("name") or DASH),
        f"{gib(used)} / {gib(total)}",
        bar(used, total),
        bar(util, 100.0) if util is not None else DASH,
    )


def shard_row(r: dict[str, Any]) -> tuple[str, ...]:
    return (
        r["replica_id"],
        r.get("state") or DASH,
        r.get("model") or "(by hand)",
        str(r.get("port") or DASH),
        str(r.get("pid") or DASH),
        ",".join(str(c)[:12] for c in r.get("cards") or []) or DASH,
        compute(r),
    )


def disk_row(d: dict[str, Any]) -> tuple[str, ...]:
    total, free = d.get("total"), d.get("free")
    used = total - free if isinstance(total, int) and isinstance(free, int) else None
    return (
        str(d.get("path") or DASH),
        gib(free),
        gib(total),
        bar(used, total, 6),
        "shared" if d.get("shared") else "",
    )


def summary(n: dict[str, Any]) -> str:
    cpu = n.get("cpu_percent")
    parts = [
        node_state(n),
        f"CPU {bar(cpu, 100.0, 8) if cpu is not None else DASH}",
        f"RAM {bar(memory_used(n), n.get('memory_total'), 8)} of {gib(n.get('memory_total'))} GiB",
        cards_summary(n.get("gpus") or []),
    ]
    if n.get("memory_read_gbs"):
        parts.append(f"reads {n['memory_read_gbs']:.0f} GB/s")
    engines = n.get("engines")
    parts.append("engines " + (", ".join(e["name"] for e in engines) if engines else DASH))
    return " · ".join(parts)


class NodePage(Screen[None]):
    DEFAULT_CSS = """
    NodePage #node-title {
        dock: top;
        height: 1;
        background: $primary;
        color: $text;
        padding: 0 1;
    }
    NodePage #node-summary {
        height: auto;
        max-height: 8;
        padding: 0 1;
    }
    NodePage #node-top {
        height: auto;
        max-height: 12;
    }
    NodePage DataTable {
        height: auto;
        max-height: 12;
        border: round $primary;
    }
    NodePage #node-cards {
        width: 3fr;
    }
    NodePage #node-disks {
        width: 2fr;
    }
    NodePage #node-shards {
        max-height: 8;
    }
    NodePage #node-log {
        height: 1fr;
        min-height: 6;
        border: round $primary;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("l", "shard_log", "Shard's log"),
        Binding("a", "agent_log", "Agent log"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(
        self,
        api: ConsoleApi,
        node_id: str,
        refresh: float = 2.0,
    ) -> None:
        super().__init__()
        self.api = api
        self.node_id = node_id
        self.refresh_seconds = refresh
        self.node: dict[str, Any] = {}
        self.source = "agent"

    def compose(self) -> ComposeResult:
        yield Static(f"llmgw · {self.api.base_url} · node {self.node_id}", id="node-title")
        yield Static(id="node-summary")
        with Horizontal(id="node-top"):
            yield DataTable(id="node-cards", cursor_type="none", zebra_stripes=True)
            yield DataTable(id="node-disks", cursor_type="none", zebra_stripes=True)
        yield DataTable(id="node-shards", cursor_type="row", zebra_stripes=True)
        yield Log(id="node-log", max_lines=5000)
        yield Footer()

    def on_mount(self) -> None:
        for widget_id, title in (
            ("#node-cards", "Cards"),
            ("#node-disks", "Disks"),
            ("#node-shards", "Shards (l: its log)"),
        ):
            self.query_one(widget_id).border_title = title
        self.query_one("#node-shards").focus()
        self.set_interval(self.refresh_seconds, self.fetch)
        self.fetch()
        self.follow()

    def action_back(self) -> None:
        self.workers.cancel_node(self)
        self.app.pop_screen()

    def action_shard_log(self) -> None:
        table = self.query_one("#node-shards", DataTable)
        if not table.row_count:
            self.notify("No shard on this node.")
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if key is not None:
            self.switch_log(str(key))

    def action_agent_log(self) -> None:
        self.switch_log("agent")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "node-shards" and event.row_key.value is not None:
            self.switch_log(str(event.row_key.value))

    def switch_log(self, source: str) -> None:
        if source != self.source:
            self.source = source
            self.follow()

    @work(exclusive=True, group="node-fetch")
    async def fetch(self) -> None:
        node_path = f"/api/v1/nodes/{quote(self.node_id, safe='')}"
        try:
            node, replicas = await asyncio.gather(
                self.api.get(node_path), self.api.get("/api/v1/replicas")
            )
        except AdminError as exc:
            self.query_one("#node-summary", Static).update(f"Cannot read the node: {exc}")
            return
        self.show(node, [r for r in replicas if r.get("node") == self.node_id])

    def show(self, node: dict[str, Any], shards: list[dict[str, Any]]) -> None:
        self.node = node
        text = Text(summary(node) + "\n")
        text.append_text(node_detail(node, hint=False))
        self.query_one("#node-summary", Static).update(text)
        cards = node.get("gpus") or []
        fill(
            self.query_one("#node-cards", DataTable),
            CARD_COLUMNS,
            {str(c.get("uuid") or c.get("index")): card_row(c) for c in cards},
        )
        self.query_one("#node-cards").border_title = (
            f"Cards ({len(cards)})" if cards else "Cards: none (CPU only)"
        )
        fill(
            self.query_one("#node-disks", DataTable),
            DISK_COLUMNS,
            {str(d.get("path")): disk_row(d) for d in node.get("disks") or []},
        )
        fill(
            self.query_one("#node-shards", DataTable),
            SHARD_COLUMNS,
            {r["replica_id"]: shard_row(r) for r in shards},
        )

    @work(exclusive=True, group="node-log")
    async def follow(self) -> None:
        """Follow ``self.source``'s log; on a lost stream, say so and open it again."""
        log = self.query_one("#node-log", Log)
        source = self.source
        query = urlencode({"source": source, "n": LOG_LINES, "follow": 1})
        path = f"/api/v1/nodes/{quote(self.node_id, safe='')}/logs?{query}"
        name = "agent" if source == "agent" else f"shard {source}"
        while True:
            log.clear()
            log.border_title = f"Log: {name} (following; a: agent, l: shard)"
            try:
                async for batch in follow_log(self.api, path):
                    if batch:
                        log.write_lines(batch)
                problem = "the stream ended"
            except LogStreamError as exc:
                problem = str(exc)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                problem = str(exc) or type(exc).__name__
            log.border_title = f"Log: {name} (not following: {problem})"
            await asyncio.sleep(RECONNECT_SECONDS)
