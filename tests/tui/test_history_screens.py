"""The last hour on the console: a node page's sparklines from the control plane's
history (gaps drawn as gaps, an older control plane without the route said so), and the
GPU map coloured by each figure, with "not read" never drawn as cold."""

from __future__ import annotations

import copy
import http.server
import re
import threading
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest
from rich.text import Text
from textual.widgets import Static

from llmgw.client.admin import AdminClient
from llmgw.client.adminbase import AdminError
from llmgw.server.fleet.history import FleetHistory
from llmgw.tui.api import ConsoleApi, Snapshot
from llmgw.tui.app import ConsoleApp
from llmgw.tui.gpumap import (
    MODES,
    POWER_SHADES,
    SHADES,
    TEMPERATURE_SHADES,
    UNKNOWN,
    card_share,
    shade,
)
from llmgw.tui.nodepage import GAP, NO_HISTORY, SPARKS, NodePage, history_text, sparkline
from llmgw.wire.hardware import GPU
from llmgw.wire.messages import from_map
from tests.tui import fleet
from tests.tui.fleet import FleetApi
from tests.tui.test_node_screens import colours, open_node, until

NOW = 1_700_000_000.0
GiB = 2**30


def recorded_history(node: dict[str, Any]) -> dict[str, Any]:
    """An hour of a recorded node's heartbeats, kept by the control plane's own history:
    every 5 s, but silent from 40 to 30 minutes ago; card 1's power is never read."""
    history = FleetHistory()
    for k in range(720):
        at = NOW - 3600 + 5 + k * 5
        if NOW - 2400 <= at < NOW - 1800:
            continue
        gpus = []
        for c, card in enumerate(node["gpus"]):
            figures = {
                **card,
                "utilization": (k + c * 10) % 100,
                "power": None if c == 1 else 100.0 + k % 500,
                "temperature": 40 + k % 40,
            }
            gpus.append(from_map(GPU, figures))
        history.record(node["id"], at, 30.0, node["memory_total"], node["memory_available"], gpus)
    series = history.series(node["id"], now=NOW)
    assert series is not None
    return series


class HistoryApi(FleetApi):
    """The recorded fleet, with a history route; ``missing``: the route answers 404 as an
    older control plane's does."""

    def __init__(self, recorded: Snapshot | None = None, missing: bool = False) -> None:
        super().__init__(recorded)
        self.missing = missing
        self.asked: list[str] = []

    async def get(self, path: str) -> Any:
        head, _, query = path.partition("?")
        if head.endswith("/history"):
            self.asked.append(path)
            node_id = head.removeprefix("/api/v1/nodes/").removesuffix("/history")
            if self.missing:
                url = self.base_url + path
                cause = urllib.error.HTTPError(url, 404, "Not Found", None, None)  # type: ignore[arg-type]
                raise AdminError(f"{url}: HTTP 404") from cause
            for n in self.recorded.nodes:
                if n["id"] == node_id:
                    return copy.deepcopy(recorded_history(n))
        return await super().get(path)


def test_a_sparkline_draws_gaps_as_gaps_and_zero_as_the_lowest_block() -> None:
    assert sparkline([0, None, 50, 100], 100, 4) == SPARKS[0] + GAP + SPARKS[4] + SPARKS[-1]
    assert sparkline([None] * 10, 100, 5) == GAP * 5
    assert sparkline([], 100, 3) == GAP * 3
    # 360 points into 12 cells: each cell the mean of 30; only the empty ones are gaps.
    points: list[float | None] = [100.0] * 180 + [None] * 60 + [0.0] * 120
    line = sparkline(points, 100, 12)
    assert line == SPARKS[-1] * 6 + GAP * 2 + SPARKS[0] * 4
    # Fewer points than cells: stretched, still gaps where not read.
    assert sparkline([100, None], 100, 4) == SPARKS[-1] * 2 + GAP * 2


def test_history_text_has_a_line_per_card_and_only_figures_with_points() -> None:
    node = fleet.node(2)
    text = history_text(recorded_history(node), node["gpus"], 110).plain
    lines = text.splitlines()
    assert len(lines) == 1 + 8
    assert lines[0].startswith("node") and "cpu" in lines[0] and "ram" in lines[0]
    assert all(line[0].isdigit() for line in lines[1:])
    assert all(len(line) <= 110 for line in lines)
    for c, line in enumerate(lines[1:]):
        assert line.startswith(str(c))
        assert "busy" in line and "mem" in line and "temp" in line
        # Card 1's power was never read: no power line for it, not a line of zeros.
        assert ("power" in line) == (c != 1)


async def test_node_page_draws_each_cards_last_hour() -> None:
    api = HistoryApi()
    app = ConsoleApp(api, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        page = await open_node(app, pilot, "gpu-012")
        panel = page.query_one("#node-history", Static)
        await until(pilot, lambda: "busy" in str(panel.render()), "the history")
        assert api.asked == ["/api/v1/nodes/gpu-012/history?minutes=60"]
        assert "Last 60 min" in str(panel.border_title)
        lines = str(panel.render()).splitlines()
        assert len(lines) == 9
        # The node's 10 silent minutes are a gap in every card's busy line.
        for line in lines[1:]:
            found = re.search(f"busy +([{SPARKS}{GAP}]+) +\\d+% ", line)
            assert found, line
            spark = found.group(1).strip()
            assert len(spark) > 8 and GAP in spark, line
        assert panel.region.height >= 9 + 2
        await pilot.press("escape")


async def test_node_page_says_an_older_control_plane_has_no_history() -> None:
    app = ConsoleApp(HistoryApi(missing=True), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        page = await open_node(app, pilot, "gpu-012")
        panel = page.query_one("#node-history", Static)
        await until(pilot, lambda: NO_HISTORY in str(panel.render()), "the missing history")
        # The rest of the page goes on.
        assert "Ready" in str(page.query_one("#node-summary", Static).render())
        assert isinstance(app.screen, NodePage)


class _Answers(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/api/v1/nodes/old/"):
            self.send_response(404)
            self.end_headers()
            return
        if self.path.startswith("/api/v1/nodes/broken/"):
            self.send_response(500)
            self.end_headers()
            return
        body = b'{"node": "a", "t": [], "gpus": []}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_the_history_call_maps_404_to_none(server: str) -> None:
    api = ConsoleApi(AdminClient(server, "t"))
    assert await api.history("a") == {"node": "a", "t": [], "gpus": []}
    assert await api.history("old", 60) is None
    with pytest.raises(AdminError):
        await api.history("broken", 60)


# --- the GPU map by figure ---------------------------------------------------------


def vitals_fleet() -> Snapshot:
    """Node 0: SM active read on every card; node 1: not, so work is busy; node 2: no
    figure read at all on card 0 (the rest as node 1)."""
    recorded = fleet.snapshot()
    recorded.nodes = [fleet.node(i) for i in range(3)]
    for i, n in enumerate(recorded.nodes):
        for c, card in enumerate(n["gpus"]):
            card["temperature"] = 30 + c * 10
            card["power"] = 100.0 * (c + 1)
            card["power_limit"] = 700.0
            if i == 0:
                card["sm_active"] = 0.9
    blank = recorded.nodes[2]["gpus"][0]
    for key in ("utilization", "memory_used", "temperature", "power"):
        blank.pop(key)
    return recorded


def map_text(app: ConsoleApp) -> Text:
    text = app.query_one("#gpumap-body", Static).content
    assert isinstance(text, Text)
    return text


async def test_gpu_map_by_each_figure_with_not_read_apart() -> None:
    recorded = vitals_fleet()
    app = ConsoleApp(FleetApi(recorded), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        await pilot.press("5")
        await pilot.pause()
        app.query_one("#gpumap-scroll").focus()
        cards = [c for n in recorded.nodes for c in n["gpus"]]

        text = map_text(app)
        assert "Coloured by work (SM active on 8 cards, busy on 15)" in text.plain
        work = colours(text)[len(SHADES) + 1 :]
        assert work[:8] == ["red"] * 8  # SM active 0.9, though node 0's busy is 0
        assert work[16] == UNKNOWN and "green" not in work[16:17]

        seen = ["work"]
        for _ in range(len(MODES)):
            await pilot.press("f")
            await pilot.pause()
            seen.append(app.query_one("GpuMapPane").mode)  # type: ignore[attr-defined]
            text = map_text(app)
            mode = seen[-1]
            shades = {"temperature": TEMPERATURE_SHADES, "power": POWER_SHADES}.get(mode, SHADES)
            drawn = colours(text)[len(shades) + 1 :]
            assert drawn == [shade(card_share(c, mode), shades) for c in cards]
            # The card that read nothing is "not read" by every figure, never cold.
            assert drawn[16] == UNKNOWN
            assert f"mean {mode}" in text.plain
        assert seen == ["work", "busy", "memory", "temperature", "power", "work"]

        await pilot.press("f", "f", "f")
        await pilot.pause()
        text = map_text(app)
        assert "Coloured by temperature" in text.plain and "≥85°C" in text.plain
        # 30..100 °C on 23 cards (one not read): not averaged in as 0.
        assert "mean temperature 67°C" in text.plain
        temps = colours(text)[len(TEMPERATURE_SHADES) + 1 :]
        # 30, 40 | 50, 60 | 70, 80 | 90, 100 °C
        assert temps[:8] == [c for c in ("green", "yellow", "dark_orange", "red") for _ in "12"]
        await pilot.press("f")
        await pilot.pause()
        text = map_text(app)
        assert "Coloured by power of its limit" in text.plain
        assert colours(text)[len(POWER_SHADES) + 1 :][:2] == ["green", "yellow"]
        # m from any figure goes to memory, and from memory back to work.
        await pilot.press("m")
        await pilot.pause()
        assert "mean memory" in map_text(app).plain
        await pilot.press("m")
        await pilot.pause()
        assert "Coloured by work" in map_text(app).plain


async def test_gpu_map_work_says_when_busy_stands_in() -> None:
    app = ConsoleApp(FleetApi(), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        await pilot.press("5")
        await pilot.pause()
        text = map_text(app)
        assert "Coloured by work (busy: SM active not read)" in text.plain
        # The recorded fleet reads no temperature: every card "not read", none green.
        app.query_one("#gpumap-scroll").focus()
        await pilot.press("f", "f", "f")
        await pilot.pause()
        text = map_text(app)
        assert "mean temperature not read" in text.plain
        assert set(colours(text)[len(TEMPERATURE_SHADES) + 1 :]) == {UNKNOWN}
