"""The admin app of a real control plane, called in process over its SQLite store:
nothing listens (its config names port 1)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw.server.app import ControlPlane
from tests.support.inprocessplane import fresh_data_dir, loaded_plane


@pytest.fixture
def data_dir(tmp_path: Path) -> tuple[Path, str]:
    return fresh_data_dir(tmp_path)


@pytest.fixture
async def plane(
    data_dir: tuple[Path, str],
) -> AsyncIterator[tuple[ControlPlane, httpx.AsyncClient]]:
    """The control plane, loaded, and a client of its admin app with the admin token."""
    root, token = data_dir
    async with loaded_plane(root) as cp:
        transport = httpx.ASGITransport(app=cp.admin_app())
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://cp", headers=headers
        ) as client:
            yield cp, client
