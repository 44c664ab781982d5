"""The console's Slurm screen against the admin API's client answering from a table
(``tests/support/fakeadmin.py``), driven by Pilot: each node's part, stage, Slurm's state
and reason, jobs, version and what it waits for; the highlighted node in full with its
problem's fix; the warnings and what the policy would do next; lend and reclaim behind
a question, sent as the admin API's bodies, the control plane's refusal shown as it
said it; a control plane without the route; and the Nodes screen marking a lent node.
Then the same against a real control plane with fake agents, over HTTP
(``tests/support/slurmplane.py``): a refused reclaim in the service's words, a lend that
the service takes, and the Nodes screen marking it."""

from __future__ import annotations

import io
import urllib.error
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import DataTable, Static

from llmgw.client.admin import AdminClient
from llmgw.client.adminbase import AdminError
from llmgw.server.requests import SlurmNodes, SlurmSetup
from llmgw.tui.api import ConsoleApi
from llmgw.tui.app import ConsoleApp
from llmgw.tui.dialogs import ConfirmDialog
from llmgw.tui.slurm import NO_SLURM, SlurmPane
from llmgw.wire.messages import SlurmJob
from tests.server.slurm.fleet import Plane
from tests.support.fakeadmin import FakeAdmin
from tests.support.slurmjson import slurm_json, slurm_node, slurm_off
from tests.support.slurmplane import Served, served
from tests.support.wiring import ADMIN
from tests.tui.test_node_screens import until

JOB = SlurmJob(id="41", name="train", user="ayse", state="RUNNING", end=None)


def node_json(node: str, slurm: str | None) -> dict[str, Any]:
    return {
        "id": node,
        "state": "Ready",
        "reason": "",
        "connected": True,
        "address": "10.0.0.2",
        "gpus": [],
        "engines": [],
        "warnings": [],
        "cordoned": slurm == "lent",
        "draining": False,
        "labels": {},
        "slurm": slurm,
    }


def refusal(path: str, code: int, message: str) -> AdminError:
    """As the client raises a refusal: the message after the URL, the HTTP error under."""
    url = f"http://cp{path}"
    error = AdminError(f"{url}: {message}", None, code)
    error.__cause__ = urllib.error.HTTPError(url, code, message, Message(), io.BytesIO())
    return error


def fake_admin() -> FakeAdmin:
    admin = FakeAdmin()
    admin.answer("GET", "/api/v1/status", {"version": "t", "leader": True, "nodes": {}})
    nodes = [node_json("n1", "serving"), node_json("n2", "lent"), node_json("n9", None)]
    admin.answer("GET", "/api/v1/nodes", nodes)
    for path in ("models", "replicas", "keys", "people", "orgs"):
        admin.answer("GET", f"/api/v1/{path}", [])
    admin.answer("GET", "/api/v1/slurm", slurm_json())
    return admin


def cells(table: DataTable[Any], key: str) -> list[str]:
    return [str(c) for c in table.get_row(key)]


def plain(where: ConsoleApp | Screen[Any], selector: str) -> str:
    shown = where.query_one(selector, Static).content
    return shown.plain if isinstance(shown, Text) else str(shown)


async def show_slurm(app: ConsoleApp, pilot: Pilot[None]) -> DataTable[Any]:
    await until(pilot, lambda: app.snapshot.at, "the first snapshot")
    await pilot.press(SlurmPane.KEY)
    table = app.query_one("#slurm-table", DataTable)
    await until(pilot, lambda: table.row_count == 4, "Slurm's nodes")
    return table


async def test_each_node_its_part_stage_state_jobs_version_and_what_it_waits_for() -> None:
    admin = fake_admin()
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        table = await show_slurm(app, pilot)
        assert cells(table, "n1") == [
            "n1",
            "both",
            "serving",
            "IDLE+DRAIN",
            "llmgw: not lent",
            "0",
            "22.05.8",
            "-",
        ]
        assert cells(table, "n2")[:6] == ["n2", "slurmd", "lent", "MIXED", "-", "1"]
        # Jobs not read (slurmctld could not be asked) are a dash, never 0.
        assert cells(table, "n3") == [
            "n3",
            "slurmd",
            "reclaiming",
            "ALLOCATED+DRAIN",
            "llmgw: reclaimed",
            "-",
            "22.05.8",
            "job 42 to end (srun sleep)",
        ]
        cluster = plain(app, "#slurm-cluster")
        assert "Slurm on · controller n1 (10.0.0.1:6817) · partition llmgw" in cluster
        assert "⚠ slurmctld on n1 does not answer" in cluster
        assert "\n  fix: see `journalctl -u slurmctld` on n1" in cluster
        assert "Policy: lend after 30 min idle, keep 2 card(s) free, reclaim when queued" in (
            cluster
        )
        assert "next: lend n1: its cards served nothing for 31 min (policy: 30 min)" in cluster

        table.focus()
        await pilot.press("down")
        await until(pilot, lambda: "job 41" in plain(app, "#slurm-detail"), "n2's jobs")
        detail = plain(app, "#slurm-detail")
        assert "n2  slurmd · lent · Slurm's to schedule" in detail
        assert "job 41 train by ayse RUNNING, ends in" in detail
        assert "Job steps on the machine: 1" in detail

        await pilot.press("down")
        await until(pilot, lambda: "Waiting for" in plain(app, "#slurm-detail"), "n3")
        detail = plain(app, "#slurm-detail")
        assert "Jobs: not read (slurmctld could not be asked)" in detail
        assert "Waiting for job 42 to end (srun sleep)" in detail
        assert "⚠ munge: munged is not running" in detail
        assert "\n  fix: restart the agent, which writes the key" in detail

        await pilot.press("down")
        await until(pilot, lambda: "administrator" in plain(app, "#slurm-detail"), "n4")
        assert "Drained by a Slurm administrator: llmgw never resumes" in plain(
            app, "#slurm-detail"
        )


async def test_lend_asks_first_then_sends_the_node_and_shows_the_answer() -> None:
    admin = fake_admin()
    lent = slurm_json()
    lent["nodes"][0] = slurm_node("n1", "both", "lending", waiting_for="replica qwen-0 to move")
    admin.answer("POST", "/api/v1/slurm/lend", lent)
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        table = await show_slurm(app, pilot)
        table.focus()
        # Escape: nothing is sent.
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        assert "Lend n1 to Slurm? Its replicas are placed on other nodes" in plain(
            app.screen, "#message"
        )
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmDialog), "no question")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        await pilot.press("y")
        await until(pilot, lambda: cells(table, "n1")[2] == "lending", "the answer shown")
        posts = [a for a in admin.asked if a[0] == "POST"]
        assert posts == [("POST", "/api/v1/slurm/lend", {"nodes": ["n1"]})]
        assert cells(table, "n1")[7] == "replica qwen-0 to move"
        await until(
            pilot, lambda: any("n1: lending" in str(n.message) for n in app._notifications), "said"
        )


async def test_a_refused_reclaim_is_shown_as_the_control_plane_said_it() -> None:
    admin = fake_admin()
    why = "slurm is off: run `llmgw ctl slurm setup` first"
    admin.answer("POST", "/api/v1/slurm/reclaim", refusal("/api/v1/slurm/reclaim", 409, why))
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        table = await show_slurm(app, pilot)
        table.focus()
        await pilot.press("down")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        assert "Take n2 back from Slurm?" in plain(app.screen, "#message")
        await pilot.press("y")
        await until(
            pilot, lambda: any(str(n.message) == why for n in app._notifications), "the refusal"
        )
        assert ("POST", "/api/v1/slurm/reclaim", {"nodes": ["n2"]}) in admin.asked
        # Nothing changed: the table is the last answer's.
        assert cells(table, "n2")[2] == "lent"


async def test_a_control_plane_without_slurm_says_so() -> None:
    admin = fake_admin()
    admin.answer("GET", "/api/v1/slurm", refusal("/api/v1/slurm", 404, "Not Found"))
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await until(pilot, lambda: app.snapshot.at, "the first snapshot")
        await pilot.press(SlurmPane.KEY)
        await until(pilot, lambda: plain(app, "#slurm-cluster") == NO_SLURM, "the 404 said")
        assert app.query_one("#slurm-table", DataTable).row_count == 0


async def test_slurm_off_and_no_policy() -> None:
    admin = fake_admin()
    admin.answer("GET", "/api/v1/slurm", slurm_off())
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await until(pilot, lambda: app.snapshot.at, "the first snapshot")
        await pilot.press(SlurmPane.KEY)
        await until(pilot, lambda: "Slurm is off" in plain(app, "#slurm-cluster"), "off said")
        assert plain(app, "#slurm-cluster") == (
            "Slurm is off: `llmgw ctl slurm setup` turns it on.\nPolicy: off"
        )
        await pilot.press("l")
        await until(
            pilot, lambda: any("No node to lend" in str(n.message) for n in app._notifications), "-"
        )
        assert not isinstance(app.screen, ConfirmDialog)


async def test_the_nodes_screen_marks_a_lent_node() -> None:
    admin = fake_admin()
    app = ConsoleApp(ConsoleApi(admin), refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await until(pilot, lambda: app.snapshot.nodes, "the first snapshot")
        await pilot.press("2")
        table = app.query_one("#nodes-table", DataTable)
        await until(pilot, lambda: table.row_count == 3, "the nodes")
        assert cells(table, "n2")[1] == "Ready,Cordoned,lent"
        # Serving, or not in Slurm's set: the state alone.
        assert cells(table, "n1")[1] == "Ready"
        assert cells(table, "n9")[1] == "Ready"
        table.focus()
        await pilot.press("down")
        detail = app.query_one("#nodes-detail", Static)
        await until(pilot, lambda: "Slurm: lent" in str(detail.render()), "n2's detail")
        assert "Slurm: lent (Slurm's to schedule)" in str(detail.render())


# --- against a real control plane ---------------------------------------------------


async def b_lent_c_serving(plane: Plane) -> None:
    """a runs slurmctld alone; b (lent, a job running) and c (serving) run slurmd."""
    cp = plane.cp
    for i, node in enumerate(("a", "b", "c")):
        await plane.node(node, f"127.0.0.{i + 1}")
        plane.slurm(node)
    await cp.slurm.service.setup(SlurmSetup(controller="a", nodes=("b", "c")), ADMIN)
    await cp.slurm.service.lend(SlurmNodes(nodes=("b",)), ADMIN)
    await cp.slurm.keeper.pass_once()
    plane.slurm("b", state="MIXED", reason=None, jobs=[JOB], steps=1)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Served]:
    with served(tmp_path, b_lent_c_serving) as s:
        yield s


async def test_against_the_control_plane_lend_goes_through_and_a_refusal_is_its_words(
    site: Served,
) -> None:
    slurm = site.plane.cp.slurm.service
    app = ConsoleApp(ConsoleApi(AdminClient(site.base, site.token)), refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await until(pilot, lambda: app.snapshot.at and app.snapshot.nodes, "the nodes")
        await pilot.press(SlurmPane.KEY)
        table = app.query_one("#slurm-table", DataTable)
        await until(pilot, lambda: table.row_count == 3, "Slurm's nodes", seconds=20)
        assert cells(table, "a")[:3] == ["a", "slurmctld", "serving"]
        assert cells(table, "b")[:6] == ["b", "slurmd", "lent", "MIXED", "-", "1"]
        assert cells(table, "c")[:3] == ["c", "slurmd", "serving"]
        table.focus()
        # a is no lent node: the control plane refuses, in its words, and nothing changes.
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        await pilot.press("y")
        await until(
            pilot,
            lambda: any("not lent to Slurm: a" in str(n.message) for n in app._notifications),
            "the refusal",
            seconds=20,
        )
        assert slurm.stage_of("a") is None and slurm.settings.reclaim == ()
        # c is lent from the console: the service has it, the table shows it.
        await pilot.press("down", "down")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
        await pilot.press("y")
        await until(pilot, lambda: cells(table, "c")[2] == "lent", "c lent", seconds=20)
        assert "c" in slurm.settings.lend
        # The Nodes screen marks both lent nodes, once its snapshot is read again.
        await pilot.press("r", "2")
        nodes = app.query_one("#nodes-table", DataTable)
        await until(pilot, lambda: cells(nodes, "c")[1].endswith(",lent"), "c marked", seconds=20)
        assert cells(nodes, "b")[1] == "Ready,Cordoned,lent"
        assert cells(nodes, "a")[1] == "Ready"
