"""A real PostgreSQL for tests: ``initdb`` and ``pg_ctl`` from the Debian package
(postgresql-15, which ``make test`` installs), on 127.0.0.1 and a free port, trust auth,
its data under a temporary folder removed when it stops.

PostgreSQL refuses to run as root, so when the tests do, its programs run as the
``postgres`` user (``runuser``) and the folder is given to that user. Durability is off
(fsync, full page writes): nothing a test writes must outlive a crash.

The pieces are apart (``initdb``, ``start``, ``stop``, a streaming replica, a TCP proxy
that can cut the link or move it to another server) so end-to-end tests can build more
on them (Patroni members, failovers) than the store tests need.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from tests.support.ports import free_port

BIN = Path(os.environ.get("LLMGW_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "postgres"  # the OS user that runs it when the tests run as root
# Fast and disposable: nothing written must survive a crash. (synchronous_commit stays
# on: off, a commit reaches a standby only at the WAL writer's next round, 200 ms.)
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
}


def missing() -> str | None:
    """Why PostgreSQL cannot be started here, or None when it can."""
    needed = [BIN / name for name in ("initdb", "pg_ctl", "postgres", "pg_basebackup")]
    absent = [str(p) for p in needed if not os.access(p, os.X_OK)]
    if absent:
        return (
            f"PostgreSQL 15 is not installed ({', '.join(absent)} missing): run `make test`, "
            "which installs the Debian packages the tests need (postgresql-15)"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(USER)
        except KeyError:
            return (
                f"no {USER!r} user to run PostgreSQL as: run `make test` (postgresql-15 makes it)"
            )
    return None


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", USER, "--", *argv] if os.geteuid() == 0 else argv


@dataclass
class PostgresServer:
    """One PostgreSQL instance: its folder, its port, and how to reach it."""

    base: Path
    port: int = 0
    host: str = "127.0.0.1"
    user: str = "postgres"
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def logfile(self) -> Path:
        return self.base / "postgres.log"

    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        """A libpq DSN to one database of this server."""
        parts = {"host": self.host, "port": str(self.port), "user": self.user, "dbname": dbname}
        return " ".join(f"{k}={v}" for k, v in {**parts, **extra}.items())

    def _run(self, *argv: str, timeout: float = 60) -> None:
        proc = subprocess.run(
            _as_owner(list(argv)), cwd=self.base, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise RuntimeError(
                f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}\n{log}"
            )

    def initdb(self) -> None:
        """An empty cluster, trust auth, its own socket folder; durability off."""
        self._run(
            str(BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "--auth=trust",
            "--no-sync",
            "--no-locale",
            "--encoding=UTF8",
        )
        conf = {**SETTINGS, "unix_socket_directories": f"'{self.base}'", **self.settings}
        with (self.data / "postgresql.conf").open("a") as f:
            f.writelines(f"{k} = {v}\n" for k, v in conf.items())

    def start(self, port: int | None = None) -> None:
        """Start and wait until it takes connections (on a new free port unless told)."""
        self.port = port or self.port or free_port()
        self._run(
            str(BIN / "pg_ctl"),
            "start",
            "-D",
            str(self.data),
            "-l",
            str(self.logfile),
            "-w",
            "-t",
            "30",
            "-o",
            f"-p {self.port}",
        )

    def stop(self, mode: str = "immediate") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(BIN / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # --------------------------------------------------------------------- databases

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.dsn(), autocommit=True)

    def create_database(self, name: str) -> str:
        """A new empty database; its DSN."""
        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def schema_dsn(self, schema: str, dbname: str = "postgres") -> str:
        """A DSN whose sessions work in ``schema`` (their search_path): for a test, as
        good as a database of its own, and made in a millisecond rather than the fifth of
        a second CREATE DATABASE takes."""
        return self.dsn(dbname, options=f"-csearch_path={schema}")

    def create_schema(self, schema: str, dbname: str = "postgres") -> str:
        """A new empty schema; a DSN that works in it."""
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        return self.schema_dsn(schema, dbname)

    def drop_schema(self, schema: str, dbname: str = "postgres") -> None:
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def disconnect(self, application_name: str) -> int:
        """End the sessions of one application_name, as a restart would; how many."""
        with self.admin() as conn:
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (application_name,),
            ).fetchone()
        return int(str(row[0])) if row else 0

    def wait_replayed_by(self, standby: PostgresServer, timeout: float = 30) -> None:
        """Wait until ``standby`` has replayed everything written here so far."""
        with self.admin() as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        with standby.admin() as conn:
            for _ in range(int(timeout / 0.02)):
                done = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)
                ).fetchone()
                if done and done[0]:
                    return
                time.sleep(0.02)
        raise TimeoutError(f"the standby on port {standby.port} did not catch up")


def _folder() -> Path:
    """A new temporary folder the server's user owns."""
    base = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam(USER)
        os.chown(base, owner.pw_uid, owner.pw_gid)
    return base


def _start(server: PostgresServer, attempts: int = 3) -> None:
    for attempt in range(attempts):
        try:
            server.start(free_port())  # another process may take the port meanwhile
            return
        except RuntimeError:
            if attempt == attempts - 1:
                raise


def start_postgres(settings: dict[str, str] | None = None) -> PostgresServer:
    """A new PostgreSQL, started; ``remove()`` stops it and deletes its folder."""
    problem = missing()
    if problem:
        raise RuntimeError(problem)
    server = PostgresServer(_folder(), settings=dict(settings or {}))
    try:
        server.initdb()
        _start(server)
        return server
    except BaseException:
        server.remove()
        raise


def start_standby(primary: PostgresServer) -> PostgresServer:
    """A hot standby of ``primary`` by streaming replication, started: read-only, as a
    Patroni replica is (writes fail with SQLSTATE 25006)."""
    standby = PostgresServer(_folder(), user=primary.user)
    try:
        standby._run(
            str(BIN / "pg_basebackup"),
            "-D",
            str(standby.data),
            "-h",
            primary.host,
            "-p",
            str(primary.port),
            "-U",
            primary.user,
            "-R",  # standby.signal, and primary_conninfo to follow it
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        )
        with (standby.data / "postgresql.conf").open("a") as f:
            f.write(f"unix_socket_directories = '{standby.base}'\n")
        _start(standby)
        return standby
    except BaseException:
        standby.remove()
        raise


class TcpProxy:
    """A TCP relay to a server's port, for tests of a link that breaks: ``cut()`` ends
    every connection through it and refuses new ones until ``restore()``; ``target``
    may be moved to another server meanwhile (a failover as a client sees it)."""

    def __init__(
        self, target_port: int, host: str = "127.0.0.1", listen: str | None = None
    ) -> None:
        self.host = host
        # Where the relay listens (another of this machine's addresses), ``host`` if None.
        self.listen = listen or host
        self.target = target_port
        self.port = 0
        self._cut = False
        self._silent = False
        self._links: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._relay, self.listen, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def silence(self) -> None:
        """A partition as the network makes one: nothing more gets through either way,
        and nothing says so (no reset); new connections hang unanswered."""
        self._silent = True

    def cut(self) -> None:
        self._cut = True
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    def restore(self, target_port: int | None = None) -> None:
        self.target = target_port or self.target
        self._cut = self._silent = False

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        if self._silent:
            self._links.add(writer)  # held open, never answered
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target)
        except OSError:
            writer.transport.abort()
            return
        self._links |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    if self._silent:
                        continue  # dropped on the floor
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._links -= {writer, up_writer}


@contextmanager
def postgres(settings: dict[str, str] | None = None) -> Iterator[PostgresServer]:
    server = start_postgres(settings)
    try:
        yield server
    finally:
        server.remove()
