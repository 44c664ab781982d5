"""The console's People and Organisations screens against a real control plane on
loopback, driven by Pilot: the cluster's admin adds a person, a team and a member; a
person with only a membership sees what the admin API shows them, and their forms are
refused by it with its reason."""

from __future__ import annotations

import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, DataTable, Input, Static

from llmgw.client.admin import AdminClient
from llmgw.server.datadir import DataDir
from llmgw.server.sessions import COOKIE, Sessions
from llmgw.tui.api import ConsoleApi
from llmgw.tui.app import ConsoleApp
from llmgw.tui.dialogs import ConfirmDialog, FormDialog
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.e2e

T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A control plane with acme (team ml), alice its admin and bob in nobody's team."""
    c = Cluster(tmp_path)
    c.init()
    c.start_server()
    try:
        for login in ("alice", "bob"):
            c.api("/api/v1/people", body={"login": login})
        org = c.api("/api/v1/orgs", body={"name": "acme"})
        c.api(f"/api/v1/orgs/{org['id']}/teams", body={"name": "ml"})
        c.api(f"/api/v1/orgs/{org['id']}/projects", body={"name": "chat", "team": "ml"})
        c.api(f"/api/v1/orgs/{org['id']}/members", body={"person": "alice", "role": "admin"})
        yield c
    finally:
        c.stop()


def personal_token(cluster: Cluster, login: str) -> str:
    """A personal token of ``login``'s, made as they make one: on their own page."""
    person = next(p for p in cluster.api("/api/v1/people") if p["login"] == login)
    sessions = Sessions(DataDir(cluster.data_dir).cluster_secret(), list)
    cookie = sessions.open_person(login, person["id"])
    session = sessions.read(cookie)
    assert session is not None
    form = urllib.parse.urlencode({"name": "console", "csrf": sessions.csrf(session)})
    request = urllib.request.Request(
        f"http://{cluster.listen}/admin/people/{person['id']}/tokens",
        data=form.encode(),
        headers={
            "cookie": f"{COOKIE}={cookie}",
            "content-type": "application/x-www-form-urlencoded",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        page = answer.read().decode()
    found = re.search(r'<code id="new-token">(llmgw-pat-[^<]+)</code>', page)
    assert found is not None
    return found.group(1)


async def until(pilot: Pilot[None], check: Callable[[], T | None], what: str) -> T:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await pilot.pause(0.05)
    raise AssertionError(f"never came: {what}")


def rows(table: DataTable[object]) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def text(widget: Static) -> str:
    return str(widget.render())


async def send(app: ConsoleApp, pilot: Pilot[None], **values: str) -> None:
    assert isinstance(app.screen, FormDialog)
    for name, value in values.items():
        app.screen.query_one(f"#field-{name}", Input).value = value
    app.screen.query_one("#submit", Button).focus()
    await pilot.press("enter")


async def test_the_admin_adds_a_person_a_team_and_a_member(cluster: Cluster) -> None:
    app = ConsoleApp(ConsoleApi(AdminClient(f"http://{cluster.listen}", cluster.admin_token)), 0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.people, "the people")
        await pilot.press("9")
        table = app.query_one("#people-table", DataTable)
        assert {r[0] for r in rows(table)} == {"alice", "bob"}
        await pilot.press("n")
        await send(app, pilot, login="carol", name="Carol", role="viewer")
        await until(pilot, lambda: not isinstance(app.screen, FormDialog), "the form to close")
        carol = await until(
            pilot, lambda: [r for r in rows(table) if r[0] == "carol"], "carol in the table"
        )
        assert carol[0][1:3] == ["Carol", "viewer"]
        # A role the API does not know is the form's error, and nothing is sent.
        await pilot.press("n")
        await send(app, pilot, login="dan", role="boss")
        error = app.screen.query_one("#form-error", Static)
        await until(pilot, lambda: "is not viewer, operator or admin" in text(error), "the error")
        await pilot.press("escape")

        await pilot.press("0")
        orgs = app.query_one("#orgs-table", DataTable)
        assert [r[0] for r in rows(orgs)] == ["acme", "default"]
        orgs.move_cursor(row=0)
        detail = app.query_one("#org-detail", Static)
        await until(pilot, lambda: "alice: admin of organisation" in text(detail), "acme's detail")
        await pilot.press("t")
        await send(app, pilot, name="infra")
        await until(pilot, lambda: "infra" in text(detail), "the new team")
        await pilot.press("m")
        await send(app, pilot, person="carol", role="manager", team="infra")
        await until(pilot, lambda: "carol: manager of team infra" in text(detail), "the member")
        # A key for one of the organisation's projects, from the Keys screen.
        await pilot.press("6")
        await pilot.press("n")
        await send(app, pilot, name="chatbot", org="acme", project="ml/chat")
        await until(pilot, lambda: not isinstance(app.screen, FormDialog), "the key's form")
        await pilot.press("escape")  # the key, shown once
    (key,) = [k for k in cluster.api("/api/v1/keys") if k["name"] == "chatbot"]
    project = cluster.api(f"/api/v1/orgs/{rows_id(cluster, 'acme')}/projects")[0]
    assert (key["org_id"], key["project_id"]) == (rows_id(cluster, "acme"), project["id"])
    members = cluster.api(f"/api/v1/orgs/{rows_id(cluster, 'acme')}/members")
    assert any(m["login"] == "carol" and m["role"] == "manager" for m in members)


def rows_id(cluster: Cluster, name: str) -> str:
    return next(o["id"] for o in cluster.api("/api/v1/orgs") if o["name"] == name)


async def test_a_member_sees_their_own_and_is_refused_the_rest(cluster: Cluster) -> None:
    token = personal_token(cluster, "bob")
    app = ConsoleApp(ConsoleApi(AdminClient(f"http://{cluster.listen}", token)), 0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.people, "the people")
        # Bob sees himself, and no organisation: he belongs to none.
        assert [p["login"] for p in app.snapshot.people] == ["bob"]
        assert app.snapshot.orgs == []
        # No cluster route answers him: the title says so, not "cannot reach".
        title = app.query_one("#title", Static)
        assert "your role reads no cluster status" in text(title)
        assert not app.query_one("#banner", Static).display
        await pilot.press("9")
        await pilot.press("n")
        await send(app, pilot, login="mallory", role="admin")
        error = app.screen.query_one("#form-error", Static)
        await until(
            pilot, lambda: "making people needs the cluster's admin role" in text(error), "403"
        )
        await pilot.press("escape")
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmDialog)
        app.screen.query_one("#confirm", Button).focus()
        await pilot.press("enter")
        # The refusal is said; bob stays active.
        await until(
            pilot,
            lambda: any("changing people needs" in str(n.message) for n in app._notifications),
            "the refusal",
        )
    assert all(p["active"] for p in cluster.api("/api/v1/people"))
    assert not any(p["login"] == "mallory" for p in cluster.api("/api/v1/people"))
