"""The control plane's state: one interface, SQLite by default, PostgreSQL for HA.

``PostgresStore`` is imported only when the configuration asks for it (``open_store``,
or ``llmgw.server.store.postgres``): psycopg is not loaded otherwise."""

from __future__ import annotations

from pathlib import Path

from llmgw.config import ServerConfig
from llmgw.server.store.base import (
    ApiKeyRecord,
    Audit,
    JoinTokenRecord,
    ModelRecord,
    NodeRecord,
    ServerRecord,
    Store,
    StoreError,
    StoreTooNew,
    StoreUnavailable,
    Writability,
)
from llmgw.server.store.sqlite import SQLiteStore

__all__ = [
    "ApiKeyRecord",
    "Audit",
    "JoinTokenRecord",
    "ModelRecord",
    "NodeRecord",
    "SQLiteStore",
    "ServerRecord",
    "Store",
    "StoreError",
    "StoreTooNew",
    "StoreUnavailable",
    "Writability",
    "open_store",
]


async def open_store(config: ServerConfig, data_dir: Path) -> Store:
    """Open (and migrate) the store the configuration names."""
    if config.store.backend == "sqlite":
        path = Path(config.store.dsn)
        store = SQLiteStore(path if path.is_absolute() else data_dir / path)
        await store.open()
        return store
    if config.store.backend == "postgres":
        from llmgw.server.store.postgres import PostgresStore

        pg = PostgresStore(config.store.connection())
        await pg.open()
        return pg
    raise StoreError(
        f"store backend {config.store.backend!r} is not available in this version; "
        "use 'sqlite' or 'postgres' in server.yaml"
    )
