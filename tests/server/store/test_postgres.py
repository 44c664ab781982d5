"""What only the PostgreSQL backend does: the same numbered migrations as SQLite, run
once under an advisory lock however many control planes open the store at once; a store
migrated by a newer llmgw refused; several hosts in the DSN and the writable one used;
and a server that cannot be reached, or only read (a replica), said so by name, never
by password, with the store written again once a primary answers.

The server is the session's (``conftest.postgres``); each test works in a schema of its
own. A replica of it, by streaming replication, is started once for this module; a TCP
proxy in front of a server cuts the link, or moves it to the replica, as a failover does
to a client.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from llmgw.config import ServerConfig, StoreConfig
from llmgw.server.store import Audit, StoreError, StoreTooNew, StoreUnavailable, open_store
from llmgw.server.store import postgres as postgres_store
from llmgw.server.store.postgres import LOCK, PostgresStore, migrations
from llmgw.server.store.sqlite import migrations as sqlite_migrations
from tests.server.store.conftest import schema_for
from tests.support.postgres import PostgresServer, TcpProxy, free_port, start_standby

LATEST = max(n for n, _ in migrations())
# Every table and column the contract reads, which both backends must have alike.
TABLES = [
    "schema_migrations",
    "settings",
    "admin_tokens",
    "join_tokens",
    "nodes",
    "audit",
    "models",
    "api_keys",
    "usage",
    "servers",
    "jobs",
]


@pytest.fixture
def schema(postgres: PostgresServer, tmp_path: Path) -> Iterator[str]:
    """An empty schema of the primary's, for this test alone."""
    name = schema_for(tmp_path)
    postgres.create_schema(name)
    yield name
    postgres.drop_schema(name)


@pytest.fixture
def dsn(postgres: PostgresServer, schema: str) -> str:
    return postgres.schema_dsn(schema)


@pytest.fixture(scope="module")
def standby(postgres: PostgresServer) -> Iterator[PostgresServer]:
    """A hot standby of the session's server: read-only, as a Patroni replica is."""
    server = start_standby(postgres)
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """``watch`` tries again every 50 ms, not every 2 s."""
    monkeypatch.setattr(postgres_store, "RETRY", 0.05)


async def _open(dsn: str) -> PostgresStore:
    store = PostgresStore(dsn)
    await store.open()
    return store


def applied(dsn: str) -> dict[int, float]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT version, applied_at FROM schema_migrations").fetchall()
    return {int(v): float(at) for v, at in rows}


def rows(dsn: str, table: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(table))
        ).fetchall()


def tables(dsn: str) -> dict[str, list[str]]:
    """Each table of the DSN's schema, with its columns in order."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def sessions(server: PostgresServer, application_name: str) -> int:
    with server.admin() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    return int(str(row[0])) if row else 0


async def no_sessions(server: PostgresServer, application_name: str) -> bool:
    """Whether every session of that name has ended (a closed one ends a moment later)."""
    for _ in range(250):
        if sessions(server, application_name) == 0:
            return True
        await asyncio.sleep(0.02)
    return False


async def watch_until_writable(store: PostgresStore, timeout: float = 10) -> None:
    stop = asyncio.Event()
    watching = asyncio.create_task(store.watch(stop))
    try:
        async with asyncio.timeout(timeout):
            while not store.writable().ok:
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await watching


# ----------------------------------------------------------------------- migrations


def test_both_backends_have_the_same_migration_numbers() -> None:
    # A schema is at the same number on either backend: a migration SQLite needs and
    # PostgreSQL does not (0005, change capture) is there as a comment.
    assert [n for n, _ in migrations()] == [n for n, _ in sqlite_migrations()]
    assert [n for n, _ in migrations()] == list(range(1, LATEST + 1))


async def test_a_fresh_store_has_the_tables_and_columns_sqlite_has(
    dsn: str, tmp_path: Path
) -> None:
    store = await _open(dsn)
    await store.close()
    sqlite = await open_store(ServerConfig(store=StoreConfig(dsn="s.db")), tmp_path)
    await sqlite.close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        lite = {t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")] for t in TABLES}
    db.close()
    assert {t: c for t, c in tables(dsn).items() if t in TABLES} == lite
    assert sorted(applied(dsn)) == list(range(1, LATEST + 1))


async def test_stores_opening_at_once_migrate_once_under_the_lock(
    postgres: PostgresServer, dsn: str
) -> None:
    # Three control planes start at once on an empty database. The lock is held here
    # first, so all three are seen waiting for it before any migrates.
    async with await psycopg.AsyncConnection.connect(postgres.dsn(), autocommit=True) as holder:
        await holder.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
        opening = [asyncio.create_task(_open(dsn)) for _ in range(3)]
        async with asyncio.timeout(10):
            while True:
                cur = await holder.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                row = await cur.fetchone()
                if row is not None and row[0] == 3:
                    break
                await asyncio.sleep(0.01)
        assert "schema_migrations" not in tables(dsn)  # none went past the lock
        await holder.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
    stores = await asyncio.gather(*opening)
    try:
        # All three opened: the two that waited found everything done (each migration
        # run twice would have failed on its CREATE TABLE), and each is recorded once.
        assert sorted(applied(dsn)) == list(range(1, LATEST + 1))
        await stores[0].put_setting("a", "1")
        assert [await s.get_setting("a") for s in stores] == ["1", "1", "1"]
        assert all(s.writable().ok for s in stores)
    finally:
        for s in stores:
            await s.close()
    first = applied(dsn)
    again = await _open(dsn)  # a later start runs nothing, records nothing
    await again.close()
    assert applied(dsn) == first


async def test_an_older_store_is_migrated_and_keeps_its_rows(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
            "applied_at DOUBLE PRECISION NOT NULL)"
        )
        conn.execute(migrations()[0][1].encode())
        conn.execute("INSERT INTO schema_migrations VALUES (1, 1.0)")
        conn.execute(
            "INSERT INTO nodes (id, state, cert_serial, enrolled_at, facts) "
            "VALUES ('n1', 'Ready', 'abc', 1.0, '{\"cpu_count\": 4}')"
        )
        conn.execute("INSERT INTO settings VALUES ('cluster', 'lab')")
    store = await _open(dsn)
    try:
        assert sorted(applied(dsn)) == list(range(1, LATEST + 1))
        assert applied(dsn)[1] == 1.0  # 0001 was not run again
        assert await store.get_setting("cluster") == "lab"
        node = await store.get_node("n1")
        assert node is not None and node.facts == {"cpu_count": 4}
        assert (node.cordoned, node.draining, node.labels) == (False, False, {})
        await store.set_node_scheduling("n1", True, False, {"a": "b"}, Audit("x", "y", "n1"))
        node = await store.get_node("n1")
        assert node is not None and node.cordoned and node.labels == {"a": "b"}
    finally:
        await store.close()


async def test_a_store_from_a_newer_version_is_refused_and_left_as_it_is(
    postgres: PostgresServer, dsn: str
) -> None:
    store = await _open(dsn)
    await store.put_setting("a", "1")
    await store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (%s, 2.0)", (LATEST + 1,))
    before, settings = applied(dsn), rows(dsn, "settings")
    with pytest.raises(StoreTooNew) as refused:
        await _open(dsn + " application_name=too-new")
    said = str(refused.value)
    assert f"migration {LATEST + 1}; this llmgw knows up to {LATEST}" in said
    assert "nothing was changed" in said and "run that newer llmgw" in said
    assert f"127.0.0.1:{postgres.port}" in said
    assert applied(dsn) == before
    assert rows(dsn, "settings") == settings  # not even store.checked_at was written
    assert ("a", "1") in settings
    assert await no_sessions(postgres, "too-new")  # refused, and left nothing open


async def test_a_failing_migration_is_undone_whole_and_refused(
    postgres: PostgresServer, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = LATEST + 1
    # Its first statement works, its second fails: the first must not stay. On an empty
    # database every pending migration goes with it: they run in one transaction.
    bad = "CREATE TABLE extra (x INTEGER);\nCREATE TABLE settings (x INTEGER);"
    shipped = migrations()
    monkeypatch.setattr(postgres_store, "migrations", lambda: [*shipped, (broken, bad)])
    with pytest.raises(StoreError, match=f"migration {broken:04d} failed"):
        await _open(dsn + " application_name=broken")
    assert tables(dsn) == {}
    assert await no_sessions(postgres, "broken")
    monkeypatch.setattr(postgres_store, "migrations", lambda: shipped)
    store = await _open(dsn)  # the fixed version migrates it from nothing
    await store.put_setting("a", "1")
    await store.close()
    monkeypatch.setattr(postgres_store, "migrations", lambda: [*shipped, (broken, bad)])
    with pytest.raises(StoreError, match=f"migration {broken:04d} failed"):
        await _open(dsn)
    assert "extra" not in tables(dsn) and broken not in applied(dsn)
    monkeypatch.setattr(postgres_store, "migrations", lambda: shipped)
    store = await _open(dsn)
    try:
        assert await store.get_setting("a") == "1"
    finally:
        await store.close()


# ------------------------------------------------------------------ where it connects


@pytest.mark.parametrize("form", ["keywords", "uri"])
async def test_the_writable_host_of_several_is_used(
    postgres: PostgresServer, standby: PostgresServer, schema: str, form: str
) -> None:
    # A member that is down, a replica, then the primary: as a Patroni cluster's DSN
    # lists them, in any order.
    dead = free_port()
    ports = [dead, standby.port, postgres.port]
    if form == "uri":
        hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
        dsn = (
            f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"
            f"&options=-csearch_path%3D{schema}"
        )
    else:
        dsn = (
            f"host=127.0.0.1,127.0.0.1,127.0.0.1 port={','.join(map(str, ports))} "
            f"user=postgres dbname=postgres options=-csearch_path={schema} "
            "target_session_attrs=read-write"
        )
    config = ServerConfig(store=StoreConfig(backend="postgres", dsn=dsn))
    store = await open_store(config, Path("/nonexistent"))  # no data dir is read
    try:
        assert isinstance(store, PostgresStore) and store.writable().ok
        await store.put_setting("a", form)
    finally:
        await store.close()
    with psycopg.connect(postgres.schema_dsn(schema)) as conn:
        assert conn.execute("SELECT value FROM settings WHERE key = 'a'").fetchone() == (form,)
    # With the primary gone from the list there is no writable host: said, by each.
    only = f"host=127.0.0.1,127.0.0.1 port={dead},{standby.port} target_session_attrs=read-write"
    with pytest.raises(StoreUnavailable) as refused:
        await _open(only + " user=postgres dbname=postgres")
    said = str(refused.value)
    assert f"127.0.0.1:{dead},127.0.0.1:{standby.port}/postgres" in said


async def test_an_unreachable_server_is_named_and_its_password_is_not() -> None:
    port = free_port()
    for dsn in (
        f"host=127.0.0.1 port={port} user=llmgw password=s3cret-pw dbname=llmgw",
        f"postgresql://llmgw:s3cret-pw@127.0.0.1:{port}/llmgw",
    ):
        config = ServerConfig(store=StoreConfig(backend="postgres", dsn=dsn))
        with pytest.raises(StoreUnavailable) as refused:
            await open_store(config, Path("/nonexistent"))
        said = str(refused.value)
        assert f"127.0.0.1:{port}/llmgw" in said and "cannot be reached" in said
        assert "store.dsn" in said
        assert "s3cret" not in said
    # A DSN libpq cannot read is refused without quoting it: it may hold a password.
    with pytest.raises(StoreError) as unread:
        PostgresStore("host=db password=s3cret pw")
    assert "s3cret" not in str(unread.value) and "store.dsn" in str(unread.value)


async def test_a_sqlite_path_given_as_the_dsn_is_refused_as_such() -> None:
    config = ServerConfig(store=StoreConfig(backend="postgres"))  # dsn left at store.db
    with pytest.raises(StoreError, match="neither a libpq DSN"):
        await open_store(config, Path("/nonexistent"))


# ---------------------------------------------------- a link lost, a replica, a failover


async def test_a_session_ended_while_idle_is_replaced_unseen(
    postgres: PostgresServer, dsn: str
) -> None:
    # A restart of PostgreSQL or a pooler's timeout ends an idle session: the next read
    # or change goes on a new one, nothing was sent on the old.
    store = await _open(dsn + " application_name=idle")
    try:
        await store.put_setting("a", "1")
        assert postgres.disconnect("idle") == 1
        assert await store.get_setting("a") == "1"
        assert postgres.disconnect("idle") == 1
        await store.put_setting("a", "2")
        assert store.writable().ok
        assert await store.get_setting("a") == "2"
    finally:
        await store.close()
    assert await no_sessions(postgres, "idle")


async def test_a_lost_link_refuses_writes_by_name_and_watch_connects_again(
    postgres: PostgresServer, schema: str, quick: None
) -> None:
    async with TcpProxy(postgres.port) as link:
        dsn = f"host=127.0.0.1 port={link.port} user=postgres password=pw-x dbname=postgres"
        store = await _open(f"{dsn} options=-csearch_path={schema}")
        try:
            await store.put_model("m", {"source": "x"}, Audit("admin", "model.put", "m"))
            link.cut()
            with pytest.raises(StoreUnavailable) as refused:
                await store.put_setting("a", "1")
            said = str(refused.value)
            assert f"127.0.0.1:{link.port}/postgres" in said and "cannot be reached" in said
            assert "pw-x" not in said
            assert not store.writable().ok and "cannot be reached" in store.writable().problem
            # While watch is on it, a change fails at once, and a read says the same.
            with pytest.raises(StoreUnavailable, match="cannot be reached"):
                await store.audit("admin", "x", "y")
            with pytest.raises(StoreUnavailable, match="cannot be reached"):
                await store.list_models()
            link.restore()
            await watch_until_writable(store)
            assert store.writable().problem == ""
            assert [m.name for m in await store.list_models()] == ["m"]
            await store.put_setting("a", "2")
            assert await store.get_setting("a") == "2"
            assert [a["action"] for a in await store.audit_log()] == ["model.put"]
        finally:
            await store.close()


async def test_a_failover_is_followed_from_replica_to_primary(
    postgres: PostgresServer, standby: PostgresServer, schema: str, dsn: str, quick: None
) -> None:
    # The link moves to a replica (the old primary came back demoted), then to the
    # primary: writes are refused as read-only meanwhile, reads go on.
    store = await _open(dsn)  # migrates the schema on the primary
    await store.close()
    async with TcpProxy(postgres.port) as link:
        store = await _open(
            f"host=127.0.0.1 port={link.port} user=postgres dbname=postgres "
            f"options=-csearch_path={schema}"
        )
        try:
            await store.put_setting("a", "1")
            postgres.wait_replayed_by(standby)
            link.cut()
            link.restore(standby.port)
            with pytest.raises(StoreUnavailable) as refused:
                await store.put_setting("a", "2")
            said = str(refused.value)
            assert "read-only" in said and f"127.0.0.1:{link.port}" in said
            assert "target_session_attrs=read-write" in said
            assert not store.writable().ok and "read-only" in store.writable().problem
            assert await store.get_setting("a") == "1"  # the replica is read
            with pytest.raises(StoreUnavailable, match="read-only"):
                await store.put_setting("a", "2")  # refused again, nothing half-done
            link.cut()
            link.restore(postgres.port)
            await watch_until_writable(store)
            await store.put_setting("a", "3")
            assert await store.get_setting("a") == "3"
        finally:
            await store.close()


async def test_a_replica_whose_schema_is_current_is_opened_to_be_read(
    postgres: PostgresServer, standby: PostgresServer, schema: str, dsn: str
) -> None:
    store = await _open(dsn)
    await store.put_setting("a", "1")
    await store.close()
    postgres.wait_replayed_by(standby)
    replica = await _open(standby.schema_dsn(schema))
    try:
        assert not replica.writable().ok
        assert f"127.0.0.1:{standby.port}/postgres is read-only" in replica.writable().problem
        assert await replica.get_setting("a") == "1"
        with pytest.raises(StoreUnavailable, match="read-only"):
            await replica.put_setting("a", "2")
    finally:
        await replica.close()


async def test_a_replica_whose_schema_needs_migrating_is_refused(
    postgres: PostgresServer, standby: PostgresServer, schema: str
) -> None:
    postgres.wait_replayed_by(standby)  # the empty schema is there too
    with pytest.raises(StoreError, match="needs migrating") as refused:
        await _open(standby.schema_dsn(schema) + " application_name=replica")
    assert f"migrations {list(range(1, LATEST + 1))}" in str(refused.value)
    assert "read-only" in str(refused.value)
    assert await no_sessions(standby, "replica")
    with psycopg.connect(standby.schema_dsn(schema)) as conn:
        assert conn.execute(
            sql.SQL("SELECT to_regclass({})").format(sql.Literal(f"{schema}.settings"))
        ).fetchone() == (None,)


# ------------------------------------------------------------------ the leader's lease


async def test_the_leaders_lease_is_held_by_one_renewed_taken_when_expired_and_fences(
    dsn: str,
) -> None:
    a, b = await _open(dsn), await _open(dsn)
    try:
        first = await a.take_lease("cp-a", 30)
        assert first.held_by("cp-a") and first.term == 1
        # Held: another cannot take it, and is told who holds it in which term.
        other = await b.take_lease("cp-b", 30)
        assert not other.held_by("cp-b") and (other.holder, other.term) == ("cp-a", 1)
        # Renewed by its holder: the same term, a later expiry.
        again = await a.take_lease("cp-a", 60)
        assert again.term == 1 and again.expires_at > first.expires_at
        # A leading control plane writes only while it holds the lease of its term.
        a.fence = ("cp-a", 1)
        await a.put_setting("by", "cp-a")
        await a.release_lease("cp-a")  # a clean stop gives it up at once
        taken = await b.take_lease("cp-b", 0.5)
        assert taken.held_by("cp-b") and taken.term == 2
        with pytest.raises(postgres_store.Fenced, match="no longer holds the leader's lease"):
            await a.put_setting("by", "stale cp-a")
        assert await b.get_setting("by") == "cp-a"
        # An expired lease goes to whoever asks next, with the next term.
        deadline = asyncio.get_running_loop().time() + 10
        while not (late := await a.take_lease("cp-a", 30)).held_by("cp-a"):
            assert asyncio.get_running_loop().time() < deadline, late
            await asyncio.sleep(0.1)
        assert late.term == 3
    finally:
        await a.close()
        await b.close()
