"""The Fabrics and NVLink racks screens against the recorded fleet: a fabric's subnet
managers and problems with their fix, its map fetched when it is highlighted and drawn
as tiers (the degraded cable red, the adapter off its rail yellow), "no map yet" for a
fabric whose map was never read; the NVLink domain as a rack of trays with the card not
joined, IMEX down and the card of no domain; and the two screens' pictures."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import DataTable, ListView, Static

from llmgw.tui.app import LATER, PANES, ConsoleApp
from llmgw.tui.fabrics import FabricsPane, topology_text
from llmgw.tui.nvlinkracks import NO_VIEW, NvlinkRacksPane, racks_text
from tests.tui import fleet
from tests.tui.fleet import FABRIC_A, FABRIC_A_STANDBY, FABRIC_B, FleetApi, not_found
from tests.tui.test_node_screens import colours, until

MAP_PATH = f"/api/v1/fabrics/{FABRIC_B}/topology"
NO_MAP_PATH = f"/api/v1/fabrics/{FABRIC_A}/topology"


def content(app: ConsoleApp, selector: str) -> Text:
    text = app.query_one(selector, Static).content
    assert isinstance(text, Text)
    return text


def coloured(text: Text, words: str, colour: str) -> bool:
    """Whether every character of ``words`` in ``text`` is drawn in ``colour``."""
    at = text.plain.index(words)
    spans = [s for s in text.spans if colour in str(s.style).split()]
    return all(any(s.start <= i < s.end for s in spans) for i in range(at, at + len(words)))


async def show_fabrics(app: ConsoleApp, pilot: Pilot[None]) -> DataTable[Any]:
    await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
    await pilot.press(FabricsPane.KEY)
    table = app.query_one("#fabrics-table", DataTable)
    await until(pilot, lambda: table.row_count == 2, "the fabrics")
    return table


async def test_fabric_sms_problems_and_no_map_yet() -> None:
    api = FleetApi()
    app = ConsoleApp(api, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await show_fabrics(app, pilot)
        assert [str(c) for c in table.get_row_at(0)][:5] == [
            FABRIC_A,
            FABRIC_A,
            "2",
            "8",
            "15 ACTIVE, 1 INIT",
        ]
        detail = content(app, "#fabrics-detail").plain
        assert f"master SM {FABRIC_A}" in detail
        assert f"other SMs seen: {FABRIC_A_STANDBY}" in detail
        assert "15 at 200 Gb/s" in detail
        # The problem, and under it its fix.
        assert "⚠ 1 port(s) in INIT or ARMED (gpu-003 mlx5_1/1)" in detail
        assert "\n  fix: check the SM (`sminfo`, its log)" in detail
        # Fabric A's map was never read: the control plane's 404 said as it said it.
        the_map = app.query_one("#fabrics-map", Static)
        await until(pilot, lambda: "no map yet" in str(the_map.render()), "the 404")
        assert str(the_map.render()) == (
            f"no map yet: fabric '{FABRIC_A}': no node of this fabric has ibnetdiscover "
            "(infiniband-diags)"
        )
        others = content(app, "#fabrics-others").plain
        assert "10.200.0.0/16: 2 nodes, 2 ports (gpu-020 mlx5_2, gpu-021 mlx5_2)" in others
        assert "gpu-030 mlx5_0/1 ACTIVE" in others
        assert api.gets.count(NO_MAP_PATH) == 1 and MAP_PATH not in api.gets


async def test_a_fabrics_map_is_fetched_when_highlighted_and_drawn_as_tiers() -> None:
    api = FleetApi()
    app = ConsoleApp(api, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await show_fabrics(app, pilot)
        await pilot.press("down")
        assert table.cursor_row == 1
        await until(pilot, lambda: "Map read" in content(app, "#fabrics-map").plain, "the map")
        assert api.gets.count(MAP_PATH) == 1
        text = content(app, "#fabrics-map")
        lines = text.plain.splitlines()
        assert lines[0].startswith("Map read 2 min ago by gpu-011 · 5 switches")
        assert "18 cables, 1 degraded · 1 off their rail" in text.plain
        # Spines in a row above the leaves; each leaf a column of its hosts' adapters.
        spine = next(i for i, line in enumerate(lines) if line.startswith("spine "))
        leaf = next(i for i, line in enumerate(lines) if line.startswith("leaf "))
        assert spine < leaf and "spine-1" in lines[spine] and "spine-2" in lines[spine]
        columns = [lines[leaf].index(f"leaf-{n}") for n in (1, 2, 3)]
        under = lines[leaf + 1 : leaf + 8]
        assert [line[columns[0] :].split("  ")[0] for line in under] == [
            "gpu-011 mlx5_0",
            "gpu-012 mlx5_0",
            "gpu-013 mlx5_0",
            "gpu-014 mlx5_0",
            "gpu-015 mlx5_0",
            "gpu-015 mlx5_1 ⚠",
            "gpu-016 mlx5_0",
        ]
        assert under[1][columns[1] :].rstrip() == "gpu-012 mlx5_1 ✗   gpu-016 mlx5_1"
        # The degraded cable in red with its reason; the adapter off its rail in yellow.
        cable = (
            "✗ degraded leaf-2 port 2 ↔ gpu-012 mlx5_1: 2x HDR (100 Gb/s), 4x port running at 2x"
        )
        assert cable in text.plain
        assert coloured(text, "4x port running at 2x", "red")
        assert coloured(text, "gpu-012 mlx5_1 ✗", "red")
        rail = "gpu-015 mlx5_1 is on leaf-1 port 7, which carries mlx5_0; its rail is on leaf-2"
        assert f"⚠ off rail {rail}" in text.plain
        assert coloured(text, rail, "yellow")
        assert coloured(text, "gpu-015 mlx5_1 ⚠", "yellow")
        # The fabric's problems, from its map, above it.
        detail = content(app, "#fabrics-detail").plain
        assert "11 at 200 Gb/s, 1 at 100 Gb/s" in detail
        assert "⚠ degraded cable 'MF0;leaf-2:MQM8700/U1'" in detail
        assert "⚠ rail: gpu-015 mlx5_1 is on leaf" in detail

        # A refresh reads the list again, and the map only when a newer one was read.
        before = api.gets.count("/api/v1/fabrics")
        await pilot.press("r")
        await until(pilot, lambda: api.gets.count("/api/v1/fabrics") > before, "a refresh")
        await pilot.pause(0.1)
        assert api.gets.count(MAP_PATH) == 1
        api.recorded_fabrics["fabrics"][1]["topology_read_at"] = fleet.MAP_READ_AT + 300
        await pilot.press("r")
        await until(pilot, lambda: api.gets.count(MAP_PATH) == 2, "the newer map")
        # Back on fabric A: its answer is kept, not asked again.
        await pilot.press("up")
        await until(pilot, lambda: "no map yet" in content(app, "#fabrics-map").plain, "A")
        assert api.gets.count(NO_MAP_PATH) == 1


async def test_fabrics_are_read_only_while_shown() -> None:
    api = FleetApi()
    app = ConsoleApp(api, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        await pilot.press("r")
        await pilot.pause(0.2)
        assert "/api/v1/fabrics" not in api.gets and "/api/v1/nvlink" not in api.gets


def test_a_core_tier_and_a_switch_of_no_tier_get_their_rows() -> None:
    topology = fleet.fabric_map()
    core = {**topology["nodes"][0], "guid": "0x0c42a10300cc0001"}
    core["description"] = "MF0;core-1:MQM9700/U1"
    lone = {**core, "guid": "0x0c42a10300dd0001", "description": "MF0;lone-1:MQM9700/U1"}
    topology["nodes"] += [core, lone]
    topology["tiers"][core["guid"]] = "core"
    topology["links"].append(
        {
            "a": [core["guid"], 1],
            "b": ["0x0c42a10300aa0001", 40],
            "width": "4x",
            "speed": "EDR",
            "rate_gbps": 100.0,
            "degraded": "trained at EDR, below the HDR of both ends",
        }
    )
    lines = topology_text(topology, 30.0, 100).plain.splitlines()
    assert lines[0].startswith("Map read 30 s ago")
    rows = [line.split()[:2] for line in lines if line.split()]
    order = [r for r in rows if r[0] in ("core", "spine", "leaf", "no")]
    assert order == [["core", "core-1"], ["spine", "spine-1"], ["leaf", "leaf-1"], ["no", "tier"]]
    assert "lone-1 ↕0" in next(line for line in lines if line.startswith("no tier"))
    # A degraded switch-to-switch cable: on the switch's head, and said with its reason.
    assert "spine-1 ↕4 ✗1" in next(line for line in lines if line.startswith("spine"))
    assert (
        "✗ degraded core-1 port 1 ↔ spine-1 port 40: 4x EDR (100 Gb/s), trained at EDR, "
        "below the HDR of both ends"
    ) in lines


# --- NVLink racks -------------------------------------------------------------------


async def test_nvlink_racks_show_each_tray_imex_and_the_unjoined() -> None:
    app = ConsoleApp(FleetApi(), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        await pilot.press(NvlinkRacksPane.KEY)
        body = app.query_one("#nvlink-body", Static)
        await until(pilot, lambda: "Domain" in str(body.render()), "the NVLink domains")
        text = content(app, "#nvlink-body")
        lines = text.plain.splitlines()
        assert (
            f"Domain {fleet.NVLINK_CLUSTER} · clique 32766 · 18 trays · 72 cards: 71 joined, "
            "1 not joined · IMEX up on 17, down on 1"
        ) in lines
        trays = [line for line in lines if line.startswith("  gpu-0")]
        assert len(trays) == 18 and all("[■■■■]" in t for t in trays)
        tray_25 = next(t for t in trays if t.startswith("  gpu-025"))
        assert "card 2 not joined: In Progress" in tray_25
        tray_30 = next(t for t in trays if t.startswith("  gpu-030"))
        assert "IMEX down" in tray_30
        assert coloured(text, "IMEX down", "red")
        # The legend, 72 trays' cards, then the unjoined one.
        cells = colours(text)
        assert cells[:4] == ["green", "yellow", "red", "grey50"]
        rack = cells[4 : 4 + 72]
        assert rack.count("green") == 71 and rack[5 * 4 + 2] == "red"
        assert cells[4 + 72 :] == ["red"]
        assert "fix: start it (`systemctl enable --now nvidia-imex`)" in text.plain
        assert "⚠ gpu-025 card 2 has not joined NVLink domain" in text.plain
        unjoined = lines.index("Unjoined (cards with an NVLink fabric in no domain)")
        assert lines[unjoined + 1] == "  ■ gpu-038 card 0 (GPU-038-0): Not Started"


def test_a_card_or_imex_not_read_is_unknown_never_joined() -> None:
    found = fleet.nvlink()
    tray = found["domains"][0]["trays"][0]
    tray["cards"][0]["joined"] = None
    tray["cards"][1]["health"] = {"summary": "Degraded Bandwidth"}
    tray["imex"] = {"running": None, "channels": None}
    found["domains"][0]["trays"][1]["connected"] = False
    found["unjoined"] = []
    text = racks_text(found)
    assert colours(text)[4:6] == ["grey50", "yellow"]
    assert "70 joined, 1 not joined, 1 unknown" in text.plain
    assert "IMEX up on 16, down on 1, unknown on 1" in text.plain
    assert "  gpu-020 [■■■■]  IMEX unknown" in text.plain
    assert "card 1 Degraded Bandwidth" in text.plain
    gpu_021 = next(line for line in text.plain.splitlines() if "gpu-021" in line)
    assert gpu_021.endswith("agent not connected: last figures")
    assert "Unjoined" not in text.plain
    assert "No NVLink domain" in racks_text({"domains": [], "unjoined": []}).plain


class OlderApi(FleetApi):
    """A control plane from before ``/api/v1/nvlink``."""

    async def get(self, path: str) -> Any:
        if path == "/api/v1/nvlink":
            raise not_found(self.base_url + path, "no route")
        return await super().get(path)


async def test_an_older_control_plane_without_nvlink_is_said_so() -> None:
    app = ConsoleApp(OlderApi(), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        await pilot.press(NvlinkRacksPane.KEY)
        body = app.query_one("#nvlink-body", Static)
        await until(pilot, lambda: str(body.render()) == NO_VIEW, "the 404 said")


async def test_the_sidebar_has_both_screens_and_nothing_later() -> None:
    assert LATER == ()
    assert [p.KEY for p in PANES] == [*(str(k) for k in range(1, 10)), "0", "i", "u", "m", "g"]
    app = ConsoleApp(FleetApi(), refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
        sidebar = app.query_one(ListView)
        words = [str(item.query_one(Static).render()) for item in sidebar.children]
        assert words[6:] == [
            "7 Fabrics",
            "8 NVLink racks",
            "9 People",
            "0 Organisations",
            "i Sign-in",
            "u Slurm",
            "m MCP",
            "g Guard",
        ]
        assert not any("later" in w for w in words)
        sidebar.focus()
        sidebar.index = 7
        await pilot.press("enter")
        await pilot.pause()
        assert app.current.ID == "nvlink"


# --- pictures -------------------------------------------------------------------------


def test_fabrics_screen(snap_compare: Any) -> None:
    async def show(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, ConsoleApp)
        table = await show_fabrics(app, pilot)
        table.focus()
        await pilot.press("down")
        await until(pilot, lambda: "Map read" in content(app, "#fabrics-map").plain, "the map")
        await pilot.pause(0.2)

    assert snap_compare(
        ConsoleApp(FleetApi(), refresh=3600), terminal_size=(120, 40), run_before=show
    )


async def show_nvlink_racks(pilot: Pilot[None]) -> None:
    """Open the NVLink racks screen once the snapshot is in, and wait for its domains."""
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    await until(pilot, lambda: app.snapshot.nodes, "the recorded snapshot")
    await pilot.press(NvlinkRacksPane.KEY)
    body = app.query_one("#nvlink-body", Static)
    await until(pilot, lambda: "Domain" in str(body.render()), "the NVLink domains")
    await pilot.pause(0.2)


def test_nvlink_racks_screen(snap_compare: Any) -> None:
    assert snap_compare(
        ConsoleApp(FleetApi(), refresh=3600), terminal_size=(120, 40), run_before=show_nvlink_racks
    )
