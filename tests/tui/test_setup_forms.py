"""The setup forms, driven by Pilot: ``server init`` makes a real data dir, and
``node add`` installs a real agent over a real sshd on loopback."""

from __future__ import annotations

import asyncio
import getpass
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Log, Static

from llmgw.cli import build_parser, init_hooks, main
from llmgw.client.admin import AdminClient
from llmgw.server.datadir import init
from llmgw.tui.nodeadd import NodeAddApp
from llmgw.tui.setup import SetupApp
from tests.e2e.cluster import Cluster, free_port

# The sshd and the node's prefix, as test_node_add starts and cleans them up.
from tests.e2e.test_node_add import Sshd, _nodes, prefix, sshd  # noqa: F401


def text(app: SetupApp | NodeAddApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def settle(pilot: Pilot[Any], done: Callable[[], object], timeout: float) -> None:
    for _ in range(int(timeout * 10)):
        await pilot.pause(0.1)
        if done():
            return
    raise AssertionError(f"the form did not finish within {timeout} s")


# --- server init -----------------------------------------------------------------------


async def test_setup_form_creates_a_data_dir_and_shows_its_token(tmp_path: Path) -> None:
    root = tmp_path / "cp"
    app = SetupApp(tmp_path / "elsewhere", init_hooks())
    async with app.run_test(size=(120, 40)) as pilot:
        assert "server.yaml" in text(app, "#summary") and "admin.token" in text(app, "#summary")
        app.query_one("#data-dir", Input).value = str(root)
        app.query_one("#listen", Input).value = "127.0.0.1:18080"
        app.query_one("#advertise", Input).value = "10.0.0.5, gpu-head"
        await pilot.pause()
        assert str(root) in text(app, "#summary")
        await pilot.click("#create")
        await settle(pilot, lambda: app.result is not None, 60)
        token = text(app, "#token")
        assert token == (root / "admin.token").read_text().strip()
        assert token.startswith("llmgw-admin-")
        done = text(app, "#done")
        assert str(root / "admin.token") in done and "shown once" in done
        assert "127.0.0.1:18080" in done and "10.0.0.5, gpu-head" in done
        await pilot.press("escape")
    assert app.return_value is not None and app.return_value.root == root
    for part in ("server.yaml", "admin.token", "store.db", "cluster.key", "pki/ca.crt"):
        assert (root / part).exists(), part
    config = (root / "server.yaml").read_text()
    assert "listen: 127.0.0.1:18080" in config and "gpu-head" in config


async def test_setup_form_refuses_an_existing_data_dir_and_changes_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cp"
    # init runs its own event loop; the test's is running.
    await asyncio.to_thread(init, root, listen="127.0.0.1:18081")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
    app = SetupApp(root, init_hooks())
    async with app.run_test(size=(120, 40)) as pilot:
        assert "will not be touched" in text(app, "#summary")
        await pilot.click("#create")
        error = app.query_one("#error", Static)
        await settle(pilot, lambda: error.display, 30)
        assert "is already initialised" in text(app, "#error")
        assert "nothing was changed" in text(app, "#error")
        assert app.result is None and not app.query_one("#token").display
        await pilot.press("escape")
    assert app.return_value is None
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
    assert after == before


def test_node_add_without_a_host_or_a_terminal_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["node", "add"])
    assert info.value.code == 2
    assert "the following arguments are required: host" in capsys.readouterr().err


# --- node add --------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.init()
    c.start_server()
    try:
        yield c
    finally:
        c.stop()


def node_add_form(cluster: Cluster, *options: str) -> NodeAddApp:
    client = AdminClient(f"http://{cluster.listen}", cluster.admin_token)
    return NodeAddApp(client, build_parser().parse_args(["node", "add", *options]))


def fill(app: NodeAddApp, **values: str) -> None:
    for key, value in values.items():
        app.query_one(f"#{key.replace('_', '-')}", Input).value = value


@pytest.mark.e2e
async def test_node_add_form_shows_each_step_until_ready(
    sshd: Sshd,  # noqa: F811
    cluster: Cluster,
    prefix: Path,  # noqa: F811
    zipapp: Path,
) -> None:
    app = node_add_form(
        cluster,
        "--zipapp",
        str(zipapp),
        "--timeout",
        "60",
        "--ssh-option",
        f"UserKnownHostsFile={sshd.known_hosts}",
    )
    async with app.run_test(size=(120, 40)) as pilot:
        fill(
            app,
            host="127.0.0.1",
            user=sshd.user,
            ssh_port=str(sshd.port),
            ssh_key=str(sshd.key),
            prefix=str(prefix),
            node_id="formnode",
        )
        await pilot.click("#add")
        await settle(pilot, lambda: text(app, "#state").startswith(("Ready", "Failed")), 180)
        lines = list(app.query_one("#progress", Log).lines)
        state = text(app, "#state")
        assert app.code == 0, f"{state}\n" + "\n".join(lines)
        assert state.startswith("Ready")
        steps = [line for line in lines if line.startswith("==> ")]
        assert steps[0].startswith("==> looking at")
        assert any("asking the control plane for a join token" in s for s in steps)
        assert any("running `llmgw doctor`" in s for s in steps)
        assert "node formnode is Ready" in lines[-1]
        await pilot.press("escape")
    assert app.return_value == 0
    assert _nodes(cluster)["formnode"]["state"] == "Ready"


@pytest.mark.e2e
async def test_node_add_form_shows_the_failure_and_its_reason(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Any zip will do: the form never gets past ssh.
    pyz = tmp_path / "llmgw.pyz"
    with zipfile.ZipFile(pyz, "w") as zf:
        zf.writestr("__main__.py", "")
    closed = free_port()
    app = node_add_form(cluster, "--zipapp", str(pyz))
    async with app.run_test(size=(120, 40)) as pilot:
        fill(
            app,
            host="127.0.0.1",
            user=getpass.getuser(),
            ssh_port=str(closed),
            prefix=str(tmp_path / "never"),
        )
        await pilot.press("enter")
        await settle(pilot, lambda: text(app, "#state").startswith("Failed"), 60)
        state = text(app, "#state")
        assert state.startswith("Failed: node add 127.0.0.1: looking at the node: ssh to ")
        assert f"port {closed} failed" in state and "Connection refused" in state
        assert str(app.query_one("#progress", Log).lines[0]).startswith("==> looking at")
        # The form stays, to fix a field and try again.
        assert not app.query_one("#add").disabled
        await pilot.press("escape")
    assert app.return_value == 1
    assert not (tmp_path / "never").exists()
