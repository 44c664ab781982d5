"""The admin app of a real control plane, called in process over its SQLite store:
nothing listens (its config names port 1)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.server.app import ControlPlane
from tests.support.inprocessplane import fresh_data_dir, loaded_plane
from tests.support.ports import free_port


@pytest.fixture
def data_dir(tmp_path: Path) -> tuple[Path, str]:
    return fresh_data_dir(tmp_path)


@pytest.fixture
async def plane(
    data_dir: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ControlPlane, httpx.AsyncClient]]:
    """The control plane, loaded, and a client of its admin app with the admin token.
    Its hub is a closed port on loopback: a route that asks the hub (the explorer, the
    planner) is refused at once, and no test reaches the internet."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    root, token = data_dir
    async with loaded_plane(root) as cp:
        transport = httpx.ASGITransport(app=cp.admin_app())
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://cp", headers=headers
        ) as client:
            yield cp, client
