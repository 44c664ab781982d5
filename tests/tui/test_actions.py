"""The console's actions, driven by Pilot through their dialogs against a real control
plane, agent and llama-server on loopback; each checks the widgets and then what the
admin API shows."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, DataTable, Input, Static

from llmgw.client.admin import AdminClient
from llmgw.tui.api import ConsoleApi
from llmgw.tui.app import ConsoleApp
from llmgw.tui.dialogs import ConfirmDialog, FormDialog, MessageDialog, Tick
from llmgw.tui.models import ServeDialog
from tests.e2e.catalog import join, replicas, scheduled
from tests.e2e.cluster import Cluster, wait_for
from tests.support.engines import Mirror
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e

T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> Iterator[Cluster]:
    """One control plane and node for the module: each test leaves it as it found it."""
    c = scheduled(tmp_path_factory.mktemp("console-actions"))
    try:
        join(c, "a", binary)
        # The planner's speed needs the node's memory read rate, measured by its agent
        # in the background once it has joined.
        wait_for(
            lambda: c.api("/api/v1/nodes/a").get("memory_read_gbs"),
            120,
            "node a to measure its memory read rate",
        )
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def model(cluster: Cluster) -> Iterator[str]:
    """The tiny model's URL on loopback: the node downloads it, so removing the model
    with its files has files to remove."""
    files = cluster.root / "files"
    files.mkdir()
    write_tiny_model(files / "tiny.gguf")
    mirror = Mirror(files)
    try:
        yield f"{mirror.url}/tiny.gguf"
    finally:
        mirror.close()


def console(cluster: Cluster) -> ConsoleApp:
    client = AdminClient(f"http://{cluster.listen}", cluster.admin_token)
    return ConsoleApp(ConsoleApi(client), refresh=0.5)


async def until(
    pilot: Pilot[None],
    check: Callable[[], T | None],
    what: str | Callable[[], str],
    timeout: float = 30,
) -> T:
    """Let the app run until ``check`` gives something, and return that; ``what`` is
    said when it never does (worked out then, when it is a function)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


def ready(cluster: Cluster, name: str, count: int) -> Callable[[], list[Any] | None]:
    # A failed replica is not fatal here: another test's engine may hold the port the
    # control plane picked, and it then picks another.
    def check() -> list[Any] | None:
        rows = replicas(cluster, name)
        good = len(rows) == count and all(r["state"] == "ready" for r in rows)
        return rows if good else None

    return check


def the_model(cluster: Cluster, name: str) -> dict[str, Any]:
    (m,) = [m for m in cluster.api("/api/v1/models") if m["name"] == name]
    return m  # type: ignore[no-any-return]


def text(widget: Static) -> str:
    return str(widget.render())


async def open_pane(app: ConsoleApp, pilot: Pilot[None], key: str, table: str) -> DataTable[Any]:
    await until(pilot, lambda: app.snapshot.nodes, "the first snapshot")
    # The pane's actions are its keys: showing it puts the focus in its table.
    await pilot.press(key)
    shown = app.query_one(f"#{table}", DataTable)
    assert app.focused is shown
    return shown


def form_state(app: ConsoleApp, cluster: Cluster) -> str:
    """Why a form may still be open: what it says went wrong, whether it is still
    sending (its submit button off), its workers, and what the catalog holds."""
    screen = app.screen
    error = screen.query("#form-error")
    sending = screen.query("#submit")
    return (
        f"it says {text(error.first(Static)) if error else ''!r}; "
        f"sending: {sending.first(Button).disabled if sending else None}; "
        f"workers: {[(w.name, str(w.state)) for w in screen.workers]}; "
        f"models: {[m['name'] for m in cluster.api('/api/v1/models')]}"
    )


async def submit(app: ConsoleApp, pilot: Pilot[None]) -> None:
    """Send the form as a keyboard user does (focus on its button, Enter): a click is
    aimed where the button was drawn, and the plan's text, still growing as its figures
    arrive, can move the button before the click lands."""
    app.screen.query_one("#submit", Button).focus()
    await pilot.press("enter")


def fill_in(app: ConsoleApp, **values: str) -> None:
    for name, value in values.items():
        app.screen.query_one(f"#field-{name}", Input).value = value


async def test_serve_change_stop_start_scale_and_remove_a_model(
    cluster: Cluster, model: str
) -> None:
    app = console(cluster)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await open_pane(app, pilot, "3", "models-table")

        # Serve: the planner's estimate shows in the form before anything is sent.
        await pilot.press("s")
        assert isinstance(app.screen, ServeDialog)
        fill_in(app, source=model, name="tiny", context="256")
        plan = app.screen.query_one("#plan", Static)
        await until(pilot, lambda: "Fits now on: a" in text(plan), "the plan")
        assert "Memory per replica:" in text(plan) and "a: fits on the CPU" in text(plan)
        assert "tokens/s" in text(plan)
        await submit(app, pilot)
        # Serving reads the model and judges every node: on a loaded machine that takes a
        # while; a refusal would stay in the form, and is said if the form stays open.
        await until(
            pilot,
            lambda: not isinstance(app.screen, ServeDialog),
            lambda: f"the form to close ({form_state(app, cluster)})",
            timeout=90,
        )
        assert the_model(cluster, "tiny")["context"] == 256
        await until(pilot, ready(cluster, "tiny", 1), "tiny to be ready")
        await until(pilot, lambda: table.row_count and str(table.get_row_at(0)[2]) == "1/1", "1/1")
        assert str(table.get_row_at(0)[0]) == "tiny"

        # The control plane's refusal shows in the form, which stays open.
        await pilot.press("s")
        fill_in(app, source=model, name="tiny")
        await submit(app, pilot)
        error = app.screen.query_one("#form-error", Static)
        await until(pilot, lambda: text(error), "the refusal")
        assert "tiny" in text(error) and isinstance(app.screen, ServeDialog)
        await pilot.press("escape")
        assert not isinstance(app.screen, FormDialog)

        # Context length: Enter in a field submits the form.
        await pilot.press("c")
        assert app.screen.query_one("#field-context", Input).value == "256"
        fill_in(app, context="512")
        await pilot.press("enter")
        await until(pilot, lambda: the_model(cluster, "tiny")["context"] == 512, "context 512")
        assert not isinstance(app.screen, FormDialog)
        await until(pilot, lambda: str(table.get_row_at(0)[4]) == "512", "the new context")

        # Stop, then start.
        await pilot.press("x")
        await until(pilot, lambda: the_model(cluster, "tiny")["state"] == "stopped", "stopped")
        await until(pilot, lambda: not replicas(cluster, "tiny"), "no replicas")
        await until(pilot, lambda: str(table.get_row_at(0)[1]) == "stopped", "stopped shown")
        await pilot.press("t")
        await until(pilot, ready(cluster, "tiny", 1), "tiny to be ready again")

        # Restart asks first; cancelling does nothing.
        await pilot.press("R")
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("escape")
        assert not isinstance(app.screen, ConfirmDialog)

        # A new profile name adds a CPU profile.
        await pilot.press("p")
        fill_in(app, replicas="1", profile="cpu2")
        await submit(app, pilot)
        await until(
            pilot,
            lambda: "cpu2" in [p["name"] for p in the_model(cluster, "tiny")["profiles"]],
            "the cpu2 profile",
        )
        rows = await until(pilot, ready(cluster, "tiny", 2), "two replicas")
        assert sorted(r["profile"] for r in rows) == ["cpu2", "default"]
        await until(pilot, lambda: "cpu2 1/1" in str(table.get_row_at(0)[6]), "cpu2 shown")

        # Remove, with files.
        def held() -> list[Any]:
            return [w for w in cluster.api("/api/v1/weights") if w["source"] == model]

        assert held() and held()[0]["wanted"]
        await pilot.press("D")
        assert isinstance(app.screen, FormDialog)
        assert app.screen.query_one("#field-with_files", Tick).has_focus
        await pilot.press("space")
        await submit(app, pilot)
        await until(pilot, lambda: cluster.api("/api/v1/models") == [], "the model to go")
        await until(pilot, lambda: not replicas(cluster, "tiny"), "its replicas to stop")
        await until(pilot, lambda: table.row_count == 0, "the row to go")
        await until(pilot, lambda: not held(), "its files to go")
        await pilot.press("q")


async def test_create_a_key_shown_once_and_revoke_it(cluster: Cluster) -> None:
    app = console(cluster)
    async with app.run_test(size=(120, 40)) as pilot:
        table = await open_pane(app, pilot, "6", "keys-table")

        await pilot.press("n")
        assert isinstance(app.screen, FormDialog)
        await pilot.press("enter")
        error = app.screen.query_one("#form-error", Static)
        assert "Name: required" in text(error)
        fill_in(app, name="alice", models="tiny*, qwen*", rpm="60", budget="100000")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, MessageDialog), "the new key")
        shown = app.screen
        key = text(shown.query_one("#copyable", Static))
        assert key.startswith("sk-llmgw-")
        assert "Shown this once" in text(shown.query_one("#warning", Static))
        (made,) = [k for k in cluster.api("/api/v1/keys") if k["name"] == "alice"]
        assert made["models"] == ["tiny*", "qwen*"] and made["rpm"] == 60
        assert made["state"] == "active" and "key" not in made
        await pilot.press("escape")
        assert not isinstance(app.screen, MessageDialog)

        await until(pilot, lambda: table.row_count, "the key's row")
        assert [str(c) for c in table.get_row_at(0)][:3] == [made["id"], "alice", "active"]
        await pilot.press("v")
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await until(
            pilot,
            lambda: cluster.api(f"/api/v1/keys/{made['id']}")["state"] == "revoked",
            "the key to be revoked",
        )
        await until(pilot, lambda: str(table.get_row_at(0)[2]) == "revoked", "revoked shown")
        await pilot.press("q")
