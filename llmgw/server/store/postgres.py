"""The PostgreSQL backend: one connection, numbered migrations run at open under a lock.

For control planes in HA: the DSN may list every member of a Patroni cluster with
``target_session_attrs=read-write``, and libpq connects to whichever is the primary.
PostgreSQL replicates itself, so nothing here captures changes (``migrations_pg/0005``).

One connection, and one transaction on it at a time, as in SQLite: the control plane's
writes are few and batched, and a statement of one change interleaved with another's
would be committed, or undone, by the other. Reads take the same turn, so none lands in
the middle of a change.

A lost connection or a read-only server (a replica, a demoted primary: SQLSTATE 25006)
makes writes raise ``StoreUnavailable`` saying what and what to do; ``watch`` connects
again every RETRY seconds (libpq tries the DSN's hosts in order) and the store takes
writes once a primary answers. Reads connect again by themselves: a read is safe to try
twice, a write is not (its commit may have landed before the connection broke).

Migrations run at open in one transaction holding ``pg_advisory_xact_lock(LOCK)``:
control planes starting at once wait for the first, then find nothing left to run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from llmgw.server.store.base import (
    Audit,
    Params,
    StoreError,
    StoreTooNew,
    StoreUnavailable,
    Writability,
)
from llmgw.server.store.statements import INSERT_AUDIT, PUT_SETTING, SQLStore, audit_row, pyformat

log = logging.getLogger("llmgw.store")
T = TypeVar("T")
Conn = psycopg.AsyncConnection[dict[str, Any]]
# How often a store that cannot be written is tried again.
RETRY = 2.0
# The advisory lock migrations hold: any constant no other program of the database uses.
LOCK = 0x6C6C6D67_73746F72  # "llmgstor"
# Connection settings the DSN may set itself; these are used where it does not. Short
# keepalives, so a primary gone silent (a partition) is noticed in seconds, not hours.
DEFAULTS = {
    "connect_timeout": "5",
    "application_name": "llmgw",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}
_READ_ONLY = "25006"  # read_only_sql_transaction
_DISK_FULL = "53100"


def migrations() -> list[tuple[int, str]]:
    """Every migration shipped, as (number, SQL), in order."""
    out: list[tuple[int, str]] = []
    folder = resources.files("llmgw.server.store").joinpath("migrations_pg")
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            out.append((int(name[:4]), entry.read_text()))
    return sorted(out)


def _where(params: Mapping[str, object]) -> str:
    """The servers and database a DSN names, as ``host:port,host:port/dbname``: what a
    message may show (never the password)."""
    hosts = str(params.get("host") or params.get("hostaddr") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    servers = []
    for host, port in zip(hosts, ports, strict=False):
        host = host or "localhost"
        servers.append(host if host.startswith("/") else f"{host}:{port or 5432}")
    return f"{','.join(servers)}/{params.get('dbname') or params.get('user') or ''}"


@dataclass(frozen=True)
class Lease:
    """Who holds the leader's lease, in which term, until when (the server's clock)."""

    holder: str | None
    term: int
    expires_at: float
    now: float

    def held_by(self, name: str) -> bool:
        return self.holder == name and self.expires_at > self.now


class Fenced(StoreUnavailable):
    """A write of a control plane that no longer holds the leader's lease: refused."""


_NOW = "extract(epoch from clock_timestamp())::double precision"


class PostgresStore(SQLStore):
    def __init__(self, dsn: str) -> None:
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.Error:
            # libpq's own words may quote a piece of the DSN, the password among them.
            raise StoreError(
                "store.dsn is neither a libpq DSN ('host=db1,db2 dbname=llmgw user=llmgw "
                "target_session_attrs=read-write') nor a postgresql:// URI: fix it in "
                "server.yaml"
            ) from None
        self.dsn = dsn
        self.where = _where(params)
        self._password = str(params.get("password") or "")
        self._conninfo = make_conninfo(
            dsn, **{k: v for k, v in DEFAULTS.items() if k not in params}
        )
        self._conn: Conn | None = None
        self._open = False
        self._problem = ""
        # One transaction at a time on the one connection (see the module's docstring).
        self._turn = asyncio.Lock()
        # While this control plane leads: (its name, its term). Every write checks, in
        # its own transaction, that the lease is still so held; none lands after it
        # passed to another.
        self.fence: tuple[str, int] | None = None

    async def open(self) -> None:
        """Connect and migrate. A read-only server whose schema is current is opened to be
        read, and said to be unwritable until ``watch`` finds a primary."""
        try:
            conn = await self._connect()
        except psycopg.Error as exc:
            raise StoreUnavailable(self.describe(exc, retrying=False)) from exc
        try:
            await self._migrate(conn)
            await self._touch(conn)
        except psycopg.Error as exc:
            if not self._storage_error(exc):
                await conn.close()
                raise
            if conn.closed or conn.broken:
                await conn.close()
                raise StoreUnavailable(self.describe(exc, retrying=False)) from exc
            self._problem = self.describe(exc)
            log.error("the store cannot be written; serving from what it holds: %s", self._problem)
        except BaseException:
            await conn.close()  # never served, not even to be read
            raise
        self._conn, self._open = conn, True

    async def _connect(self) -> Conn:
        return await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, row_factory=dict_row
        )

    async def _touch(self, conn: Conn) -> None:
        """A write of no consequence, committed: proof the store takes writes."""
        await conn.execute(pyformat(PUT_SETTING), ("store.checked_at", str(time.time())))

    async def _applied(self, conn: Conn) -> set[int]:
        cur = await conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL AS made")
        row = await cur.fetchone()
        if row is None or not row["made"]:
            return set()
        cur = await conn.execute("SELECT version FROM schema_migrations")
        return {int(r["version"]) for r in await cur.fetchall()}

    def _refuse_newer(self, applied: set[int]) -> None:
        known = max((n for n, _ in migrations()), default=0)
        if applied and max(applied) > known:
            raise StoreTooNew(
                f"the store at {self.where} was written by a newer llmgw (its schema is at "
                f"migration {max(applied)}; this llmgw knows up to {known}); nothing was "
                "changed: run that newer llmgw, or restore the copy taken before upgrading"
            )

    async def _migrate(self, conn: Conn) -> None:
        """Run what is pending, all in one transaction under the advisory lock; a control
        plane that waited on it reads again what ran meanwhile."""
        applied = await self._applied(conn)
        self._refuse_newer(applied)
        pending = [n for n, _ in migrations() if n not in applied]
        if not pending:
            return
        number = 0
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK,))
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
                    " applied_at DOUBLE PRECISION NOT NULL)"
                )
                applied = await self._applied(conn)
                self._refuse_newer(applied)
                for number, sql in migrations():
                    if number in applied:
                        continue
                    await conn.execute(sql.encode())  # several statements: no parameters
                    await conn.execute(
                        "INSERT INTO schema_migrations VALUES (%s, %s)", (number, time.time())
                    )
        except psycopg.Error as exc:
            if self._storage_error(exc) and not (conn.closed or conn.broken):
                raise StoreError(
                    f"the store needs migrating to this version (migrations {pending}) and "
                    f"cannot be written: {self.describe(exc, retrying=False)}; then start again"
                ) from exc
            if self._storage_error(exc):
                raise
            raise StoreError(f"migration {number:04d} failed: {self._scrub(str(exc))}") from exc

    # --------------------------------------------------------- can it be written

    def writable(self) -> Writability:
        return Writability(not self._problem, self._problem)

    def _scrub(self, text: str) -> str:
        return text.replace(self._password, "***") if self._password else text

    def describe(self, exc: BaseException, *, retrying: bool = True) -> str:
        """What a failed write says to a person: the problem and its fix; ``retrying``
        when ``watch`` will try again by itself (not at start, which stops instead)."""
        said = self._scrub(" ".join(str(exc).split()))
        state = str(getattr(exc, "sqlstate", None) or "")
        again = f"; llmgw connects again every {RETRY:g} s" if retrying else ""
        if state == _READ_ONLY:
            return (
                f"the PostgreSQL server at {self.where} is read-only, a replica ({said}): list "
                "every member in store.dsn with target_session_attrs=read-write so the "
                f"primary is found{again}"
            )
        if state == _DISK_FULL:
            return (
                f"the disk of the PostgreSQL server at {self.where} is full ({said}): "
                "free space there"
            )
        if not state or state.startswith(("08", "57P")):  # no session, or it was ended
            return (
                f"the PostgreSQL server at {self.where} cannot be reached ({said}): check "
                f"that it runs and takes connections there, and store.dsn in server.yaml{again}"
            )
        return f"the PostgreSQL server at {self.where} refused the change ({said}){again}"

    @staticmethod
    def _storage_error(exc: psycopg.Error) -> bool:
        """The server or the link refused, not the change: connection lost, server read-only,
        shutting down, out of space."""
        return isinstance(exc, psycopg.OperationalError) or exc.sqlstate == _READ_ONLY

    def _unavailable(self, exc: psycopg.Error) -> StoreUnavailable:
        problem = self.describe(exc)
        if problem != self._problem:
            log.error("the store cannot be written: %s", problem)
        self._problem = problem
        return StoreUnavailable(problem)

    async def _connection(self, *, writing: bool = False) -> Conn:
        """The connection, opened again when it was lost (called holding the turn). A write
        meeting none while ``watch`` is on it fails at once rather than waiting out a
        connection attempt of its own: the node states' writer calls every second."""
        if not self._open:
            raise StoreError("the store is not open")
        conn = self._conn
        if conn is not None and not (conn.closed or conn.broken):
            return conn
        self._conn = None
        if conn is not None:
            await conn.close()
        if writing and self._problem:
            raise StoreUnavailable(self._problem)
        try:
            self._conn = await self._connect()
        except psycopg.Error as exc:
            raise self._unavailable(exc) from exc
        return self._conn

    async def _write(self, work: Callable[[Conn], Awaitable[T]], *, fenced: bool = True) -> T:
        """One change in one transaction: committed whole, or undone and, when the server
        or the link refused, ``StoreUnavailable`` saying why and what to do; while
        ``fence`` is set, only while this control plane still holds the lease."""
        async with self._turn:
            conn = await self._connection(writing=True)
            try:
                try:
                    await conn.execute("BEGIN")
                except psycopg.OperationalError:
                    # Broken while idle (a restart, a failover): nothing was sent, so the
                    # change is tried once on a new connection.
                    if not conn.broken:
                        raise
                    conn = await self._connection()
                    await conn.execute("BEGIN")
                if fenced and self.fence is not None:
                    await self._check_fence(conn, *self.fence)
                result = await work(conn)
                await conn.execute("COMMIT")
            except psycopg.Error as exc:
                await self._rollback(conn)
                if not self._storage_error(exc):
                    raise
                raise self._unavailable(exc) from exc
            except BaseException:
                # Cancelled half-way (a shutdown, a timeout): psycopg has cancelled the
                # statement on the server; undone here, or the next change commits it.
                await self._rollback(conn)
                raise
        if self._problem:
            log.warning("the store can be written again")
            self._problem = ""
        return result

    async def _check_fence(self, conn: Conn, name: str, term: int) -> None:
        cur = await conn.execute(
            f"SELECT 1 FROM leader_lease WHERE id = 1 AND holder = %s AND term = %s "
            f"AND expires_at > {_NOW} FOR SHARE",
            (name, term),
        )
        if await cur.fetchone() is None:
            raise Fenced(
                f"{name} no longer holds the leader's lease of term {term}: the change was "
                "not made (another control plane leads now)"
            )

    # --- the leader's lease ------------------------------------------------------------

    async def take_lease(self, name: str, ttl: float) -> Lease:
        """Hold (or renew) the leader's lease for ``ttl`` seconds when it is free, expired
        or already ours; the lease as it stands after."""

        async def work(conn: Conn) -> Lease:
            await conn.execute(
                f"UPDATE leader_lease SET "
                f"term = CASE WHEN holder = %(me)s AND expires_at > {_NOW} "
                f"THEN term ELSE term + 1 END, holder = %(me)s, expires_at = {_NOW} + %(ttl)s "
                f"WHERE id = 1 AND (holder = %(me)s OR holder IS NULL OR expires_at <= {_NOW})",
                {"me": name, "ttl": ttl},
            )
            cur = await conn.execute(
                f"SELECT holder, term, expires_at, {_NOW} AS now FROM leader_lease WHERE id = 1"
            )
            row = await cur.fetchone()
            assert row is not None
            return Lease(row["holder"], int(row["term"]), float(row["expires_at"]), row["now"])

        return await self._write(work, fenced=False)

    async def release_lease(self, name: str) -> None:
        """Give the lease up at once (a clean stop): another takes it without waiting."""

        async def work(conn: Conn) -> None:
            await conn.execute(
                "UPDATE leader_lease SET expires_at = 0 WHERE id = 1 AND holder = %s", (name,)
            )

        await self._write(work, fenced=False)

    async def _rollback(self, conn: Conn) -> None:
        if conn.closed or conn.broken:
            await conn.close()
            return
        try:
            await conn.execute("ROLLBACK")
        except psycopg.Error:
            await conn.close()  # in an unknown state: the next call opens a new one

    async def check_writable(self) -> bool:
        """Try a write on a new connection (libpq finds the primary among the DSN's hosts)
        and keep that connection when it works."""
        try:
            conn = await self._connect()
        except psycopg.Error as exc:
            # The writes' reason stands (see sqlite.py): said once, not once a retry.
            self._problem = self._problem or self.describe(exc)
            return False
        try:
            await self._migrate(conn)
            await self._touch(conn)
        except (psycopg.Error, StoreError) as exc:
            await conn.close()
            if isinstance(exc, StoreError):  # cannot be taken (a newer llmgw's): news
                self._problem = exc.args[0]
            else:
                self._problem = self._problem or self.describe(exc)
            return False
        async with self._turn:
            if not self._open:
                await conn.close()
                return False
            old, self._conn = self._conn, conn
            if old is not None:
                await old.close()
        if self._problem:
            log.warning("the store can be written again")
        self._problem = ""
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

    async def close(self) -> None:
        async with self._turn:
            self._open = False
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close()

    # ------------------------------------------------ the steps statements.py runs on
    # Its statements come with ``?`` placeholders: each is put in psycopg's style here.

    async def _read(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        async with self._turn:
            for retry in (False, True):
                conn = await self._connection()
                try:
                    cur = await conn.execute(pyformat(sql), params)
                    return await cur.fetchall()
                except psycopg.OperationalError as exc:
                    # A connection that broke while idle: the read is tried on a new one.
                    if retry or not conn.broken:
                        raise self._unavailable(exc) from exc
        raise AssertionError("unreachable")

    async def _execute(self, sql: str, params: Params) -> int:
        async def work(conn: Conn) -> int:
            cur = await conn.execute(pyformat(sql), params)
            return cur.rowcount

        return await self._write(work)

    async def _execute_many(self, sql: str, rows: Sequence[Params]) -> None:
        async def work(conn: Conn) -> None:
            async with conn.cursor() as cur:
                await cur.executemany(pyformat(sql), rows)

        await self._write(work)

    async def _audited(
        self, sql: str, params: Params, audit: Audit, *, if_changed: bool = False
    ) -> int:
        async def work(conn: Conn) -> int:
            cur = await conn.execute(pyformat(sql), params)
            touched = cur.rowcount
            if touched or not if_changed:
                await conn.execute(
                    pyformat(INSERT_AUDIT),
                    audit_row(audit),
                )
            return touched

        return await self._write(work)

    async def _audited_all(self, steps: Sequence[tuple[str, Params]], audit: Audit) -> None:
        async def work(conn: Conn) -> None:
            for sql, params in steps:
                await conn.execute(pyformat(sql), params)
            await conn.execute(
                pyformat(INSERT_AUDIT),
                audit_row(audit),
            )

        await self._write(work)
