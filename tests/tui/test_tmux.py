"""The console in a real terminal: ``llmgw console`` in tmux against a running cluster,
read back with ``capture-pane`` and driven with ``send-keys``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.catalog import scheduled, serve_tiny
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NODE = "tmuxnode"


@pytest.fixture
def cluster(tmp_path: Path, binary: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        serve_tiny(c, binary, NODE)
        yield c
    finally:
        c.stop()


class Tmux:
    """One tmux server of the test's own (its own socket), so a user's is never touched."""

    def __init__(self, socket: str) -> None:
        if shutil.which("tmux") is None:
            pytest.fail("tmux is not installed (`make apt` installs it)")
        self.socket = socket

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=check,
        )

    def screen(self, target: str) -> str:
        return self("capture-pane", "-p", "-t", target).stdout

    def wait_screen(self, target: str, found: Callable[[str], bool], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen(target)
            if found(text):
                return text
            time.sleep(0.2)
        raise AssertionError(f"not on screen within {timeout} s:\n{text}")


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    t = Tmux(f"llmgw-test-{tmp_path.name}")
    try:
        yield t
    finally:
        t("kill-server", check=False)


def test_console_in_tmux_shows_the_node_and_the_models_replica(
    cluster: Cluster, tmux: Tmux
) -> None:
    replica = cluster.api("/api/v1/replicas")[0]
    # Unset: a pane started from the tests finds COLUMNS=80 and LINES=24 in its
    # environment, which Textual would believe over the pane's real size.
    command = (
        f"env -u COLUMNS -u LINES {sys.executable} -m llmgw console --data-dir {cluster.data_dir}"
    )
    tmux("new-session", "-d", "-s", "console", "-x", "120", "-y", "40", "-c", str(REPO), command)
    pid = int(tmux("display-message", "-p", "-t", "console", "#{pane_pid}").stdout)

    tmux.wait_screen("console", lambda s: "1/1 nodes Ready" in s, 30)
    # The Nodes screen names the node; the Overview only counts them.
    tmux("send-keys", "-t", "console", "2")
    tmux.wait_screen("console", lambda s: NODE in s, 10)
    tmux("send-keys", "-t", "console", "4")
    screen = tmux.wait_screen("console", lambda s: str(replica["replica_id"]) in s, 10)
    line = next(row for row in screen.splitlines() if str(replica["replica_id"]) in row)
    assert "tiny" in line and NODE in line and "ready" in line

    tmux("send-keys", "-t", "console", "q")
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the console did not exit on q"
    assert tmux("has-session", "-t", "console", check=False).returncode != 0
