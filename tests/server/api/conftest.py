"""The admin app of a real control plane, called in process over its SQLite store:
nothing listens (its config names port 1)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.store import open_store


@pytest.fixture
def data_dir(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "data"
    _, token = init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    return root, token


@pytest.fixture
async def plane(
    data_dir: tuple[Path, str],
) -> AsyncIterator[tuple[ControlPlane, httpx.AsyncClient]]:
    """The control plane, loaded, and a client of its admin app with the admin token."""
    root, token = data_dir
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    cp = ControlPlane(data, config, store)
    await cp.load()
    transport = httpx.ASGITransport(app=cp.admin_app())
    headers = {"authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://cp", headers=headers
        ) as client:
            yield cp, client
    finally:
        await cp.gateway.close()
        await cp.inspector.close()
        await store.close()
