"""The end-to-end tests' shared fixture: a control plane running for one test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.init()
    c.start_server()
    try:
        yield c
    finally:
        c.stop()
