"""The console against a real control plane and agent on loopback, driven by Pilot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from llmgw.client.admin import AdminClient
from llmgw.tui.api import ConsoleApi
from llmgw.tui.app import ConsoleApp
from tests.e2e.catalog import scheduled, serve_tiny
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path, binary: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        serve_tiny(c, binary, "a")
        yield c
    finally:
        c.stop()


def console(cluster: Cluster) -> ConsoleApp:
    client = AdminClient(f"http://{cluster.listen}", cluster.admin_token)
    return ConsoleApp(ConsoleApi(client), refresh=0.5)


def cells(table: DataTable[object]) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_screens_show_the_cluster(cluster: Cluster) -> None:
    app = console(cluster)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(40):
            await pilot.pause(0.1)
            if app.snapshot.nodes:
                break
        title = str(app.query_one("#title", Static).render())
        assert "leader" in title and "serving" in title and "1/1 nodes Ready" in title
        overview = str(app.query_one("#overview-body", Static).render())
        assert "Nodes     1 Ready of 1" in overview
        await pilot.press("2")
        nodes = cells(app.query_one("#nodes-table", DataTable))
        assert nodes[0][:2] == ["a", "Ready"]
        await pilot.press("3")
        models = cells(app.query_one("#models-table", DataTable))
        assert models[0][:3] == ["tiny", "serving", "1/1"]
        for _ in range(100):  # the speed shows once the agent has measured its memory
            if models[0][7].endswith("tok/s"):
                break
            await pilot.pause(0.1)
            models = cells(app.query_one("#models-table", DataTable))
        assert models[0][7].startswith("~") and models[0][7].endswith("tok/s")
        await pilot.press("4")
        replicas = cells(app.query_one("#replicas-table", DataTable))
        assert replicas[0][1:4] == ["tiny", "a", "ready"]
        await pilot.press("q")


async def test_says_when_the_control_plane_cannot_be_reached(cluster: Cluster) -> None:
    app = console(cluster)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(40):
            await pilot.pause(0.1)
            if app.snapshot.nodes:
                break
        assert cluster.server is not None
        cluster.server.stop()
        banner = app.query_one("#banner", Static)
        for _ in range(60):
            await pilot.pause(0.1)
            if banner.display:
                break
        assert banner.display and "Cannot reach the control plane" in str(banner.render())
        # The last figures stay on screen.
        await pilot.press("2")
        assert cells(app.query_one("#nodes-table", DataTable))[0][0] == "a"
