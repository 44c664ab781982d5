"""Fixtures shared across the test tree: the zipapp and llama-server, built once a
run; and how the run is shared out among pytest-xdist's workers.

`make test` runs the suite on several workers (``-n``, ``--dist loadgroup``). Tests
that share something only one of them may hold at a time run in one worker, in order,
by their ``xdist_group`` (``GROUPS``, set here at collection): the one Patroni cluster
and the one PostgreSQL server of a run, the admin pages' cluster and browser, this
machine's own nftables table, and its munged and Slurm daemons. An end-to-end module
keeps its tests together too (its namespaces, ports and fixtures are made for one test
at a time); everything else is shared out test by test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock
from hypothesis import settings

REPO = Path(__file__).resolve().parent.parent

# Property tests check what code answers, not how fast: with the whole suite on two
# cores an example may wait its turn far past hypothesis' 200 ms deadline.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# Test files (from the repository root) that run in one worker, in one group each.
GROUPS = {
    # The run's one Patroni cluster (tests/support/patroni.py shared_cluster).
    "tests/e2e/test_ha_patroni.py": "patroni",
    "tests/support/test_patroni_harness.py": "patroni",
    # One PostgreSQL server for the store's tests (tests/server/store/conftest.py).
    "tests/server/store/": "postgres",
    # One cluster serving the admin pages and one browser at a time.
    "tests/e2e/test_pages.py": "pages",
    "tests/e2e/test_pages_playground.py": "pages",
    "tests/e2e/test_pages_usage.py": "pages",
    "tests/e2e/test_pages_nodes.py": "pages",
    "tests/e2e/test_pages_org.py": "pages",
    "tests/e2e/test_pages_tools.py": "pages",
    # Agents started as `server init` writes them keep llmgw's table in this machine's
    # own namespace (no_firewall_table_left).
    "tests/e2e/test_demo.py": "host-firewall",
    "tests/e2e/test_node_add.py": "host-firewall",
    # This machine's one munged (/run/munge, /etc/munge/munge.key) and the Slurm daemons
    # the tests start: the module joins the tests marked "slurm" elsewhere (the agent's,
    # the files'), never beside them.
    "tests/e2e/test_slurm.py": "slurm",
    # One run of the real trainer serves the module's tests (its fixture).
    "tests/agent/finetune/test_trainer_run.py": "finetune-trainer",
}


def group_of(path: str) -> str | None:
    """The xdist group of a test file, by its path from the repository root."""
    for prefix, group in GROUPS.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return group
    if path.startswith("tests/e2e/"):
        return path  # a module's own namespaces, ports and fixtures: one worker
    return None


# First: xdist's own hook (loadgroup) reads the marker to put the group into the
# test's id, which is what sends a group to one worker; marked after it, a group is
# spread over every worker.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(Path(item.path).relative_to(REPO).as_posix())
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this run shares (pytest's base temp of the run)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/llmgw.pyz as `make zipapp` builds it, written to a temp dir, not to dist/:
    once a run, by the first worker that needs it (the others wait for it)."""
    if shutil.which("make") is None:
        pytest.fail("`make` is not installed; the zipapp is built by `make zipapp`")
    root = run_root(tmp_path_factory)
    target = root / "zipapp" / "llmgw.pyz"
    with FileLock(str(root / "zipapp.lock")):
        if target.is_file():
            return target
        target.parent.mkdir(exist_ok=True)
        # Through make, so a broken Makefile target fails here and not first in a release.
        # Built beside the target and moved into place, so no worker sees half of it.
        building = target.with_name("building.pyz")
        proc = subprocess.run(
            ["make", "-s", "zipapp", f"ZIPAPP={building}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0 or not building.is_file():
            pytest.fail(f"`make zipapp` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        building.rename(target)
    return target


@pytest.fixture(scope="session")
def binary() -> Path:
    """The llama-server `make llama-server` builds (from its cache when there)."""
    from tests.support.engines import llama_server_binary

    return llama_server_binary()


@pytest.fixture(autouse=True)
def no_firewall_table_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Agents of tests that run a cluster as `server init` writes it (the demo, `node add`)
    keep llmgw's nftables table in this machine's own namespace, as root agents do: one
    that was not there when such a test began is taken out when it ends, so the machine
    is left as it was found (a real agent's table on this machine is left alone). Those
    tests are the ``host-firewall`` group, so no other worker's test is running one."""
    group = group_of(Path(request.node.path).relative_to(REPO).as_posix())
    able = group == "host-firewall" and os.geteuid() == 0 and shutil.which("nft") is not None

    def present() -> bool:
        listed = subprocess.run(["nft", "list", "table", "inet", "llmgw"], capture_output=True)
        return listed.returncode == 0

    before = able and present()
    yield
    if able and not before and present():
        subprocess.run(["nft", "delete", "table", "inet", "llmgw"], capture_output=True)


@pytest.fixture(autouse=True)
def no_ctl_login(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """ctl reads what `llmgw login` kept (``client/credentials.py``) before the data dir:
    every test, and every command it runs, reads a file of the run's (none unless a
    test writes it), never the user's own ~/.config/llmgw/ctl.json."""
    monkeypatch.setenv("LLMGW_CTL_CONFIG", str(run_root(tmp_path_factory) / "no-login.json"))
