"""The end-to-end tests' shared fixtures: a control plane running for one test, and the
tiny model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster
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
def model(tmp_path: Path) -> Path:
    """The tiny GGUF under the test's own directory, so the cluster's teardown finds the
    engines that serve it."""
    return write_tiny_model(tmp_path / "tiny.gguf")
