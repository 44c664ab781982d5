"""The in-process admin pages' fixtures: a control plane over a fresh data dir and its
SQLite store, its pages and API behind an httpx client (``inprocess.Site``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.store import open_store
from tests.server.pages.inprocess import Site


@pytest.fixture
def data_dir(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "data"
    _, token = init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    return root, token


@pytest.fixture
async def site(data_dir: tuple[Path, str]) -> AsyncIterator[Site]:
    root, token = data_dir
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    cp = ControlPlane(data, config, store)
    await cp.load()
    transport = httpx.ASGITransport(app=cp.admin_app())
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
            yield Site(cp, client, token)
    finally:
        await cp.gateway.close()
        await cp.inspector.close()
        await store.close()
