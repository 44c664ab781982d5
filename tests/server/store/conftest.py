"""The backends every store test runs against, and a store of each, opened as the server
opens it.

Adding a backend is one entry in ``BACKENDS``: how to open (or open again) the store
kept for one test, and what its driver raises when a change breaks a constraint (a
duplicate key, a missing required value).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.config import ServerConfig, StoreConfig
from llmgw.server.store import Store, open_store


@dataclass(frozen=True)
class Backend:
    name: str
    # Open the store kept for one test; called again with the same folder, it opens the
    # same store (what a restart of the control plane does).
    open: Callable[[Path], Awaitable[Store]]
    # What a change that breaks a uniqueness or NOT NULL constraint raises.
    conflict: type[Exception]


async def _open_sqlite(data_dir: Path) -> Store:
    config = ServerConfig(store=StoreConfig(backend="sqlite", dsn="store.db"))
    return await open_store(config, data_dir)


BACKENDS = [
    Backend("sqlite", _open_sqlite, sqlite3.IntegrityError),
]


async def audits(store: Store, limit: int = 100) -> list[tuple[str, str, str, str]]:
    """The audit trail as (actor, action, target, detail), newest first."""
    log = await store.audit_log(limit)
    return [(a["actor"], a["action"], a["target"], a["detail"]) for a in log]


@pytest.fixture(params=BACKENDS, ids=[b.name for b in BACKENDS])
def backend(request: pytest.FixtureRequest) -> Backend:
    b: Backend = request.param
    return b


@pytest.fixture
async def store(backend: Backend, tmp_path: Path) -> AsyncIterator[Store]:
    s = await backend.open(tmp_path)
    try:
        yield s
    finally:
        await s.close()
