"""The console's Fabrics and NVLink racks screens over the recorded 64-node fleet
(``tests/support/fleet64.py``): the answers are what the control plane's own code makes
of the fleet (``FabricService.listing``, ``FabricMaps.topology``, ``nvlink.domains``),
through JSON. Fabric A (30 nodes, its port in INIT, its standby SM, its degraded cable,
two sets of rail leaves under four spines), fabric B (16 nodes, no standby) and the
NVL72 rack of 18 trays with one card not joined; and the two screens' pictures."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.fleet.nvlink import domains
from llmgw.tui.api import Snapshot
from llmgw.tui.app import ConsoleApp
from llmgw.tui.fabrics import FabricsPane
from llmgw.tui.nvlinkracks import NvlinkRacksPane
from tests.support import fleet64
from tests.support.fleet64 import (
    CLUSTER_UUID,
    FABRIC_A,
    FABRIC_A_STANDBY,
    FABRIC_B,
    TRAYS,
)
from tests.tui.fleet import FleetApi
from tests.tui.test_fabric_screens import coloured, content, show_nvlink_racks
from tests.tui.test_node_screens import colours, until

SIZE = (140, 50)


def through_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def recorded() -> tuple[Snapshot, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The fleet's snapshot, fabrics, maps and NVLink domains as the API answers them."""
    maps = fleet64.fabric_maps()
    nodes = maps.registry.nodes.values()
    snapshot = Snapshot(
        at=time.time(),
        status={
            "version": "test",
            "leader": True,
            "serving": "serving",
            "nodes": maps.registry.counts(),
        },
        nodes=through_json([v.as_json() for v in nodes]),
        models=[],
        replicas=[],
        keys=[],
    )
    topologies = {fid: maps.topology(fid) for fid in (FABRIC_A, FABRIC_B)}
    return (
        snapshot,
        through_json(FabricService(maps.watch, maps, maps.registry).listing()),
        through_json(topologies),
        through_json(domains(nodes)),
    )


class Fleet64Api(FleetApi):
    """The recorded console API, answering with the 64-node fleet."""

    def __init__(self) -> None:
        snapshot, fabrics, maps, nvlink = recorded()
        super().__init__(snapshot)
        self.recorded_fabrics, self.fabric_maps, self.recorded_nvlink = fabrics, maps, nvlink


async def show_fabrics(app: ConsoleApp, pilot: Pilot[None]) -> DataTable[Any]:
    await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
    await pilot.press(FabricsPane.KEY)
    table = app.query_one("#fabrics-table", DataTable)
    await until(pilot, lambda: table.row_count == 2, "the fabrics")
    await until(pilot, lambda: "Map read" in content(app, "#fabrics-map").plain, "the map")
    return table


async def test_both_fabrics_their_sms_problems_and_fabric_as_map() -> None:
    api = Fleet64Api()
    app = ConsoleApp(api, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        table = await show_fabrics(app, pilot)
        assert [[str(c) for c in table.get_row_at(i)] for i in (0, 1)] == [
            [FABRIC_A, FABRIC_A, "2", "30", "239 ACTIVE, 1 INIT", "2 ⚠", "read"],
            [FABRIC_B, FABRIC_B, "1", "16", "128 ACTIVE", "1 ⚠", "read"],
        ]
        detail = content(app, "#fabrics-detail").plain
        assert f"master SM {FABRIC_A} · other SMs seen: {FABRIC_A_STANDBY}" in detail
        assert "30 nodes · 240 ports: 239 ACTIVE, 1 INIT · 238 at 400 Gb/s, 1 at 200 Gb/s" in detail
        assert "⚠ 1 port(s) in INIT or ARMED (a-23 mlx5_5/1)" in detail
        assert "⚠ degraded cable 'MF0;a-su1-rail3:MQM9700/U1'" in detail

        text = content(app, "#fabrics-map")
        lines = text.plain.splitlines()
        assert lines[0] == (
            "Map read 2 min ago by a-01 · 20 switches · 240 adapters on 30 hosts · "
            "368 cables, 1 degraded"
        )
        spine = next(i for i, line in enumerate(lines) if line.startswith("spine "))
        assert [w for w in lines[spine].split() if w.startswith("a-spine")] == [
            f"a-spine-{k}" for k in range(1, 5)
        ]
        assert "a-spine-1 ↕32" in lines[spine]
        # Each leaf a column of its hosts' adapters: SU1's leaves carry a-01..a-16.
        leaf = next(i for i, line in enumerate(lines) if line.startswith("leaf "))
        assert spine < leaf
        at = lines[leaf].index("a-su1-rail0")
        assert lines[leaf][at:].startswith("a-su1-rail0 ↕8")
        under = [line[at:].split("  ")[0] for line in lines[leaf + 1 : leaf + 17]]
        assert under == [f"a-{n:02d} mlx5_0" for n in range(1, 17)]
        assert "a-su2-rail7" in text.plain and "a-30 mlx5_7" in text.plain
        assert coloured(text, "a-07 mlx5_3 ✗", "red")
        assert (
            "✗ degraded a-su1-rail3 port 7 ↔ a-07 mlx5_3: 4x HDR (200 Gb/s), trained at HDR, "
            "below the NDR of both ends"
        ) in lines
        assert "off rail" not in text.plain

        await pilot.press("down")
        await until(pilot, lambda: "by b-01" in content(app, "#fabrics-map").plain, "B's map")
        b_map = content(app, "#fabrics-map").plain
        assert b_map.startswith(
            "Map read 2 min ago by b-01 · 10 switches · 128 adapters on 16 hosts · 192 cables"
        )
        assert "degraded" not in b_map.splitlines()[0]
        detail = content(app, "#fabrics-detail").plain
        assert "16 nodes · 128 ports: 128 ACTIVE · 128 at 400 Gb/s" in detail
        assert "⚠ no standby subnet manager (1 SM(s) known to the fabric" in detail
        others = content(app, "#fabrics-others").plain
        assert "RoCE networks\n  none seen" in others and "Ports of no fabric" not in others


async def test_the_nvl72_rack_of_18_trays() -> None:
    app = ConsoleApp(Fleet64Api(), refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        await pilot.press(NvlinkRacksPane.KEY)
        body = app.query_one("#nvlink-body", Static)
        await until(pilot, lambda: "Domain" in str(body.render()), "the NVLink domains")
        text = content(app, "#nvlink-body")
        assert isinstance(text, Text)
        lines = text.plain.splitlines()
        assert (
            f"Domain {CLUSTER_UUID} · clique 2 · 18 trays · 72 cards: 71 joined, 1 not joined"
            " · IMEX up on 18"
        ) in lines
        trays = [line for line in lines if line.startswith("  nvl-")]
        assert [t.split()[0] for t in trays] == list(TRAYS)
        assert all("[■■■■]  IMEX up (1 channel)" in t for t in trays)
        assert next(t for t in trays if t.startswith("  nvl-13")).endswith(
            "card 2 not joined: In Progress"
        )
        cells = colours(text)
        rack = cells[4 : 4 + 72]  # after the legend's four
        assert rack.count("green") == 71 and rack[12 * 4 + 2] == "red"
        assert "⚠ nvl-13 card 2 has not joined NVLink domain" in text.plain
        unjoined = lines.index("Unjoined (cards with an NVLink fabric in no domain)")
        assert lines[unjoined + 1].startswith("  ■ nvl-13 card 2 (GPU-")
        assert lines[unjoined + 1].endswith("): In Progress")
        assert not any(line.lstrip().startswith(("a-", "b-")) for line in lines)


# --- pictures -------------------------------------------------------------------------


def test_fleet64_fabrics_screen(snap_compare: Any) -> None:
    async def show(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, ConsoleApp)
        table = await show_fabrics(app, pilot)
        table.focus()
        await pilot.pause(0.2)

    assert snap_compare(ConsoleApp(Fleet64Api(), refresh=3600), terminal_size=SIZE, run_before=show)


def test_fleet64_nvlink_racks_screen(snap_compare: Any) -> None:
    assert snap_compare(
        ConsoleApp(Fleet64Api(), refresh=3600), terminal_size=SIZE, run_before=show_nvlink_racks
    )
