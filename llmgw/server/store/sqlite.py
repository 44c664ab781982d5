"""The SQLite backend: one connection, numbered migrations run at open.

The journal is a rollback journal (``TRUNCATE``), not WAL. WAL keeps its index in a
memory-mapped ``-shm`` file: when that file cannot be written (made immutable, or its
disk failing), the process dies of SIGBUS on the next write. With a rollback journal a
store that cannot be written fails each write with an error, reads go on, and the
control plane says so (``writable()``), keeps serving from memory, and recovers by
itself when the store can be written again (``watch``). Writes are few and batched
(node states once a second, usage every two), so WAL's speed is not missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

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

log = logging.getLogger("llmgw.store")
T = TypeVar("T")
# How often a store that cannot be written is tried again.
RETRY = 2.0
# SQLite's words for "this store cannot be written now", by the error's first name.
_FULL = ("SQLITE_FULL",)
_LOCKED = ("SQLITE_BUSY", "SQLITE_LOCKED")
_UNWRITABLE = ("SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_PERM")


async def _touch(db: aiosqlite.Connection) -> None:
    """A write of no consequence, committed: proof the store takes writes."""
    await db.execute(
        "INSERT INTO settings (key, value) VALUES ('store.checked_at', ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (str(time.time()),),
    )
    await db.commit()


async def _rollback(db: aiosqlite.Connection) -> None:
    try:
        await db.rollback()
    except sqlite3.Error:
        pass


def migrations() -> list[tuple[int, str]]:
    """Every migration shipped, as (number, SQL), in order."""
    out: list[tuple[int, str]] = []
    folder = resources.files("llmgw.server.store").joinpath("migrations")
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            out.append((int(name[:4]), entry.read_text()))
    return sorted(out)


class SQLiteStore(Store):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self._problem = ""
        self._read_only = False
        # Every caller shares one connection, so one transaction at a time: a change whose
        # statements interleave with another's is committed, or undone, by the other.
        self._writing = asyncio.Lock()

    @property
    def db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise StoreError("the store is not open")
        return self._db

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[aiosqlite.Connection]:
        """The connection, with no change under way and none begun until the block ends:
        for work that must see only committed rows (shipping changes, a snapshot) or
        that commits or undoes its own transaction."""
        async with self._writing:
            yield self.db

    async def open(self) -> None:
        """Open and migrate; a store that exists but cannot be written is opened to be
        read, and said to be unwritable until ``watch`` finds it writable."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = await self._connect()
            await self._migrate()
            await _touch(self._db)  # learn now whether it can be written
        except StoreTooNew:
            await self.close()  # never served, not even to be read: its rows mean more
            raise
        except (sqlite3.Error, StoreError) as exc:
            if not self.path.exists():
                raise StoreError(f"the store {self.path} cannot be created: {exc}") from exc
            if self._db is not None:
                await self._db.close()
                self._db = None
            self._db = await self._connect(read_only=True)
            self._read_only = True
            try:
                pending = [n for n, _ in migrations() if n not in await self._applied()]
            except BaseException:
                await self.close()  # a connection left open keeps the process from exiting
                raise
            if pending:
                await self.close()
                raise StoreError(
                    f"the store {self.path} cannot be written ({exc}) and needs migrating "
                    f"to this version (migrations {pending}); make it writable and start again"
                ) from exc
            self._problem = self.describe(exc)
            log.error("the store cannot be written; serving from what it holds: %s", self._problem)

    async def _connect(self, read_only: bool = False) -> aiosqlite.Connection:
        if read_only:
            # immutable: read without the locks and journal a read-only file cannot take.
            db = await aiosqlite.connect(f"file:{self.path}?immutable=1", uri=True)
        else:
            db = await aiosqlite.connect(self.path)
        db.row_factory = aiosqlite.Row
        if not read_only:
            try:
                await db.execute("PRAGMA busy_timeout=5000")
                await db.execute("PRAGMA journal_mode=TRUNCATE")  # waits for a lock held elsewhere
                await db.execute("PRAGMA synchronous=NORMAL")
            except BaseException:
                # Closed here, or its thread outlives the store and the process cannot exit.
                await db.close()
                raise
        return db

    async def _applied(self) -> set[int]:
        try:
            async with self.db.execute("SELECT version FROM schema_migrations") as cur:
                return {int(row[0]) for row in await cur.fetchall()}
        except sqlite3.OperationalError:
            return set()

    # --------------------------------------------------------- can it be written

    def writable(self) -> Writability:
        return Writability(not self._problem, self._problem)

    def describe(self, exc: BaseException) -> str:
        """What a failed write says to a person: the problem and its fix."""
        name = str(getattr(exc, "sqlite_errorname", "") or "")
        where = self.path
        if name.startswith(_FULL):
            return f"the disk holding {where} is full ({exc}): free space there"
        if name.startswith(_LOCKED):
            return (
                f"{where} is locked by another process ({exc}): is a second control plane "
                "or a sqlite3 shell holding it?"
            )
        return (
            f"{where} cannot be written ({exc}): let the control plane's user write it and "
            "its directory (ls -l; lsattr, chattr -i), and check the disk (dmesg)"
        )

    def _storage_error(self, exc: sqlite3.Error) -> bool:
        name = str(getattr(exc, "sqlite_errorname", "") or "")
        return self._read_only or name.startswith((*_FULL, *_LOCKED, *_UNWRITABLE))

    async def _write(self, work: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        """One change in one transaction: committed whole, or undone and, when the store
        itself refused, ``StoreUnavailable`` saying why and what to do."""
        async with self._writing:
            db = self.db
            if self._read_only:
                # Opened to be read: SQLite's own "readonly database" would hide the reason
                # (a lock, a full disk) and give the wrong fix.
                raise StoreUnavailable(self._problem)
            try:
                result = await work(db)
                await db.commit()
            except sqlite3.Error as exc:
                await _rollback(db)
                if not self._storage_error(exc):
                    raise
                problem = self.describe(exc)
                if problem != self._problem:
                    log.error("the store cannot be written: %s", problem)
                self._problem = problem
                raise StoreUnavailable(problem) from exc
            except BaseException:
                # Cancelled half-way (a shutdown, a timeout): undone here, or the next
                # change's commit would write this one's half.
                await _rollback(db)
                raise
        if self._problem:
            log.warning("the store can be written again")
            self._problem = ""
        return result

    async def check_writable(self) -> bool:
        """Try a write on a fresh connection (one opened while the file could not be
        written stays read-only) and keep that connection when it works."""
        try:
            db = await self._connect()
        except sqlite3.Error:
            return False
        try:
            await self._migrate_on(db)
            await _touch(db)
        except (sqlite3.Error, StoreError) as exc:
            await db.close()
            self._problem = self.describe(exc)
            return False
        old, self._db = self._db, db
        self._read_only = False
        if self._problem:
            log.warning("the store can be written again")
        self._problem = ""
        if old is not None:
            # Let a query already under way on the old connection finish first.
            await asyncio.sleep(1.0)
            await old.close()
        return True

    async def watch(self, stop: asyncio.Event) -> None:
        """While the store cannot be written, try it again every RETRY seconds."""
        while not stop.is_set():
            if self._problem:
                await self.check_writable()
            try:
                await asyncio.wait_for(stop.wait(), timeout=RETRY)
            except TimeoutError:
                pass

    async def _migrate(self) -> None:
        await self._migrate_on(self.db)

    async def _migrate_on(self, db: aiosqlite.Connection) -> None:
        await db.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
            "applied_at REAL NOT NULL)"
        )
        async with db.execute("SELECT version FROM schema_migrations") as cur:
            done = {row[0] for row in await cur.fetchall()}
        known = max((n for n, _ in migrations()), default=0)
        if done and max(done) > known:
            raise StoreTooNew(
                f"the store {self.path} was written by a newer llmgw (its schema is at "
                f"migration {max(done)}; this llmgw knows up to {known}); nothing was "
                "changed: run that newer llmgw, or restore the copy taken before upgrading"
            )
        for number, sql in migrations():
            if number in done:
                continue
            try:
                await db.executescript(
                    "BEGIN;\n" + sql + f"\nINSERT INTO schema_migrations VALUES ({number}, "
                    f"{time.time()});\nCOMMIT;"
                )
            except Exception as exc:
                await db.rollback()
                raise StoreError(f"migration {number:04d} failed: {exc}") from exc

    async def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        """One statement as one change; the rows it touched."""

        async def work(db: aiosqlite.Connection) -> int:
            cur = await db.execute(sql, params)
            return int(cur.rowcount)

        return await self._write(work)

    async def _execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        async def work(db: aiosqlite.Connection) -> None:
            await db.executemany(sql, rows)

        await self._write(work)

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def get_setting(self, key: str) -> str | None:
        async with self.db.execute("SELECT value FROM settings WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def put_setting(self, key: str, value: str) -> None:
        await self._execute(
            "INSERT INTO settings (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    async def add_admin_token(self, token_id: str, token_hash: str) -> None:
        await self._execute(
            "INSERT INTO admin_tokens (id, token_hash, created_at) VALUES (?, ?, ?)",
            (token_id, token_hash, time.time()),
        )

    async def admin_token_hashes(self) -> list[str]:
        async with self.db.execute("SELECT token_hash FROM admin_tokens") as cur:
            return [str(r[0]) for r in await cur.fetchall()]

    async def add_join_token(self, record: JoinTokenRecord) -> None:
        await self._execute(
            "INSERT INTO join_tokens (id, secret_sealed, created_at, expires_at, created_by) "
            "VALUES (?, ?, ?, ?, ?)",
            (
                record.id,
                record.secret_sealed,
                record.created_at,
                record.expires_at,
                record.created_by,
            ),
        )

    async def get_join_token(self, token_id: str) -> JoinTokenRecord | None:
        async with self.db.execute("SELECT * FROM join_tokens WHERE id = ?", (token_id,)) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        return JoinTokenRecord(**dict(row))

    async def use_join_token(self, token_id: str, node_id: str, at: float) -> bool:
        touched = await self._execute(
            "UPDATE join_tokens SET used_at = ?, used_by = ? WHERE id = ? AND used_at IS NULL",
            (at, node_id, token_id),
        )
        return touched == 1

    async def enroll_node(self, node_id: str, cert_serial: str, at: float) -> None:
        await self._execute(
            "INSERT INTO nodes (id, state, state_reason, cert_serial, enrolled_at) "
            "VALUES (?, 'NotReady', 'enrolled, not yet connected', ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET cert_serial = excluded.cert_serial, "
            "enrolled_at = excluded.enrolled_at",
            (node_id, cert_serial, at),
        )

    @staticmethod
    def _node(row: aiosqlite.Row) -> NodeRecord:
        data = dict(row)
        data["facts"] = json.loads(data["facts"] or "{}") or None
        data["labels"] = json.loads(data.get("labels") or "{}")
        data["cordoned"] = bool(data.get("cordoned"))
        data["draining"] = bool(data.get("draining"))
        return NodeRecord(**data)

    async def list_nodes(self) -> list[NodeRecord]:
        async with self.db.execute("SELECT * FROM nodes ORDER BY id") as cur:
            return [self._node(r) for r in await cur.fetchall()]

    async def get_node(self, node_id: str) -> NodeRecord | None:
        async with self.db.execute("SELECT * FROM nodes WHERE id = ?", (node_id,)) as cur:
            row = await cur.fetchone()
        return None if row is None else self._node(row)

    async def register_nodes(
        self, records: list[tuple[str, str | None, str, dict[str, Any], float]]
    ) -> None:
        if not records:
            return
        await self._execute_many(
            "UPDATE nodes SET address = ?, version = ?, facts = ?, registered_at = ?, "
            "last_seen = ?, state = 'Ready', state_reason = '' WHERE id = ?",
            [
                (address, version, json.dumps(facts), at, at, node_id)
                for node_id, address, version, facts, at in records
            ],
        )

    async def set_node_states(self, changes: list[tuple[str, str, str, float | None]]) -> None:
        if not changes:
            return
        await self._execute_many(
            "UPDATE nodes SET state = ?, state_reason = ?, "
            "last_seen = COALESCE(?, last_seen) WHERE id = ?",
            [(state, reason, seen, node_id) for node_id, state, reason, seen in changes],
        )

    async def _audited(
        self, sql: str, params: tuple[Any, ...], audit: Audit, *, if_changed: bool = False
    ) -> int:
        """One change and its audit entry in one transaction; the rows it touched.
        With ``if_changed`` a change that touched nothing is not audited."""

        async def work(db: aiosqlite.Connection) -> int:
            cur = await db.execute(sql, params)
            if cur.rowcount or not if_changed:
                await db.execute(
                    "INSERT INTO audit (at, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
                    (time.time(), audit.actor, audit.action, audit.target, audit.detail),
                )
            return int(cur.rowcount)

        return await self._write(work)

    async def set_node_scheduling(
        self, node_id: str, cordoned: bool, draining: bool, labels: dict[str, str], audit: Audit
    ) -> None:
        await self._audited(
            "UPDATE nodes SET cordoned = ?, draining = ?, labels = ? WHERE id = ?",
            (int(cordoned), int(draining), json.dumps(labels, sort_keys=True), node_id),
            audit,
        )

    async def list_models(self) -> list[ModelRecord]:
        async with self.db.execute("SELECT * FROM models ORDER BY name") as cur:
            rows = await cur.fetchall()
        return [
            ModelRecord(r["name"], json.loads(r["spec"]), r["created_at"], r["updated_at"])
            for r in rows
        ]

    async def put_model(self, name: str, spec: dict[str, Any], audit: Audit) -> None:
        now = time.time()
        await self._audited(
            "INSERT INTO models (name, spec, created_at, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET spec = excluded.spec, "
            "updated_at = excluded.updated_at",
            (name, json.dumps(spec, sort_keys=True), now, now),
            audit,
        )

    async def delete_model(self, name: str, audit: Audit) -> bool:
        sql = "DELETE FROM models WHERE name = ?"
        return bool(await self._audited(sql, (name,), audit, if_changed=True))

    async def add_api_key(self, record: ApiKeyRecord, audit: Audit) -> None:
        await self._audited(
            "INSERT INTO api_keys (id, name, key_hash, models, rpm, tpm, budget, "
            "expires_at, created_at, priority) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.id,
                record.name,
                record.key_hash,
                json.dumps(list(record.models)),
                record.rpm,
                record.tpm,
                record.budget,
                record.expires_at,
                record.created_at,
                record.priority,
            ),
            audit,
        )

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        async with self.db.execute("SELECT * FROM api_keys ORDER BY created_at") as cur:
            rows = await cur.fetchall()
        out = []
        for row in rows:
            data = dict(row)
            data["models"] = tuple(json.loads(data["models"] or "[]"))
            out.append(ApiKeyRecord(**data))
        return out

    async def revoke_api_key(self, key_id: str, at: float, audit: Audit) -> bool:
        sql = "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL"
        return bool(await self._audited(sql, (at, key_id), audit, if_changed=True))

    async def set_api_key_priority(self, key_id: str, priority: int, audit: Audit) -> bool:
        sql = "UPDATE api_keys SET priority = ? WHERE id = ?"
        return bool(await self._audited(sql, (priority, key_id), audit, if_changed=True))

    async def add_usage(self, rows: list[tuple[str, str, str, str, int, int, int]]) -> None:
        if not rows:
            return
        await self._execute_many(
            "INSERT INTO usage (day, key_id, model, replica, requests, prompt_tokens, "
            "completion_tokens) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(day, key_id, model, replica) DO UPDATE SET "
            "requests = requests + excluded.requests, "
            "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
            "completion_tokens = completion_tokens + excluded.completion_tokens",
            rows,
        )

    async def usage(self, since_day: str) -> list[dict[str, Any]]:
        async with self.db.execute(
            "SELECT * FROM usage WHERE day >= ? ORDER BY day, key_id, model, replica",
            (since_day,),
        ) as cur:
            return [dict(r) for r in await cur.fetchall()]

    async def put_server(self, record: ServerRecord, audit: Audit) -> None:
        await self._audited(
            "INSERT INTO servers (name, cert_serial, api_address, agent_address, peer_address, "
            "joined_at, removed_at) VALUES (?, ?, ?, ?, ?, ?, NULL) "
            "ON CONFLICT(name) DO UPDATE SET cert_serial = excluded.cert_serial, "
            "api_address = excluded.api_address, agent_address = excluded.agent_address, "
            "peer_address = excluded.peer_address, joined_at = excluded.joined_at, "
            "removed_at = NULL",
            (
                record.name,
                record.cert_serial,
                record.api_address,
                record.agent_address,
                record.peer_address,
                record.joined_at,
            ),
            audit,
        )

    async def list_servers(self) -> list[ServerRecord]:
        async with self.db.execute("SELECT * FROM servers ORDER BY name") as cur:
            return [ServerRecord(**dict(r)) for r in await cur.fetchall()]

    async def remove_server(self, name: str, at: float, audit: Audit) -> bool:
        sql = "UPDATE servers SET removed_at = ? WHERE name = ? AND removed_at IS NULL"
        return bool(await self._audited(sql, (at, name), audit, if_changed=True))

    async def audit(self, actor: str, action: str, target: str, detail: str = "") -> None:
        await self._execute(
            "INSERT INTO audit (at, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
            (time.time(), actor, action, target, detail),
        )

    async def audit_log(self, limit: int = 100) -> list[dict[str, Any]]:
        async with self.db.execute("SELECT * FROM audit ORDER BY id DESC LIMIT ?", (limit,)) as cur:
            return [dict(r) for r in await cur.fetchall()]
