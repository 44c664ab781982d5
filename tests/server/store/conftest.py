"""The backends every store test runs against, and a store of each, opened as the server
opens it.

Adding a backend is one entry in ``BACKENDS``: how to open (or open again) the store
kept for one test, and what its driver raises when a change breaks a constraint (a
duplicate key, a missing required value).

PostgreSQL is a real server (``tests/support/postgres.py``), one per session, started by
the first test that needs it; each test gets a schema of its own (a database would take
a fifth of a second to make), named after its temporary folder, so opening that folder
again opens the same store.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from llmgw.config import ServerConfig, StoreConfig
from llmgw.server.store import Store, open_store
from tests.support.postgres import PostgresServer, missing, start_postgres


@dataclass(frozen=True)
class Backend:
    name: str
    # Open the store kept for one test; called again with the same folder, it opens the
    # same store (what a restart of the control plane does).
    open: Callable[[Path], Awaitable[Store]]
    # What a change that breaks a uniqueness or NOT NULL constraint raises.
    conflict: type[Exception]
    # The session fixture its server comes from, started once for every test that uses
    # the backend; None when the backend needs none.
    server: str | None = None
    # Remove what ``open`` kept for a folder, after its test (a file goes with the folder;
    # a server's schemas would pile up and slow what copies them, like a base backup).
    forget: Callable[[Path], None] | None = None


async def _open_sqlite(data_dir: Path) -> Store:
    config = ServerConfig(store=StoreConfig(backend="sqlite", dsn="store.db"))
    return await open_store(config, data_dir)


# The session's PostgreSQL, once the ``postgres`` fixture started it.
_postgres: list[PostgresServer] = []


def schema_for(data_dir: Path) -> str:
    """The schema kept for one test's folder."""
    return "t_" + hashlib.sha256(str(data_dir).encode()).hexdigest()[:24]


async def _open_postgres(data_dir: Path) -> Store:
    if not _postgres:
        raise RuntimeError("the postgres backend needs the `postgres` fixture")
    server = _postgres[0]
    schema = schema_for(data_dir)
    async with await psycopg.AsyncConnection.connect(server.dsn(), autocommit=True) as admin:
        await admin.execute(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
        )
    config = ServerConfig(store=StoreConfig(backend="postgres", dsn=server.schema_dsn(schema)))
    return await open_store(config, data_dir)


def _forget_postgres(data_dir: Path) -> None:
    if _postgres:
        _postgres[0].drop_schema(schema_for(data_dir))


BACKENDS = [
    Backend("sqlite", _open_sqlite, sqlite3.IntegrityError),
    Backend(
        "postgres",
        _open_postgres,
        psycopg.IntegrityError,
        server="postgres",
        forget=_forget_postgres,
    ),
]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL 15 for the session; its absence fails the tests, loudly."""
    problem = missing()
    if problem:
        pytest.fail(problem)
    server = start_postgres()
    _postgres.append(server)
    try:
        yield server
    finally:
        _postgres.remove(server)
        server.remove()


async def audits(store: Store, limit: int = 100) -> list[tuple[str, str, str, str]]:
    """The audit trail as (actor, action, target, detail), newest first."""
    log = await store.audit_log(limit)
    return [(a["actor"], a["action"], a["target"], a["detail"]) for a in log]


@pytest.fixture(params=BACKENDS, ids=[b.name for b in BACKENDS])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b: Backend = request.param
    if b.server:
        request.getfixturevalue(b.server)
    yield b
    if b.forget:
        b.forget(tmp_path)


@pytest.fixture
async def store(backend: Backend, tmp_path: Path) -> AsyncIterator[Store]:
    s = await backend.open(tmp_path)
    try:
        yield s
    finally:
        await s.close()
