"""What only the SQLite backend does: numbered migrations run once at open, a rollback
journal, and a store that cannot be written (locked elsewhere, read-only, full) said so
by name, opened to be read, and written again once it can be.

A lock is held by a second connection in this process: ``BEGIN IMMEDIATE`` lets readers
in and keeps writers out, as a second control plane or a sqlite3 shell would.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiosqlite
import pytest

from llmgw.server.store import Audit, SQLiteStore, StoreError, StoreTooNew, StoreUnavailable
from llmgw.server.store import sqlite as sqlite_store
from llmgw.server.store.sqlite import migrations

LATEST = max(n for n, _ in migrations())


async def _store(path: Path) -> SQLiteStore:
    store = SQLiteStore(path)
    await store.open()
    return store


def applied(path: Path) -> dict[int, float]:
    """Each migration recorded in the file, and when it ran."""
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT version, applied_at FROM schema_migrations"))


def handles(path: Path) -> int:
    """How many files this process holds open on ``path`` (SQLite closes one late while
    another connection of the process holds a lock on it: count after it lets go)."""
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("needs /proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path))


@pytest.fixture
def impatient(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write meeting a lock fails at once, not after the 5 s the server waits."""
    connect = SQLiteStore._connect

    async def quick(self: SQLiteStore, read_only: bool = False) -> aiosqlite.Connection:
        db = await connect(self, read_only)
        if not read_only:
            await db.execute("PRAGMA busy_timeout=0")
        return db

    monkeypatch.setattr(SQLiteStore, "_connect", quick)


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A connection of "another process", ready to hold a lock on s.db."""
    other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    try:
        yield other
    finally:
        other.close()


def old_store(path: Path, upto: int) -> None:
    """A store as a version that shipped migrations up to ``upto`` left it."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL)")
        for number, sql in migrations():
            if number <= upto:
                db.executescript(sql)
                db.execute("INSERT INTO schema_migrations VALUES (?, 1.0)", (number,))
    db.close()


# ----------------------------------------------------------------------- migrations


def test_migrations_are_numbered_one_by_one() -> None:
    assert [n for n, _ in migrations()] == list(range(1, LATEST + 1))


async def test_migrations_run_once(tmp_path: Path) -> None:
    store = await _store(tmp_path / "s.db")
    await store.put_setting("a", "1")
    await store.close()
    first = applied(tmp_path / "s.db")
    assert sorted(first) == [n for n, _ in migrations()]
    store = await _store(tmp_path / "s.db")  # a second open must not re-run 0001
    assert await store.get_setting("a") == "1"
    assert applied(tmp_path / "s.db") == first  # nothing ran again, not even re-recorded
    # A rollback journal: WAL's memory-mapped index kills the process (SIGBUS) when its
    # file cannot be written; see store/sqlite.py.
    async with store.db.execute("PRAGMA journal_mode") as cur:
        assert (await cur.fetchone())[0] == "truncate"  # type: ignore[index]
    await store.close()


async def test_a_fresh_store_has_every_table(tmp_path: Path) -> None:
    store = await _store(tmp_path / "s.db")
    await store.close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        node_columns = {r[1] for r in db.execute("PRAGMA table_info(nodes)")}
    db.close()
    assert tables >= {
        "schema_migrations",
        "settings",
        "admin_tokens",
        "join_tokens",
        "nodes",
        "audit",
        "models",
        "api_keys",
        "usage",
    }
    assert {"cordoned", "draining", "labels"} <= node_columns  # from 0002
    assert max(applied(tmp_path / "s.db")) == LATEST


async def test_an_older_store_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    old_store(tmp_path / "s.db", upto=1)
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute(
            "INSERT INTO nodes (id, state, cert_serial, enrolled_at, facts) "
            "VALUES ('n1', 'Ready', 'abc', 1.0, '{\"cpu_count\": 4}')"
        )
        db.execute("INSERT INTO settings VALUES ('cluster', 'lab')")
    db.close()
    store = await _store(tmp_path / "s.db")
    try:
        assert sorted(applied(tmp_path / "s.db")) == list(range(1, LATEST + 1))
        assert applied(tmp_path / "s.db")[1] == 1.0  # 0001 was not run again
        assert await store.get_setting("cluster") == "lab"
        node = await store.get_node("n1")
        assert node is not None and node.facts == {"cpu_count": 4}
        assert (node.cordoned, node.draining, node.labels) == (False, False, {})
        # What the later migrations added works on the old rows.
        await store.set_node_scheduling("n1", True, False, {"a": "b"}, Audit("x", "y", "n1"))
        await store.put_model("m", {"source": "x"}, Audit("x", "model.put", "m"))
        node = await store.get_node("n1")
        assert node is not None and node.cordoned and node.labels == {"a": "b"}
    finally:
        await store.close()


async def test_a_store_from_a_newer_version_is_refused_and_left_as_it_is(
    tmp_path: Path,
) -> None:
    # A newer llmgw migrated it: its rows may mean what this version does not know, so
    # it is neither written nor served read-only; the message says what to do.
    store = await _store(tmp_path / "s.db")
    await store.put_setting("a", "1")
    await store.close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute("INSERT INTO schema_migrations VALUES (?, 2.0)", (LATEST + 1,))
    db.close()
    before = applied(tmp_path / "s.db")
    store = SQLiteStore(tmp_path / "s.db")
    with pytest.raises(StoreTooNew) as refused:
        await store.open()
    said = str(refused.value)
    assert f"migration {LATEST + 1}; this llmgw knows up to {LATEST}" in said
    assert "nothing was changed" in said and "run that newer llmgw" in said
    assert applied(tmp_path / "s.db") == before
    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("SELECT value FROM settings WHERE key = 'a'").fetchone() == ("1",)
    db.close()


async def test_a_failing_migration_is_undone_whole_and_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _store(tmp_path / "s.db")
    await store.put_setting("a", "1")
    await store.close()
    broken = LATEST + 1
    # Its first statement works, its second fails: the first must not stay.
    bad = "CREATE TABLE extra (x INTEGER);\nCREATE TABLE settings (x INTEGER);"
    shipped = migrations()
    monkeypatch.setattr(sqlite_store, "migrations", lambda: [*shipped, (broken, bad)])
    store = SQLiteStore(tmp_path / "s.db")
    with pytest.raises(StoreError, match=f"migration {broken:04d} failed"):
        await store.open()
    assert handles(tmp_path / "s.db") == 0  # refused and left nothing open
    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE name='extra'").fetchall() == []
    db.close()
    assert broken not in applied(tmp_path / "s.db")
    monkeypatch.setattr(sqlite_store, "migrations", lambda: shipped)
    store = await _store(tmp_path / "s.db")  # the fixed version opens it as it was
    try:
        assert await store.get_setting("a") == "1"
    finally:
        await store.close()


async def test_a_file_that_is_not_a_store_is_refused_and_left_closed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"not a database, whatever it is " * 200)
    store = SQLiteStore(path)
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        await store.open()
    # A connection left open has a thread that keeps the process from exiting.
    assert handles(path) == 0
    await store.close()


# ----------------------------------------------------------- a store not writable


async def test_a_store_locked_elsewhere_refuses_writes_by_name_and_recovers(
    tmp_path: Path,
) -> None:
    store = await _store(tmp_path / "s.db")
    await store.db.execute("PRAGMA busy_timeout=100")
    other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        await store.put_setting("a", "1")
    except StoreUnavailable as exc:
        assert "locked by another process" in str(exc) and "s.db" in str(exc)
    else:
        raise AssertionError("a write to a locked store went through")
    assert not store.writable().ok and "locked" in store.writable().problem
    other.execute("ROLLBACK")
    other.close()
    assert await store.check_writable() is True
    assert store.writable().ok
    await store.put_setting("a", "2")
    assert await store.get_setting("a") == "2"
    await store.close()


async def test_a_refused_change_is_undone_and_the_store_said_unwritable(
    tmp_path: Path, locked: sqlite3.Connection
) -> None:
    store = await _store(tmp_path / "s.db")
    await store.enroll_node("n1", "1", 1.0)
    await store.db.execute("PRAGMA busy_timeout=0")
    locked.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreUnavailable, match="locked by another process"):
        await store.put_model("m", {"source": "x"}, Audit("admin", "model.put", "m"))
    with pytest.raises(StoreUnavailable):
        await store.set_node_states([("n1", "Ready", "", 2.0)])
    assert not store.writable().ok
    locked.execute("ROLLBACK")
    # Nothing of either change is waiting to be committed by the next write.
    await store.put_setting("a", "1")
    assert store.writable().ok and store.writable().problem == ""
    assert await store.list_models() == [] and await store.audit_log() == []
    node = await store.get_node("n1")
    assert node is not None and node.state == "NotReady"
    await store.close()


def test_a_full_disk_is_said_as_such(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorname = "SQLITE_FULL"  # type: ignore[attr-defined]
    assert "is full" in store.describe(full) and "free space" in store.describe(full)


def test_each_refusal_is_said_with_its_fix(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorname = "SQLITE_BUSY"  # type: ignore[attr-defined]
    assert "locked by another process" in store.describe(busy)
    assert "second control plane" in store.describe(busy)
    readonly = sqlite3.OperationalError("attempt to write a readonly database")
    readonly.sqlite_errorname = "SQLITE_READONLY"  # type: ignore[attr-defined]
    said = store.describe(readonly)
    assert str(tmp_path / "s.db") in said and "cannot be written" in said and "chattr" in said


async def test_a_store_locked_at_start_is_read_then_written_once_it_can_be(
    tmp_path: Path, locked: sqlite3.Connection, impatient: None
) -> None:
    store = await _store(tmp_path / "s.db")
    await store.put_setting("a", "1")
    await store.close()
    locked.execute("BEGIN IMMEDIATE")
    store = await _store(tmp_path / "s.db")  # opens, to be read
    try:
        assert not store.writable().ok
        assert "locked by another process" in store.writable().problem
        assert await store.get_setting("a") == "1"
        # A write says the reason it was opened to be read, not "readonly database".
        with pytest.raises(StoreUnavailable, match="locked by another process"):
            await store.put_setting("a", "2")
        assert "locked by another process" in store.writable().problem
        assert await store.check_writable() is False  # still locked
        with pytest.raises(StoreUnavailable, match="locked by another process"):
            await store.audit("admin", "x", "y")
        locked.execute("ROLLBACK")

        # watch tries again by itself; stop it after its first try.
        stop = asyncio.Event()
        tries: list[bool] = []
        check = store.check_writable

        async def check_once() -> bool:
            tries.append(await check())
            stop.set()
            return tries[-1]

        store.check_writable = check_once  # type: ignore[method-assign]
        await store.watch(stop)
        assert tries == [True]
        assert store.writable().ok and store.writable().problem == ""
        await store.put_setting("a", "2")
        assert await store.get_setting("a") == "2"
    finally:
        await store.close()
    assert handles(tmp_path / "s.db") == 1  # the lock holder's: the read-only one is closed
    store = await _store(tmp_path / "s.db")
    assert await store.get_setting("a") == "2"
    await store.close()


async def test_a_store_locked_at_start_that_needs_migrating_is_refused(
    tmp_path: Path, locked: sqlite3.Connection, impatient: None
) -> None:
    old_store(tmp_path / "s.db", upto=1)
    locked.execute("BEGIN IMMEDIATE")
    store = SQLiteStore(tmp_path / "s.db")
    with pytest.raises(StoreError, match="needs migrating") as refused:
        await store.open()
    assert str(list(range(2, LATEST + 1))) in str(refused.value)
    assert "make it writable" in str(refused.value)
    locked.execute("ROLLBACK")  # SQLite closes a file late while this process holds a lock
    assert handles(tmp_path / "s.db") == 1  # only the lock holder's: nothing left open
    assert sorted(applied(tmp_path / "s.db")) == [1]


async def test_check_writable_on_a_healthy_store_keeps_everything(tmp_path: Path) -> None:
    store = await _store(tmp_path / "s.db")
    try:
        await store.put_setting("a", "1")
        assert await store.check_writable() is True
        assert store.writable().ok
        assert handles(tmp_path / "s.db") == 1  # the old connection was closed
        assert await store.get_setting("a") == "1"
        await store.put_setting("b", "2")
        assert await store.get_setting("b") == "2"
    finally:
        await store.close()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("chattr") is None, reason="chattr +i needs root"
)
async def test_a_store_that_stays_unwritable_is_said_once_however_often_it_is_tried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A write and the watch's probe fail on an immutable store with different words
    # ("attempt to write a readonly database", "unable to open database file"): the
    # probe's must not make the next write's the news again, once a retry.
    home = tmp_path / "data"
    home.mkdir()
    store = await _store(home / "s.db")
    files = [str(home), *map(str, sorted(home.glob("s.db*")))]
    subprocess.run(["chattr", "+i", *files], check=True)
    try:
        for _ in range(3):
            with pytest.raises(StoreUnavailable, match="cannot be written"):
                await store.put_setting("a", "1")
            assert await store.check_writable() is False
            assert not store.writable().ok
        said = [r for r in caplog.records if "the store cannot be written" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
    finally:
        subprocess.run(["chattr", "-i", *files], check=True)
    assert await store.check_writable() is True
    await store.put_setting("a", "2")
    assert await store.get_setting("a") == "2"
    await store.close()
