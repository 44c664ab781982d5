"""Following the leader's SQLite store: its changes read after a sequence number, applied
on a standby, and consistent snapshots. Plain log shipping: who leads is decided
elsewhere; this only copies what the leader wrote.

Migration 0005 captures every write to a replicated table in the table ``changes``, in
the same transaction, numbered by ``seq`` (it only grows). A standby:

1. takes a ``snapshot`` of the leader's store and ``restore``s it into its own, which
   then knows the seq the snapshot ends at (``applied``);
2. asks for ``changes_after`` that seq and ``apply``s them, again and again, each batch
   in one transaction with the seq, leader and term it reached;
3. takes a new snapshot when told ``TooFarBehind`` (the leader pruned what it needed).

Every read and write here holds the store's write lock: the store shares one
connection, so a read in the middle of another caller's transaction would see, and
ship, rows that may yet be undone.

A seq is a place in one leader's log. Applying changes appends to the standby's own
``changes`` (its triggers fire too), so a promoted standby ships its own log, numbered
its own way: a follower whose leader changes takes a new snapshot.

Not replicated: the settings ``store.checked_at`` and ``local.*`` (each control plane's
own; a snapshot leaves the leader's out and a restore keeps the standby's), and
``replica_state``, this bookkeeping.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict, TypeGuard

import aiosqlite

from llmgw.server.store.base import StoreError
from llmgw.server.store.sqlite import SQLiteStore

# The tables migration 0005 captures; a change naming any other is refused.
REPLICATED = frozenset(
    {
        "settings",
        "admin_tokens",
        "join_tokens",
        "nodes",
        "audit",
        "models",
        "api_keys",
        "usage",
        "servers",
        "finetunes",
        "finetune_pieces",
        "session_revocations",
        "people",
        "orgs",
        "teams",
        "projects",
        "memberships",
        "person_tokens",
        "scim_users",
        "scim_groups",
        "jobs",
    }
)
Op = Literal["upsert", "delete"]
Value = str | int | float | None
# The settings no change carries, as the triggers of 0005 decide it.
_LOCAL_SETTINGS = "key = 'store.checked_at' OR substr(key, 1, 6) = 'local.'"


class ChangeJSON(TypedDict):
    """A change as the control planes' link carries it (``/peer/changes``)."""

    seq: int
    table: str
    op: Op
    pk: dict[str, Value]
    row: dict[str, Value] | None


class TooFarBehind(Exception):
    """The changes after the asked seq are no longer kept (pruned), or the asker is
    past this store's last change (its history is not this store's): it cannot catch
    up from changes and must take a new snapshot."""


class ChangeRefused(StoreError):
    """A change this store will not apply (an unknown table or column, a malformed
    key, a gap in the seqs, an older term): nothing of its batch was applied."""


def _scalar(value: object) -> TypeGuard[Value]:
    return value is None or type(value) in (str, int, float)


def _values(name: str, data: object) -> dict[str, Value]:
    if not isinstance(data, dict) or not data:
        raise ChangeRefused(f"a change's {name} must be a non-empty object, not {data!r}")
    out: dict[str, Value] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not _scalar(value):
            raise ChangeRefused(f"a change's {name} holds {key!r}: {value!r}")
        out[key] = value
    return out


@dataclass(frozen=True)
class Change:
    """One captured write: the whole row after an upsert, the key alone for a delete."""

    seq: int
    table: str
    op: Op
    pk: dict[str, Value]
    row: dict[str, Value] | None

    def as_json(self) -> ChangeJSON:
        row = None if self.row is None else dict(self.row)
        return {
            "seq": self.seq,
            "table": self.table,
            "op": self.op,
            "pk": dict(self.pk),
            "row": row,
        }

    @classmethod
    def from_json(cls, data: object) -> Change:
        """Read what ``as_json`` wrote; its shape is checked here, its table and columns
        against the store's schema when it is applied."""
        if not isinstance(data, dict):
            raise ChangeRefused(f"a change must be an object, not {data!r}")
        seq, table, op = data.get("seq"), data.get("table"), data.get("op")
        if type(seq) is not int or seq < 1:
            raise ChangeRefused(f"a change's seq must be a positive integer, not {seq!r}")
        if not isinstance(table, str):
            raise ChangeRefused(f"change {seq} names no table")
        pk = _values("pk", data.get("pk"))
        if op == "delete" and data.get("row") is None:
            return cls(seq, table, "delete", pk, None)
        if op == "upsert":
            return cls(seq, table, "upsert", pk, _values("row", data.get("row")))
        raise ChangeRefused(f"change {seq}: {op!r} with row {data.get('row')!r} is no change")


# ------------------------------------------------------------------------ helpers


def _name(name: str) -> str:
    """A table or column name for SQL, once checked against the schema."""
    return '"' + name.replace('"', '""') + '"'


@contextlib.asynccontextmanager
async def _transaction(store: SQLiteStore) -> AsyncIterator[aiosqlite.Connection]:
    """The connection, alone, in a transaction committed at the end or undone."""
    async with store.exclusive() as db:
        try:
            yield db
            await db.commit()
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                await db.rollback()
            raise


async def _count(db: aiosqlite.Connection, sql: str) -> int | None:
    """The one integer a query gives (a seq); None for no row, or NULL."""
    async with db.execute(sql) as cur:
        row = await cur.fetchone()
    return None if row is None or row[0] is None else int(row[0])


async def _latest(db: aiosqlite.Connection) -> int:
    # The AUTOINCREMENT counter, not MAX(seq): it stays when every change is pruned.
    seq = await _count(db, "SELECT seq FROM sqlite_sequence WHERE name = 'changes'")
    return int(seq or 0)


async def _state(db: aiosqlite.Connection) -> tuple[int, str | None, int | None]:
    async with db.execute("SELECT key, value FROM replica_state") as cur:
        state = {str(k): str(v) for k, v in await cur.fetchall()}
    term = state.get("term")
    return (
        int(state.get("applied_seq", 0)),
        state.get("leader"),
        None if term is None else int(term),
    )


async def _put_state(db: aiosqlite.Connection, values: dict[str, str]) -> None:
    await db.executemany(
        "INSERT INTO replica_state (key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        list(values.items()),
    )


@dataclass(frozen=True)
class _Table:
    columns: frozenset[str]
    key: tuple[str, ...]  # the primary key's columns, in order


async def _table(db: aiosqlite.Connection, table: str) -> _Table:
    if table not in REPLICATED:
        raise ChangeRefused(f"{table!r} is not a replicated table")
    async with db.execute("SELECT name, pk FROM pragma_table_info(?)", (table,)) as cur:
        rows = [(str(name), int(pk)) for name, pk in await cur.fetchall()]
    if not rows:
        raise ChangeRefused(f"this store has no table {table!r}")
    key = tuple(name for name, pk in sorted(rows, key=lambda r: r[1]) if pk)
    return _Table(frozenset(name for name, _ in rows), key)


def _check(change: Change, table: _Table) -> None:
    """Refuse a change that does not fit its table, before any SQL is built from it."""
    where = f"change {change.seq} ({change.table})"
    if set(change.pk) != set(table.key):
        raise ChangeRefused(f"{where}: key {sorted(change.pk)}, the table's is {list(table.key)}")
    if any(v is None for v in change.pk.values()):
        raise ChangeRefused(f"{where}: a key column is null")
    if change.row is not None:
        unknown = set(change.row) - table.columns
        if unknown:
            raise ChangeRefused(f"{where}: no column {', '.join(sorted(unknown))}")
        if any(change.row.get(k) != v for k, v in change.pk.items()):
            raise ChangeRefused(f"{where}: the row's key is not {change.pk}")
    key = change.pk.get("key")
    if change.table == "settings" and isinstance(key, str):
        if key == "store.checked_at" or key.startswith("local."):
            raise ChangeRefused(f"{where}: the setting {key!r} is not replicated")


async def _apply_one(db: aiosqlite.Connection, change: Change, table: _Table) -> None:
    name = _name(change.table)
    if change.row is None:
        match = " AND ".join(f"{_name(k)} = ?" for k in table.key)
        await db.execute(f"DELETE FROM {name} WHERE {match}", [change.pk[k] for k in table.key])
        return
    columns = list(change.row)
    rest = [c for c in columns if c not in table.key]
    on_conflict = (
        "DO UPDATE SET " + ", ".join(f"{_name(c)} = excluded.{_name(c)}" for c in rest)
        if rest
        else "DO NOTHING"
    )
    await db.execute(
        f"INSERT INTO {name} ({', '.join(_name(c) for c in columns)}) "
        f"VALUES ({', '.join('?' for _ in columns)}) "
        f"ON CONFLICT ({', '.join(_name(k) for k in table.key)}) {on_conflict}",
        [change.row[c] for c in columns],
    )


# ------------------------------------------------------------------------- leader


async def latest_seq(store: SQLiteStore) -> int:
    """The seq of the last change captured (0 before any)."""
    async with store.exclusive() as db:
        return await _latest(db)


async def changes_after(store: SQLiteStore, seq: int, limit: int = 1000) -> list[Change]:
    """Up to ``limit`` changes after ``seq``, oldest first; [] when none is newer.
    ``TooFarBehind`` when some after ``seq`` were pruned, or ``seq`` is past the last."""
    if seq < 0 or limit < 1:
        raise ValueError(f"changes after {seq}, {limit} at most: both must be positive")
    async with store.exclusive() as db:
        latest = await _latest(db)
        oldest = await _count(db, "SELECT MIN(seq) FROM changes")
        if seq > latest:
            raise TooFarBehind(
                f"asked for changes after {seq}, but this store's last is {latest}: "
                "the asker holds changes this store never made; take a new snapshot"
            )
        if seq < latest and (oldest is None or seq < int(oldest) - 1):
            kept = "none" if oldest is None else f"from {oldest}"
            raise TooFarBehind(
                f"asked for changes after {seq}, but those kept are {kept} (up to "
                f"{latest}); take a new snapshot"
            )
        async with db.execute(
            "SELECT seq, tbl, op, pk, row FROM changes WHERE seq > ? ORDER BY seq LIMIT ?",
            (seq, limit),
        ) as cur:
            rows = list(await cur.fetchall())
    return [
        Change.from_json(
            {
                "seq": s,
                "table": t,
                "op": op,
                "pk": json.loads(pk),
                "row": None if row is None else json.loads(row),
            }
        )
        for s, t, op, pk, row in rows
    ]


async def snapshot(store: SQLiteStore, dest: Path) -> int:
    """Write a consistent copy of the whole store to ``dest``, atomically; returns the
    seq of the last change in it. The copy keeps no changes (its follower starts from
    that seq), no ``replica_state`` and none of this control plane's own settings."""
    part = dest.with_name(dest.name + ".part")
    part.unlink(missing_ok=True)
    try:
        async with aiosqlite.connect(part) as copy:
            async with store.exclusive() as db:
                seq = await _latest(db)
                # pages=0: in one step, so the copy is of one moment.
                await db.backup(copy, pages=0)
            # DELETE keeps sqlite_sequence: the copy's latest_seq is still ``seq``.
            await copy.execute(f"DELETE FROM settings WHERE {_LOCAL_SETTINGS}")
            await copy.execute("DELETE FROM changes")
            await copy.execute("DELETE FROM replica_state")
            await copy.commit()
            await copy.execute("VACUUM")  # up to keep_rows changes' pages, not shipped
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return seq


async def prune(store: SQLiteStore, keep_seconds: float = 600.0, keep_rows: int = 100_000) -> int:
    """Delete the changes a follower is no longer expected to ask for; how many.

    A change is kept while either keeps it: it is younger than ``keep_seconds``, or one
    of the newest ``keep_rows``. So a burst of writes cannot push out what a follower
    fetched a moment ago, and a quiet store still keeps its recent history."""
    async with _transaction(store) as db:
        cur = await db.execute(
            "DELETE FROM changes WHERE seq <= (SELECT MAX(seq) FROM changes) - ? "
            "AND at <= (julianday('now') - 2440587.5) * 86400.0 - ?",
            (keep_rows, keep_seconds),
        )
        return int(cur.rowcount)


# ------------------------------------------------------------------------ standby


async def applied(store: SQLiteStore) -> tuple[int, str | None, int | None]:
    """The seq this store has applied up to, from which leader, in which term;
    (0, None, None) when it never applied any."""
    async with store.exclusive() as db:
        return await _state(db)


async def apply(store: SQLiteStore, changes: list[Change], leader: str, term: int) -> int:
    """Apply ``changes`` from ``leader`` in one transaction, in seq order, and record
    the seq reached with the leader and term; returns that seq.

    Changes already applied are skipped, so a batch delivered again changes nothing.
    The rest must follow on from the last applied without a gap, and come from this
    store's term or a later one; otherwise, or when any change does not fit its table,
    ``ChangeRefused`` and nothing of the batch is applied."""
    async with _transaction(store) as db:
        done, _, was_term = await _state(db)
        if was_term is not None and term < was_term:
            raise ChangeRefused(
                f"changes from {leader} in term {term}, but this store follows term {was_term}"
            )
        fresh = sorted((c for c in changes if c.seq > done), key=lambda c: c.seq)
        tables: dict[str, _Table] = {}
        for expected, change in enumerate(fresh, start=done + 1):
            if change.seq != expected:
                raise ChangeRefused(
                    f"change {expected} is missing (the batch goes on at {change.seq}); "
                    "ask for the changes after the last applied"
                )
            if change.table not in tables:
                tables[change.table] = await _table(db, change.table)
            _check(change, tables[change.table])
        for change in fresh:
            await _apply_one(db, change, tables[change.table])
        done = fresh[-1].seq if fresh else done
        await _put_state(db, {"applied_seq": str(done), "leader": leader, "term": str(term)})
    return done


async def mark(store: SQLiteStore, seq: int, leader: str, term: int) -> None:
    """Record that the store holds ``leader``'s changes up to ``seq`` in ``term``: after
    a restore, or with 0 so that the next start takes a new snapshot."""
    if seq < 0:
        raise ValueError(f"no change {seq}")
    async with _transaction(store) as db:
        await _put_state(db, {"applied_seq": str(seq), "leader": leader, "term": str(term)})


async def restore(store: SQLiteStore, source: Path) -> None:
    """Replace all the store holds by the snapshot at ``source``, in place: the open
    connection stays, so the process goes on with it. The store then has applied up to
    the snapshot's last change, from no leader yet; its own ``local.*`` settings are
    kept. The snapshot is first migrated to this version (in its file); one from a
    newer llmgw is refused (``StoreTooNew``) and the store left as it was."""
    if not source.is_file():
        raise StoreError(f"no snapshot at {source}")
    check = SQLiteStore(source)
    try:
        await check.open()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{source} is not a snapshot of a store: {exc}") from exc
    finally:
        await check.close()
    async with _transaction(store) as db:
        async with db.execute(f"SELECT key, value FROM settings WHERE {_LOCAL_SETTINGS}") as cur:
            own = [(str(k), str(v)) for k, v in await cur.fetchall()]
        async with aiosqlite.connect(source) as snap:
            await snap.backup(db, pages=0)
        await db.execute(f"DELETE FROM settings WHERE {_LOCAL_SETTINGS}")
        await db.executemany("INSERT INTO settings (key, value) VALUES (?, ?)", own)
        await db.execute("DELETE FROM replica_state")
        await _put_state(db, {"applied_seq": str(await _latest(db))})
