"""A real control plane in this process, over a fresh data dir and its SQLite store:
nothing listens (its config names port 1). Loaded as ``server run`` loads it, and its
gateway, inspector and store closed after."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.store import open_store


def fresh_data_dir(tmp_path: Path) -> tuple[Path, str]:
    """A data dir ``server init`` made, and its admin token."""
    root = tmp_path / "data"
    _, token = init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    return root, token


@asynccontextmanager
async def loaded_plane(root: Path) -> AsyncIterator[ControlPlane]:
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    cp = ControlPlane(data, config, store)
    try:
        await cp.load()
        yield cp
    finally:
        await cp.gateway.close()
        await cp.inspector.close()
        await store.close()
