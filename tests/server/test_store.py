"""The SQLite store: migrations, tokens used once, nodes enrolled and re-enrolled."""

from __future__ import annotations

from pathlib import Path

from llmgw.server.store import JoinTokenRecord, SQLiteStore
from llmgw.server.store.sqlite import migrations


async def _store(path: Path) -> SQLiteStore:
    store = SQLiteStore(path)
    await store.open()
    return store


async def test_migrations_run_once(tmp_path: Path) -> None:
    store = await _store(tmp_path / "s.db")
    await store.put_setting("a", "1")
    await store.close()
    store = await _store(tmp_path / "s.db")  # a second open must not re-run 0001
    assert await store.get_setting("a") == "1"
    async with store.db.execute("SELECT version FROM schema_migrations") as cur:
        assert [r[0] for r in await cur.fetchall()] == [n for n, _ in migrations()]
    # A rollback journal: WAL's memory-mapped index kills the process (SIGBUS) when its
    # file cannot be written; see store/sqlite.py.
    async with store.db.execute("PRAGMA journal_mode") as cur:
        assert (await cur.fetchone())[0] == "truncate"  # type: ignore[index]
    await store.close()


async def test_join_token_is_used_once(tmp_path: Path) -> None:
    store = await _store(tmp_path / "s.db")
    rec = JoinTokenRecord("t1", "sealed1:x", 1.0, 100.0, "admin")
    await store.add_join_token(rec)
    assert await store.get_join_token("t1") == rec
    assert await store.use_join_token("t1", "n1", 5.0) is True
    assert await store.use_join_token("t1", "n2", 6.0) is False
    used = await store.get_join_token("t1")
    assert used is not None and (used.used_by, used.used_at) == ("n1", 5.0)
    assert await store.get_join_token("nope") is None
    await store.close()


async def test_nodes_enroll_register_and_states(tmp_path: Path) -> None:
    store = await _store(tmp_path / "s.db")
    await store.enroll_node("n1", "111", 1.0)
    node = await store.get_node("n1")
    assert node is not None and node.state == "NotReady" and node.facts is None
    await store.register_node("n1", "10.0.0.5", "0.1", {"cpu_count": 4}, 2.0)
    node = await store.get_node("n1")
    assert node is not None
    assert (node.state, node.address, node.facts) == ("Ready", "10.0.0.5", {"cpu_count": 4})
    await store.set_node_states([("n1", "NotReady", "missed 3 heartbeats", 9.0)])
    node = await store.get_node("n1")
    assert node is not None and (node.state, node.state_reason, node.last_seen) == (
        "NotReady",
        "missed 3 heartbeats",
        9.0,
    )
    # Enrolling again replaces the certificate and keeps what is known of the node.
    await store.enroll_node("n1", "222", 3.0)
    node = await store.get_node("n1")
    assert node is not None and node.cert_serial == "222" and node.facts == {"cpu_count": 4}
    assert [n.id for n in await store.list_nodes()] == ["n1"]
    await store.audit("admin", "node.enroll", "n1", "x")
    assert (await store.audit_log())[0]["target"] == "n1"
    await store.close()


async def test_a_store_locked_elsewhere_refuses_writes_by_name_and_recovers(
    tmp_path: Path,
) -> None:
    import sqlite3

    from llmgw.server.store import StoreUnavailable

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


def test_a_full_disk_is_said_as_such(tmp_path: Path) -> None:
    import sqlite3

    store = SQLiteStore(tmp_path / "s.db")
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorname = "SQLITE_FULL"  # type: ignore[attr-defined]
    assert "is full" in store.describe(full) and "free space" in store.describe(full)
