"""A node's page: its cards with memory and utilisation, the last hour of each card's
figures as sparklines, its shards, its disks, and a log followed live (the agent's by
default, or a shard's). Pushed over the console's frame from the Nodes pane; Escape goes
back and stops the follow."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import ClassVar
from urllib.parse import quote, urlencode

import aiohttp
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Log, Static

from llmgw.client.adminbase import AdminError
from llmgw.tui.api import ConsoleApi
from llmgw.tui.base import DASH, bar, fill, gib
from llmgw.tui.nodes import cards_summary, memory_used, node_detail, node_state
from llmgw.tui.replicas import compute
from llmgw.wire.admin import (
    CardHistoryJson,
    CardJson,
    DiskJson,
    EnginesJson,
    HistoryJson,
    NodeJson,
    ReplicaJson,
    TopologyJson,
)

CARD_COLUMNS = ("#", "CARD", "MEMORY GiB", "MEMORY", "BUSY", "TEMP", "POWER", "PCIe", "WIRING")
SHARD_COLUMNS = ("SHARD", "STATE", "MODEL", "PORT", "PID", "CARDS", "COMPUTE")
DISK_COLUMNS = ("PATH", "FREE GiB", "TOTAL GiB", "USED", "")
LOG_LINES = 200
# Past the node's keep-alive (an empty batch every 20 s), a quiet stream is a lost one.
STREAM_QUIET_SECONDS = 45.0
RECONNECT_SECONDS = 2.0
# The history: how far back, and how often it is read again (the control plane keeps a
# point per 10 s).
HISTORY_MINUTES = 60
HISTORY_SECONDS = 10.0
SPARKS = "▁▂▃▄▅▆▇█"
GAP = " "
NO_HISTORY = "no history from this control plane"
# A figure's history: (label, points oldest first, top of its scale, latest as text).
Figure = tuple[str, list[float | None], float, str]
CARD_LABELS = ("busy", "mem", "power", "temp")


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


def _link(card: CardJson) -> str:
    gen, width = card.get("pcie_gen"), card.get("pcie_width")
    if gen is None or width is None:
        return DASH
    link = f"Gen{gen} x{width}"
    if card.get("pcie_width_max") and width < card["pcie_width_max"]:
        link += f" of x{card['pcie_width_max']} !"
    return link


def wiring(card: CardJson, topology: TopologyJson | None) -> str:
    """A card's NUMA node and NVLink peers from ``nvidia-smi topo -m``, when read."""
    cards = (topology.get("cards") or []) if topology else []
    row = next((c for c in cards if c.get("index") == card.get("index")), None)
    if row is None:
        return DASH
    peers = sorted(
        (int(p) for p, link in (row.get("gpus") or {}).items() if str(link).startswith("NV")),
    )
    parts = [f"NUMA {row['numa_node']}" if row.get("numa_node") is not None else ""]
    if peers:
        parts.append("NVLink " + ",".join(map(str, peers)))
    return " · ".join(p for p in parts if p) or DASH


def card_row(card: CardJson, topology: TopologyJson | None = None) -> tuple[str, ...]:
    total, used = card.get("memory_total"), card.get("memory_used")
    util = card.get("utilization")
    temp, power, limit = card.get("temperature"), card.get("power"), card.get("power_limit")
    name = str(card.get("mig_class") or card.get("name") or DASH)
    return (
        str(card.get("index", DASH)),
        name,
        f"{gib(used)} / {gib(total)}",
        bar(used, total),
        bar(util, 100.0) if util is not None else DASH,
        f"{temp} C" if temp is not None else DASH,
        (f"{power:.0f}" + (f"/{limit:.0f} W" if limit else " W")) if power is not None else DASH,
        _link(card),
        wiring(card, topology),
    )


def shard_row(r: ReplicaJson) -> tuple[str, ...]:
    return (
        r["replica_id"],
        r.get("state") or DASH,
        r.get("model") or "(by hand)",
        str(r.get("port") or DASH),
        str(r.get("pid") or DASH),
        ",".join(str(c)[:12] for c in r.get("cards") or []) or DASH,
        compute(r),
    )


def disk_row(d: DiskJson) -> tuple[str, ...]:
    total, free = d.get("total"), d.get("free")
    used = total - free if isinstance(total, int) and isinstance(free, int) else None
    return (
        str(d.get("path") or DASH),
        gib(free),
        gib(total),
        bar(used, total, 6),
        "shared" if d.get("shared") else "",
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def sparkline(values: Sequence[float | None], top: float, width: int) -> str:
    """``values`` (oldest first) drawn in ``width`` cells scaled 0..``top``: each cell the
    mean of the points it covers, and a gap (a space) where none was read, so a silence
    or a figure not read never looks like 0 (which is the lowest block)."""
    if not values or width <= 0:
        return GAP * max(0, width)
    count = len(values)
    cells = []
    for i in range(width):
        start = i * count // width
        end = max(start + 1, (i + 1) * count // width)
        read = [v for v in values[start:end] if v is not None]
        if not read:
            cells.append(GAP)
            continue
        share = max(0.0, min(1.0, sum(read) / len(read) / top)) if top > 0 else 0.0
        cells.append(SPARKS[round(share * (len(SPARKS) - 1))])
    return "".join(cells)


def _latest(values: Sequence[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def _points(values: object) -> list[float | None]:
    return [_number(v) for v in values] if isinstance(values, list) else []


def card_figures(card: CardHistoryJson, now: CardJson | None) -> list[Figure]:
    """A card's figures (busy, memory, power, temperature), only those with at least
    one point. ``now`` is the card as the node reads it now,
    for its power limit."""
    out: list[Figure] = []
    busy = _points(card.get("utilization"))
    if (last := _latest(busy)) is not None:
        out.append(("busy", busy, 100.0, f"{last:.0f}%"))
    used = _points(card.get("memory_used"))
    totals = [t for t in _points(card.get("memory_total")) if t]
    if (last := _latest(used)) is not None:
        top = max(totals) if totals else max(v for v in used if v is not None)
        out.append(("mem", used, top, f"{last / top * 100:.0f}%" if top else gib(last)))
    power = _points(card.get("power"))
    if (last := _latest(power)) is not None:
        limit = _number(now.get("power_limit")) if now else None
        top = limit or max(v for v in power if v is not None)
        out.append(("power", power, top, f"{last:.0f}W"))
    temperature = _points(card.get("temperature"))
    if (last := _latest(temperature)) is not None:
        top = max(100.0, *(v for v in temperature if v is not None))
        out.append(("temp", temperature, top, f"{last:.0f}°C"))
    return out


def node_figures(history: HistoryJson) -> list[Figure]:
    out: list[Figure] = []
    cpu = _points(history.get("cpu_percent"))
    if (last := _latest(cpu)) is not None:
        out.append(("cpu", cpu, 100.0, f"{last:.0f}%"))
    used = _points(history.get("memory_used"))
    totals = [t for t in _points(history.get("memory_total")) if t]
    if (last := _latest(used)) is not None and totals:
        out.append(("ram", used, max(totals), f"{last / max(totals) * 100:.0f}%"))
    return out


def history_text(history: HistoryJson, cards_now: list[CardJson], width: int) -> Text:
    """One line for the node (CPU, RAM) and one per card (busy, memory, power,
    temperature), each figure a sparkline of the window and its latest value. A figure
    no card read is left out; one that only some cards read is a blank on the others,
    so the columns line up."""
    now_by_uuid = {c.get("uuid"): c for c in cards_now}
    lines: list[tuple[str, list[Figure]]] = [("node", node_figures(history))]
    for card in history.get("gpus") or []:
        index = card.get("index")
        lines.append(
            (
                str(index if index is not None else DASH),
                card_figures(card, now_by_uuid.get(card.get("uuid"))),
            )
        )
    card_labels = [
        label for label in CARD_LABELS if any(f[0] == label for _, fs in lines[1:] for f in fs)
    ]
    prefix = max(len(name) for name, _ in lines) + 1
    most = max(1, len(card_labels), len(lines[0][1]))
    # Per figure: label (5), a space, the sparkline, a space, the value (5), two spaces.
    spark = max(4, (width - prefix) // most - 14)
    text = Text()
    for i, (name, figures) in enumerate(lines):
        if i:
            text.append("\n")
        text.append(f"{name:<{prefix}}", style="bold")
        if not figures:
            text.append("no points in this window", style="dim")
            continue
        by_label = {f[0]: f for f in figures}
        for label in card_labels if i else list(by_label):
            if label not in by_label:
                text.append(" " * (spark + 14))
                continue
            _, points, top, last = by_label[label]
            text.append(f"{label:<5} ", style="dim")
            text.append(sparkline(points, top, spark), style="cyan")
            text.append(f" {last:>5}  ")
    text.rstrip()
    return text


def stale_note(n: NodeJson, name: str) -> str | None:
    """ "not live, read 40 s ago" when the node's figure ``name`` ("gpus", "disks") is
    the last one read, not the figure of now (older than 30 s, or its tool is not
    answering); None when it is live."""
    if name not in (n.get("stale_figures") or []):
        return None
    age = (n.get("figure_ages") or {}).get(name)
    return "not live, read " + ("at an unknown time" if age is None else f"{age:.0f} s ago")


def summary(n: NodeJson) -> str:
    cpu = n.get("cpu_percent")
    cpu_note = stale_note(n, "cpu_percent")
    ram_note = stale_note(n, "memory_available")
    parts = [
        node_state(n),
        f"CPU {bar(cpu, 100.0, 8) if cpu is not None else DASH}"
        + (f" ({cpu_note})" if cpu_note else ""),
        f"RAM {bar(memory_used(n), n.get('memory_total'), 8)} of {gib(n.get('memory_total'))} GiB"
        + (f" ({ram_note})" if ram_note else ""),
        cards_summary(n.get("gpus") or []),
    ]
    if n.get("memory_read_gbs"):
        parts.append(f"reads {n['memory_read_gbs']:.0f} GB/s")
    engines = n.get("engines")
    parts.append("engines " + (", ".join(e["name"] for e in engines) if engines else DASH))
    return " · ".join(parts)


def settings_line(n: NodeJson) -> str | None:
    """The settings the node's agent runs with that are not llmgw's defaults, each with
    where it came from (file, node, cluster), and the cluster's version it took; None
    from an agent that does not say."""
    reported = n.get("settings")
    if not isinstance(reported, dict):
        return None
    values = reported.get("values") or {}
    said = [
        f"{key}={json.dumps(v.get('value'))} ({v.get('source')})"
        for key, v in sorted(values.items())
        if isinstance(v, dict) and v.get("source") != "default"
    ]
    line = f"settings v{reported.get('version', 0)}: " + ("; ".join(said) or "llmgw's defaults")
    if reported.get("problem"):
        line += f" · {reported['problem']}"
    return line


def engines_line(node_id: str, fleet: EnginesJson | None) -> str | None:
    """The engines the fleet wants against what this node has, each with the node's
    words while it is not there (installing, failed, or why it stands apart)."""
    if not isinstance(fleet, dict):
        return None
    said = []
    for row in fleet.get("nodes") or []:
        if row.get("node") != node_id:
            continue
        has = ", ".join(row.get("versions") or []) or "none"
        part = f"{row['engine']} {row['wanted']}: {row['state']} (has {has})"
        if row.get("message") and row.get("state") != "ready":
            part += f" {row['message']}"
        said.append(part)
    if not said:
        return None
    return "engines the fleet wants: " + " · ".join(said)


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
    NodePage #node-history {
        height: auto;
        max-height: 20;
        border: round $primary;
        padding: 0 1;
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
        self.node: NodeJson | None = None
        self.source = "agent"
        # The last answer of the history route; None before it, or when there is none.
        self.history: HistoryJson | None = None

    def compose(self) -> ComposeResult:
        yield Static(f"llmgw · {self.api.base_url} · node {self.node_id}", id="node-title")
        yield Static(id="node-summary")
        with Horizontal(id="node-top"):
            yield DataTable(id="node-cards", cursor_type="none", zebra_stripes=True)
            yield DataTable(id="node-disks", cursor_type="none", zebra_stripes=True)
        yield Static("reading the history…", id="node-history")
        yield DataTable(id="node-shards", cursor_type="row", zebra_stripes=True)
        yield Log(id="node-log", max_lines=5000)
        yield Footer()

    def on_mount(self) -> None:
        for widget_id, title in (
            ("#node-cards", "Cards"),
            ("#node-disks", "Disks"),
            ("#node-shards", "Shards (l: its log)"),
            ("#node-history", f"Last {HISTORY_MINUTES} min"),
        ):
            self.query_one(widget_id).border_title = title
        self.query_one("#node-shards").focus()
        self.set_interval(self.refresh_seconds, self.fetch)
        self.set_interval(max(self.refresh_seconds, HISTORY_SECONDS), self.fetch_history)
        self.fetch()
        self.fetch_history()
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
        try:
            node, replicas = await asyncio.gather(self.api.node(self.node_id), self.api.replicas())
        except AdminError as exc:
            self.query_one("#node-summary", Static).update(f"Cannot read the node: {exc}")
            return
        fleet: EnginesJson | None
        try:
            fleet = await self.api.engines()
        except AdminError:
            fleet = None  # a control plane that does not say: the line is left out
        self.show(node, [r for r in replicas if r.get("node") == self.node_id], fleet)

    def show(
        self,
        node: NodeJson,
        shards: list[ReplicaJson],
        fleet: EnginesJson | None = None,
    ) -> None:
        self.node = node
        text = Text(summary(node) + "\n")
        settings = settings_line(node)
        if settings:
            text.append(settings + "\n")
        engines = engines_line(str(node.get("id")), fleet)
        if engines:
            text.append(engines + "\n")
        text.append_text(node_detail(node, hint=False))
        self.query_one("#node-summary", Static).update(text)
        cards = node.get("gpus") or []
        fill(
            self.query_one("#node-cards", DataTable),
            CARD_COLUMNS,
            {
                str(c.get("uuid") or c.get("index")): card_row(c, node.get("topology"))
                for c in cards
            },
        )
        cards_note = stale_note(node, "gpus")
        self.query_one("#node-cards").border_title = (
            f"Cards ({len(cards)})" if cards else "Cards: none (CPU only)"
        ) + (f": {cards_note}" if cards_note else "")
        disks_note = stale_note(node, "disks")
        self.query_one("#node-disks").border_title = "Disks" + (
            f": {disks_note}" if disks_note else ""
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

    @work(exclusive=True, group="node-history")
    async def fetch_history(self) -> None:
        panel = self.query_one("#node-history", Static)
        try:
            history = await self.api.history(self.node_id, HISTORY_MINUTES)
        except AdminError as exc:
            panel.update(f"Cannot read the history: {exc}")
            return
        self.history = history
        if history is None:
            panel.border_title = f"Last {HISTORY_MINUTES} min"
            panel.update(Text(NO_HISTORY, style="dim"))
            return
        self.show_history()

    def show_history(self) -> None:
        if self.history is None:
            return
        panel = self.query_one("#node-history", Static)
        step = self.history.get("step_seconds")
        panel.border_title = f"Last {HISTORY_MINUTES} min" + (
            f" (a point per {step} s; blank: not read)" if step else ""
        )
        # Less the border and padding; before the first layout, the screen's width.
        width = panel.content_size.width or self.size.width - 4
        cards = (self.node.get("gpus") or []) if self.node else []
        panel.update(history_text(self.history, cards, width))

    def on_resize(self, event: Resize) -> None:
        self.show_history()

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
