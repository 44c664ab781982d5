"""The end-to-end tests' shared fixtures: a control plane running for one test, a leader
and its standby, and the tiny model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from tests.e2e.catalog import scheduled
from tests.e2e.cluster import Cluster
from tests.e2e.pages import Site, running_site
from tests.e2e.standbys import standby_of
from tests.support.browser import launched
from tests.support.tinymodel import write_tiny_model


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.init()
    c.start_server()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Cluster, Cluster]]:
    """A leader with the catalog tests' short periods and a standby of it (SQLite)."""
    leader = scheduled(tmp_path / "a")
    standby: Cluster | None = None
    try:
        standby = standby_of(leader, tmp_path / "b")
        yield leader, standby
    finally:
        if standby is not None:
            standby.stop()
        leader.stop()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """The tiny GGUF under the test's own directory, so the cluster's teardown finds the
    engines that serve it."""
    return write_tiny_model(tmp_path / "tiny.gguf")


@pytest.fixture(scope="session")
def pages_site(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> Iterator[Site]:
    """One cluster serving ``tiny`` for every admin page test of the session."""
    yield from running_site(tmp_path_factory.mktemp("pages"), binary)


@pytest.fixture(scope="module")
def pages_browser() -> Iterator[Browser]:
    """A headless chromium for a module's admin page tests. Not one for the session:
    Playwright's sync API keeps an event loop running in this thread while it lives, and
    every async test after it would fail to start its own."""
    with launched() as browser:
        yield browser
