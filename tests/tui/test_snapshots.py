"""The console's main screens at 120x40, compared with their recorded pictures
(pytest-textual-snapshot; `pytest --snapshot-update` records them again after a change
made on purpose). The fleet is recorded too, so every run draws the same."""

from __future__ import annotations

from typing import Any

import pytest
from textual.pilot import Pilot

from llmgw.tui.app import ConsoleApp
from tests.tui.fleet import FleetApi

SCREENS = {
    "overview": "1",
    "nodes": "2",
    "models": "3",
    "replicas": "4",
    "gpumap": "5",
    "keys": "6",
}


@pytest.mark.parametrize("screen", sorted(SCREENS))
def test_main_screens(snap_compare: Any, screen: str) -> None:
    async def show(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, ConsoleApp)
        for _ in range(100):
            await pilot.pause(0.05)
            if app.snapshot.nodes:
                break
        await pilot.press(SCREENS[screen])
        await pilot.pause(0.2)

    # A refresh far apart: the picture is of one snapshot.
    assert snap_compare(
        ConsoleApp(FleetApi(), refresh=3600), terminal_size=(120, 40), run_before=show
    )
