"""The in-process admin pages' fixtures: a control plane over a fresh data dir and its
SQLite store, its pages and API behind an httpx client (``inprocess.Site``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.server.pages.inprocess import Site
from tests.support.inprocessplane import fresh_data_dir, loaded_plane


@pytest.fixture
def data_dir(tmp_path: Path) -> tuple[Path, str]:
    return fresh_data_dir(tmp_path)


@pytest.fixture
async def site(data_dir: tuple[Path, str]) -> AsyncIterator[Site]:
    root, token = data_dir
    async with loaded_plane(root) as cp:
        transport = httpx.ASGITransport(app=cp.admin_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
            yield Site(cp, client, token)
