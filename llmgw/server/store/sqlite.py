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
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from llmgw.server.store.base import (
    Audit,
    Params,
    StoreError,
    StoreTooNew,
    StoreUnavailable,
    Writability,
)
from llmgw.server.store.statements import INSERT_AUDIT, PUT_SETTING, SQLStore, audit_row

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
    await db.execute(PUT_SETTING, ("store.checked_at", str(time.time())))
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


class SQLiteStore(SQLStore):
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
            # The writes' reason stands: the probe's own words (another error of the same
            # fault) would make each next write's failure news again, said once a retry.
            # A store that cannot be taken (written by a newer llmgw meanwhile) is news.
            probed = self.describe(exc)
            self._problem = probed if isinstance(exc, StoreError) else self._problem or probed
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

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    # ------------------------------------------------ the steps statements.py runs on

    async def _read(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        async with self.db.execute(sql, params) as cur:
            return [dict(r) for r in await cur.fetchall()]

    async def _execute(self, sql: str, params: Params) -> int:
        async def work(db: aiosqlite.Connection) -> int:
            cur = await db.execute(sql, params)
            return int(cur.rowcount)

        return await self._write(work)

    async def _execute_many(self, sql: str, rows: Sequence[Params]) -> None:
        async def work(db: aiosqlite.Connection) -> None:
            await db.executemany(sql, rows)

        await self._write(work)

    async def _audited(
        self, sql: str, params: Params, audit: Audit, *, if_changed: bool = False
    ) -> int:
        async def work(db: aiosqlite.Connection) -> int:
            cur = await db.execute(sql, params)
            if cur.rowcount or not if_changed:
                await db.execute(
                    INSERT_AUDIT,
                    audit_row(audit),
                )
            return int(cur.rowcount)

        return await self._write(work)

    async def _audited_all(self, steps: Sequence[tuple[str, Params]], audit: Audit) -> None:
        async def work(db: aiosqlite.Connection) -> None:
            for sql, params in steps:
                await db.execute(sql, params)
            await db.execute(INSERT_AUDIT, audit_row(audit))

        await self._write(work)
