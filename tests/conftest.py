"""Fixtures shared across the test tree: the zipapp and llama-server, built once a
session."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/llmgw.pyz as `make zipapp` builds it, written to a temp dir, not to dist/."""
    if shutil.which("make") is None:
        pytest.fail("`make` is not installed; the zipapp is built by `make zipapp`")
    target = tmp_path_factory.mktemp("zipapp") / "llmgw.pyz"
    # Through make, so a broken Makefile target fails here and not first in a release.
    proc = subprocess.run(
        ["make", "-s", "zipapp", f"ZIPAPP={target}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 or not target.is_file():
        pytest.fail(f"`make zipapp` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return target


@pytest.fixture(scope="session")
def binary() -> Path:
    """The llama-server `make llama-server` builds (from its cache when there)."""
    from tests.support.engines import llama_server_binary

    return llama_server_binary()


@pytest.fixture(scope="session", autouse=True)
def no_firewall_table_left() -> Iterator[None]:
    """Agents of tests that run a cluster as `server init` writes it (the demo, `node add`)
    keep llmgw's nftables table in this machine's own namespace, as root agents do: one
    that was not there when the session began is taken out when it ends, so the machine
    is left as it was found (a real agent's table on this machine is left alone)."""
    able = os.geteuid() == 0 and shutil.which("nft") is not None

    def present() -> bool:
        listed = subprocess.run(["nft", "list", "table", "inet", "llmgw"], capture_output=True)
        return listed.returncode == 0

    before = able and present()
    yield
    if able and not before and present():
        subprocess.run(["nft", "delete", "table", "inet", "llmgw"], capture_output=True)
