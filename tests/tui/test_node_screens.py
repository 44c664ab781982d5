"""The Nodes pane, a node's page, the GPU map and the Overview, driven by Pilot: the node
page against a real control plane and agent (its log followed live), the fleet-wide
screens against a recorded fleet of 40 nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import DataTable, Log, Static

from llmgw.client.admin import AdminClient
from llmgw.tui.api import ConsoleApi
from llmgw.tui.app import ConsoleApp
from llmgw.tui.gpumap import SHADES, UNKNOWN, card_share, node_block, shade
from llmgw.tui.nodepage import NodePage, stale_note, summary
from llmgw.wire.admin import NodeJson
from tests.e2e.catalog import scheduled, serve_tiny
from tests.e2e.cluster import Cluster, free_port
from tests.tui import fleet
from tests.tui.fleet import FleetApi


@pytest.fixture
def cluster(tmp_path: Path, binary: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        serve_tiny(c, binary, "a")
        yield c
    finally:
        c.stop()


def cells(table: DataTable[object]) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def plain(widget: Static) -> str:
    return str(widget.render())


async def until(pilot: Pilot[None], check: object, what: str, seconds: float = 10) -> None:
    assert callable(check)
    for _ in range(int(seconds / 0.1)):
        if check():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def open_node(app: ConsoleApp, pilot: Pilot[None], node_id: str) -> NodePage:
    await until(pilot, lambda: app.snapshot.nodes, "the first snapshot")
    await pilot.press("2")
    table = app.query_one("#nodes-table", DataTable)
    table.focus()
    table.move_cursor(row=table.get_row_index(node_id))
    await pilot.press("enter")
    await pilot.pause()
    assert isinstance(app.screen, NodePage)
    return app.screen


# --- against a real control plane and agent ----------------------------------------


@pytest.mark.e2e
async def test_node_page_shows_the_node_and_follows_its_log(
    cluster: Cluster, tmp_path: Path
) -> None:
    client = AdminClient(f"http://{cluster.listen}", cluster.admin_token)
    app = ConsoleApp(ConsoleApi(client), refresh=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the first snapshot")
        await pilot.press("2")
        detail = app.query_one("#nodes-detail", Static)
        await until(pilot, lambda: "Enter opens" in plain(detail), "the node's detail line")
        assert plain(detail).startswith("a ")

        page = await open_node(app, pilot, "a")
        shards = page.query_one("#node-shards", DataTable)
        disks = page.query_one("#node-disks", DataTable)
        cards = page.query_one("#node-cards", DataTable)
        await until(pilot, lambda: shards.row_count and disks.row_count, "shards and disks")
        (shard,) = cells(shards)
        replica_id = shard[0]
        assert shard[1:3] == ["ready", "tiny"]
        assert shard[3].isdigit() and shard[4].isdigit()
        assert all(row[1] != "-" and row[2] != "-" for row in cells(disks))
        # A CPU-only test machine has no cards; the page says so rather than leaving a blank.
        title = str(cards.border_title)
        assert title.startswith("Cards (") if cards.row_count else "none" in title
        assert "Ready" in plain(page.query_one("#node-summary", Static))

        log = page.query_one("#node-log", Log)
        await until(pilot, lambda: log.line_count > 0, "the agent's last lines")
        assert "agent" in str(log.border_title) and "following" in str(log.border_title)

        # A shard started by hand makes the agent log its states: new lines while followed.
        model = tmp_path / "tiny.gguf"
        body = {
            "replica_id": "by-hand",
            "engine": "llama.cpp",
            "source": str(model),
            "port": free_port(),
            "args": ["-c", "256"],
        }
        await app.api.post("/api/v1/nodes/a/shards", body)
        await until(
            pilot,
            lambda: any("shard by-hand:" in line for line in log.lines),
            "the agent's line about the new shard",
            seconds=30,
        )

        # l follows the highlighted shard's own log; a returns to the agent's.
        shards.focus()
        shards.move_cursor(row=shards.get_row_index(replica_id))
        await pilot.press("l")
        await until(pilot, lambda: replica_id in str(log.border_title), "the shard's log")
        await until(pilot, lambda: log.line_count > 0, "the shard's last lines")
        await pilot.press("a")
        await until(pilot, lambda: "Log: agent" in str(log.border_title), "the agent log again")

        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, NodePage)
        assert not [w for w in app.workers if w.node is page and w.is_running]
        await app.api.delete("/api/v1/nodes/a/shards/by-hand")
        await pilot.press("q")


# --- against the recorded fleet ----------------------------------------------------


def colours(text: Text) -> list[str]:
    """The colour of every card cell of the map, in order."""
    return [str(span.style) for span in text.spans if text.plain[span.start : span.end] == "■"]


async def test_gpu_map_colours_every_card_by_work_or_memory() -> None:
    app = ConsoleApp(FleetApi(), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        await pilot.press("5")
        await pilot.pause()
        body = app.query_one("#gpumap-body", Static)
        text = body.content
        assert isinstance(text, Text)
        assert "320 cards on 40 nodes" in text.plain
        assert "not read" in text.plain  # the legend
        # Several nodes share a line, so 40 nodes fit the panel's height or nearly.
        assert text.plain.count("gpu-0") == 40
        assert len(text.plain.splitlines()) < 25
        # 5 legend cells, then one per card in node order.
        work = colours(text)[len(SHADES) + 1 :]
        nodes = app.snapshot.nodes
        expected = [shade(card_share(c, "work")) for n in nodes for c in n["gpus"]]
        assert work == expected
        assert work[:8] == ["green"] * 8 and work[8:16] == ["red"] * 8
        assert {s[1] for s in SHADES} <= set(work)
        assert UNKNOWN not in work
        # The NotReady node's name is red.
        assert any(
            str(s.style) == "red" and text.plain[s.start : s.end].startswith("gpu-007")
            for s in text.spans
        )

        app.query_one("#gpumap-scroll").focus()
        await pilot.press("m")
        await pilot.pause()
        text = body.content
        assert isinstance(text, Text)
        assert text.plain.startswith("320 cards") and "mean memory" in text.plain
        memory = colours(text)[len(SHADES) + 1 :]
        assert memory == [shade(card_share(c, "memory")) for n in nodes for c in n["gpus"]]
        assert memory[:8] == ["red"] * 8 and memory[8:16] == ["green"] * 8
        await pilot.press("m")
        await pilot.pause()
        assert "mean work" in body.content.plain  # type: ignore[union-attr]


async def test_gpu_map_wraps_and_scrolls_for_hundreds_of_nodes() -> None:
    recorded = fleet.snapshot()
    recorded.nodes = [fleet.node(i) for i in range(400)]
    app = ConsoleApp(FleetApi(recorded), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        await pilot.press("5")
        await pilot.pause()
        text = app.query_one("#gpumap-body", Static).content
        assert isinstance(text, Text)
        lines = text.plain.splitlines()
        assert "3200 cards on 400 nodes" in lines[0]
        assert max(len(line) for line in lines) <= 120 - 22
        scroll = app.query_one("#gpumap-scroll")
        assert scroll.max_scroll_y > 0


async def test_overview_names_the_alerts() -> None:
    app = ConsoleApp(FleetApi(), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        body = plain(app.query_one("#overview-body", Static))
        assert body.startswith("Serving")
        assert "Nodes     39 Ready of 40 · 1 NotReady · 1 cordoned" in body
        assert "Cards     320 · busy" in body
        assert "Replicas  10: 9 ready · 1 failed" in body
        assert "Alerts (3)" in body
        assert "✗ node gpu-007 is NotReady: no heartbeat for 45 s" in body
        assert "⚠ node gpu-003: the NVIDIA driver is older" in body
        assert "(fix: install driver 550 or newer and restart the agent)" in body
        assert "✗ replica llama-70b-3 on gpu-012 failed: engine exited with code 1" in body


async def test_nodes_pane_shows_bars_cards_and_a_warning_with_its_fix() -> None:
    app = ConsoleApp(FleetApi(), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        await pilot.press("2")
        table = app.query_one("#nodes-table", DataTable)
        rows = {row[0]: row for row in cells(table)}
        assert len(rows) == 40
        assert rows["gpu-007"][1] == "NotReady"
        assert rows["gpu-005"][1] == "Ready,Cordoned"
        assert rows["gpu-003"][2].startswith("███") and rows["gpu-003"][2].endswith("51%")
        assert rows["gpu-003"][4] == "8 × NVIDIA H100 80GB HBM3"
        assert rows["gpu-003"][5] == "llama.cpp, vllm"
        assert rows["gpu-003"][6] == "1 ⚠" and rows["gpu-004"][6] == ""

        table.focus()
        table.move_cursor(row=table.get_row_index("gpu-003"))
        await pilot.pause()
        detail = plain(app.query_one("#nodes-detail", Static))
        assert "⚠ the NVIDIA driver is older than the engine wants (535 < 550)" in detail
        assert "fix: install driver 550 or newer and restart the agent" in detail
        table.move_cursor(row=table.get_row_index("gpu-007"))
        await pilot.pause()
        assert "✗ NotReady: no heartbeat for 45 s" in plain(app.query_one("#nodes-detail", Static))


async def test_node_page_of_a_recorded_node() -> None:
    app = ConsoleApp(FleetApi(), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        page = await open_node(app, pilot, "gpu-012")
        cards = page.query_one("#node-cards", DataTable)
        await until(pilot, lambda: cards.row_count == 8, "the node's cards")
        assert str(cards.border_title) == "Cards (8)"
        first = cells(cards)[0]
        assert first[:2] == ["0", "NVIDIA H100 80GB HBM3"]
        assert first[2].endswith("/ 80.0") and first[3].endswith("%") and first[4].endswith("%")
        disks = cells(page.query_one("#node-disks", DataTable))
        assert disks == [
            ["/", "120.0", "500.0", "█████░  76%", ""],
            ["/models", "8000.0", "20000.0", "████░░  60%", "shared"],
        ]
        (shard,) = cells(page.query_one("#node-shards", DataTable))
        assert shard[:4] == ["llama-70b-3", "failed", "llama-70b", "42112"]
        # Nothing listens for the recorded fleet's log: the page says so, and goes on.
        log = page.query_one("#node-log", Log)
        await until(pilot, lambda: "not following" in str(log.border_title), "the lost log")
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, NodePage)


def test_the_node_page_says_the_settings_that_are_not_defaults_and_their_sources() -> None:
    from llmgw.tui.nodepage import settings_line

    assert settings_line({}) is None  # an agent that does not say
    node = {
        "settings": {
            "version": 3,
            "values": {
                "heartbeat_interval": {"value": 5.0, "source": "default"},
                "engine_user": {"value": "llm", "source": "file"},
                "discovery.slow_interval": {"value": 30.0, "source": "cluster"},
            },
            "problem": None,
        }
    }
    assert settings_line(node) == (
        'settings v3: discovery.slow_interval=30.0 (cluster); engine_user="llm" (file)'
    )
    node["settings"]["problem"] = "settings version 4 refused: heartbeat_interval: ..."
    assert settings_line(node).endswith("· settings version 4 refused: heartbeat_interval: ...")


def test_the_node_page_says_the_engines_the_fleet_wants_against_what_the_node_has() -> None:
    from llmgw.tui.nodepage import engines_line

    assert engines_line("a", None) is None  # a control plane that does not say
    fleet = {
        "nodes": [
            {
                "node": "a",
                "engine": "llama.cpp",
                "wanted": "b2",
                "versions": ["b1", "b2"],
                "state": "ready",
                "message": None,
            },
            {
                "node": "a",
                "engine": "vllm",
                "wanted": "0.11.0",
                "versions": [],
                "state": "installing",
                "message": "installing: vllm 0.11.0: Downloading torch",
            },
            {
                "node": "b",
                "engine": "llama.cpp",
                "wanted": "b2",
                "versions": [],
                "state": "failed",
                "message": "install failed: no route",
            },
        ]
    }
    assert engines_line("a", fleet) == (
        "engines the fleet wants: llama.cpp b2: ready (has b1, b2) · vllm 0.11.0: installing "
        "(has none) installing: vllm 0.11.0: Downloading torch"
    )
    assert engines_line("c", fleet) is None


def test_figures_not_live_are_said_so_and_left_uncoloured() -> None:
    """A node whose nvidia-smi hangs: the page says its cards' figures are the last read
    and how old; the GPU map leaves them grey (not read) rather than colour old ones."""
    live = cast(NodeJson, fleet.node(12))
    assert stale_note(live, "gpus") is None and "not live" not in summary(live)
    coloured = node_block(live, "busy", 8)
    stale = cast(NodeJson, {**live, "stale_figures": ["gpus"], "figure_ages": {"gpus": 41.6}})
    assert stale_note(stale, "gpus") == "not live, read 42 s ago"
    grey = node_block(stale, "busy", 8)
    assert grey.plain == coloured.plain
    assert {str(span.style) for span in grey.spans[1:]} == {str(shade(None, SHADES))}
    assert {str(span.style) for span in coloured.spans[1:]} != {str(shade(None, SHADES))}
    unknown = cast(NodeJson, {**live, "stale_figures": ["cpu_percent"], "figure_ages": {}})
    assert "CPU " in summary(unknown) and "(not live, read at an unknown time)" in summary(unknown)
