"""A real high-availability PostgreSQL for tests: one etcd 3 and two (or more) Patroni 3
members, each running a PostgreSQL 15, all from Debian 12's packages (etcd-server,
patroni, postgresql-15; ``make test`` installs them), all on 127.0.0.1 and free ports,
everything under one temporary folder removed by ``stop()``.

One member bootstraps the cluster and holds the leader key; the others clone it with
pg_basebackup and stream from it (synchronously by default: Patroni's
``synchronous_mode``, so a commit the client saw is on the replica before the primary
dies). Clients reach it with one DSN naming every member and
``target_session_attrs=read-write``: libpq tries them in turn and keeps the one that
takes writes.

``kill_primary_postgres()`` is the failure the e2e tests want: kill -9 of the primary's
Patroni, postmaster and backends, as when its machine dies. Its leader key then lives on
in etcd until ``ttl`` (10 s) runs out; the replica takes the key and promotes itself, and
``wait_primary()`` returns once a write through the DSN succeeds. With ``patroni=False``
only PostgreSQL dies and the member's own Patroni restarts it as the primary within a
loop or two (``primary_start_timeout``), which is no failover.

PostgreSQL refuses to run as root, so when the tests run as root Patroni runs as the
``postgres`` user (and starts PostgreSQL as it); the folder is given to that user, which
is why it is made under /tmp and not under pytest's tmp_path (root's, mode 0700).
docs/patroni.md has the configuration and the measured failover times.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil
import psycopg
import pytest
import yaml
from psycopg import sql

from tests.support import postgres
from tests.support.postgres import BIN, USER, free_port

PATRONI = Path(os.environ.get("LLMGW_PATRONI", "/usr/bin/patroni"))
ETCD = Path(os.environ.get("LLMGW_ETCD", "/usr/bin/etcd"))
HOST = "127.0.0.1"
PROBE_TABLE = "patroni_harness_probe"  # wait_primary() writes here

# The cluster-wide settings (bootstrap.dcs.postgresql.parameters). The first four make
# it disposable and fast, for tests only: nothing a test writes must outlive a crash of
# the machine (a kill -9 of a process loses nothing: the page cache survives it).
PARAMETERS: dict[str, str | int] = {
    "fsync": "off",
    "shared_buffers": "32MB",
    "max_connections": 200,
    "log_min_messages": "warning",
    # Patroni needs these (its defaults, written out so the docs can show them).
    "wal_level": "replica",
    "hot_standby": "on",
    "max_wal_senders": 10,
    "max_replication_slots": 10,
    "wal_keep_size": "128MB",
    "wal_log_hints": "on",  # pg_rewind, when an old primary rejoins
}


def missing() -> str | None:
    """Why a Patroni cluster cannot be started here, or None when it can."""
    problem = postgres.missing()
    if problem:
        return problem
    absent = [str(p) for p in (PATRONI, ETCD) if not os.access(p, os.X_OK)]
    if absent:
        return (
            f"Patroni or etcd is not installed ({', '.join(absent)} missing): run `make test`, "
            "which installs the Debian packages the tests need (patroni, etcd-server)"
        )
    return None


def _owned_folder(prefix: str) -> Path:
    """A new folder under the system's temporary folder that PostgreSQL's user owns."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        owner = pwd.getpwnam(USER)
        os.chown(base, owner.pw_uid, owner.pw_gid)
    return base


def _free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def _gone(proc: psutil.Process) -> bool:
    """Exited: no such process, or a zombie waiting for init (it holds nothing)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _reaped(proc: psutil.Process) -> bool:
    """Not even a zombie any more."""
    try:
        proc.status()
        return False
    except psutil.NoSuchProcess:
        return True


def _wait_until(
    procs: list[psutil.Process], done: Callable[[psutil.Process], bool], timeout: float
) -> bool:
    deadline = time.monotonic() + timeout
    while not all(done(p) for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _kill(procs: list[psutil.Process], timeout: float = 10) -> None:
    """SIGKILL each; wait until all have exited."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    if not _wait_until(procs, _gone, timeout):
        raise TimeoutError(f"processes survived SIGKILL: {[p.pid for p in procs]}")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Member:
    """One Patroni member: its folder (config, log, PostgreSQL's data) and its ports."""

    name: str
    base: Path
    port: int  # PostgreSQL
    api_port: int  # Patroni's REST API
    patroni: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def config(self) -> Path:
        return self.base / "patroni.yml"

    @property
    def log(self) -> Path:
        """Patroni's log; PostgreSQL's own messages (stderr) land here too."""
        return self.base / "patroni.log"

    @property
    def api(self) -> str:
        return f"http://{HOST}:{self.api_port}"

    def patroni_running(self) -> bool:
        return self.patroni is not None and self.patroni.poll() is None

    def postmaster(self) -> psutil.Process | None:
        """The member's running postmaster (from postmaster.pid, checked), or None."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and proc.cwd() == str(self.data):
                return proc
        except (OSError, ValueError, psutil.Error):
            pass
        return None


@dataclass
class PatroniCluster:
    """etcd plus ``size`` Patroni members under ``root`` (made by ``new()``: it must be
    a folder PostgreSQL's user can reach and own).

    Timing (Patroni's dynamic configuration): a dead primary's leader key expires after
    ``ttl`` seconds; every Patroni runs its loop each ``loop_wait`` seconds and retries
    etcd and PostgreSQL for ``retry_timeout`` before demoting itself. Patroni wants
    ``loop_wait + 2 * retry_timeout <= ttl``, or a primary cut off from etcd may still
    take writes after its key has expired and another member has promoted itself.
    """

    root: Path
    size: int = 2
    ttl: int = 10
    loop_wait: int = 1
    retry_timeout: int = 4
    synchronous: bool = True
    scope: str = "llmgw"
    user: str = "postgres"
    password: str = field(default_factory=lambda: secrets.token_hex(12))
    nodes: dict[str, Member] = field(default_factory=dict)
    etcd_port: int = 0
    etcd_peer_port: int = 0
    _etcd: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.loop_wait + 2 * self.retry_timeout > self.ttl:
            raise ValueError(
                f"Patroni wants loop_wait + 2 * retry_timeout <= ttl, not "
                f"{self.loop_wait} + 2 * {self.retry_timeout} > {self.ttl}"
            )
        if self.size < 1:
            raise ValueError("a cluster has at least one member")

    @classmethod
    def new(cls, **options: Any) -> PatroniCluster:
        """A cluster (not started) in a new temporary folder PostgreSQL's user owns."""
        return cls(_owned_folder("llmgw-patroni-"), **options)

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 90) -> None:
        """etcd, then the first member (it bootstraps the cluster and becomes the
        primary), then the others (replicas); returns once there is one primary and every
        other member streams from it (synchronously, when ``synchronous``)."""
        problem = missing()
        if problem:
            raise RuntimeError(problem)
        deadline = time.monotonic() + timeout
        try:
            ports = _free_ports(2 + 2 * self.size)
            self.etcd_port, self.etcd_peer_port = ports[0], ports[1]
            for i in range(self.size):
                name = f"pg{i + 1}"
                base = self.root / name
                base.mkdir()
                if os.geteuid() == 0:
                    owner = pwd.getpwnam(USER)
                    os.chown(base, owner.pw_uid, owner.pw_gid)
                member = Member(name, base, port=ports[2 + 2 * i], api_port=ports[3 + 2 * i])
                self.nodes[name] = member
                self._write_config(member)
            self._start_etcd(deadline)
            first, *others = self.nodes
            self.start_member(first)
            self._wait(deadline, lambda: self._role(self.nodes[first]) == "primary", "a primary")
            for name in others:
                self.start_member(name)
            self.wait_healthy(max(1.0, deadline - time.monotonic()))
        except BaseException as exc:
            logs = self.logs()
            self.stop()
            if isinstance(exc, Exception):
                raise RuntimeError(f"the Patroni cluster did not start: {exc}\n{logs}") from exc
            raise

    def stop(self) -> None:
        """Everything gone: Patroni, PostgreSQL (every process in a member's data
        folder), etcd, and the folder. Safe to call twice."""
        postmasters = []
        for member in self.nodes.values():
            self._kill_patroni(member)
            postmaster = member.postmaster()
            if postmaster is not None:
                postmasters.append(postmaster)
        # SIGQUIT, PostgreSQL's immediate shutdown: the postmaster ends its children and
        # reaps them before it exits, so no orphans are left for init to reap.
        for proc in postmasters:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGQUIT)
        _wait_until(postmasters, _gone, 10)
        if self._etcd is not None:
            with contextlib.suppress(OSError):
                os.killpg(self._etcd.pid, signal.SIGKILL)
            self._etcd.wait(10)
            self._etcd = None
        strays = self._strays()  # anything left that runs in (or from) the folder
        with contextlib.suppress(TimeoutError):
            _kill(strays)
        # Until init has reaped them too, so that `ps` right after shows nothing.
        _wait_until(postmasters + strays, _reaped, 5)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PatroniCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _strays(self) -> list[psutil.Process]:
        root = str(self.root)
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                cwd = proc.cwd()
                if cwd == root or cwd.startswith(root + os.sep) or root in " ".join(proc.cmdline()):
                    found.append(proc)
        return found

    # ------------------------------------------------------------------- members

    def start_member(self, name: str) -> None:
        """Start a member's Patroni (again): it starts PostgreSQL, as a replica of the
        current primary when there is one (pg_rewind first if it was a primary that
        died with WAL the new one never had)."""
        member = self.nodes[name]
        if member.patroni_running():
            return
        self._wait_no_postmaster(member)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(member.base),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        with member.log.open("ab") as log:
            member.patroni = _spawn([str(PATRONI), str(member.config)], member.base, env, log)

    def kill_member(self, name: str) -> None:
        """kill -9 a member's Patroni, then its postmaster and every backend: as if its
        machine died. A primary's leader key stays in etcd until ``ttl`` runs out."""
        member = self.nodes[name]
        self._kill_patroni(member)
        self._kill_postgres(member)

    def _kill_patroni(self, member: Member) -> None:
        if member.patroni is not None:
            with contextlib.suppress(OSError):
                os.killpg(member.patroni.pid, signal.SIGKILL)  # and pg_basebackup, pg_rewind
            member.patroni.wait(10)
            member.patroni = None

    def stop_member(self, name: str, timeout: float = 30) -> None:
        """Stop a member as its service would (SIGTERM to Patroni): it stops PostgreSQL
        and, as the primary, gives up the leader key, so a replica takes over at once."""
        member = self.nodes[name]
        if member.patroni is not None:
            member.patroni.terminate()
            try:
                member.patroni.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(member.patroni.pid, signal.SIGKILL)
                member.patroni.wait(10)
            member.patroni = None
        self._kill_postgres(member)  # nothing, normally

    def kill_primary_postgres(self, *, patroni: bool = True) -> str:
        """kill -9 the primary: its Patroni (unless ``patroni=False``), then its
        postmaster and backends. Returns the old primary's name.

        With its Patroni dead too, the failover waits for the leader key to expire
        (``ttl``); ``start_member(name)`` brings the old primary back as a replica. With
        ``patroni=False`` its Patroni sees PostgreSQL gone within ``loop_wait`` and starts
        it again, as the primary (crash recovery; no failover)."""
        name = self.primary()
        if name is None:
            raise RuntimeError(f"no primary to kill: {self.members()}")
        if patroni:
            self.kill_member(name)
        else:
            self._kill_postgres(self.nodes[name])
        return name

    def _kill_postgres(self, member: Member) -> None:
        postmaster = member.postmaster()
        if postmaster is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                _kill([postmaster, *postmaster.children(recursive=True)])

    def _wait_no_postmaster(self, member: Member, timeout: float = 10) -> None:
        """Until the last postmaster's pid is reaped: PostgreSQL refuses to start while
        the pid in postmaster.pid exists, even as a zombie."""
        try:
            pid = int((member.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE and proc.cwd() != str(member.data):
                    return  # the pid is someone else's now
            except psutil.Error:
                return
            time.sleep(0.05)

    # ----------------------------------------------------------------- observing

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (GET /cluster from any member that answers):
        name, role (leader, sync_standby, replica), state (running, starting, stopped,
        ...), host, port, timeline, lag. Straight from etcd: a dead primary stays the
        leader until its key expires."""
        for member in self.nodes.values():
            status, body = self._get(member, "/cluster")
            if status == 200 and isinstance(body, dict):
                return list(body.get("members", []))
        return []

    def primary(self) -> str | None:
        """The member whose Patroni says it runs the primary and holds the leader key
        (GET /primary answers 200), or None."""
        for member in self.nodes.values():
            if self._role(member) == "primary":
                return member.name
        return None

    def replicas(self) -> list[str]:
        return [m.name for m in self.nodes.values() if self._role(m) == "replica"]

    def _role(self, member: Member) -> str | None:
        if self._get(member, "/primary")[0] == 200:
            return "primary"
        if self._get(member, "/replica")[0] == 200:
            return "replica"
        return None

    def _get(self, member: Member, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(member.api + path, timeout=2) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            with contextlib.suppress(ValueError):
                return err.code, json.loads(err.read() or b"null")
            return err.code, None
        except (OSError, ValueError):
            return 0, None

    def streaming(self) -> list[tuple[str, str, str]]:
        """The primary's pg_stat_replication: (application_name (the member), state,
        sync_state) for each standby."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT application_name, state, sync_state FROM pg_stat_replication"
            ).fetchall()
        return [(str(a), str(s), str(y)) for a, s, y in rows]

    def wait_healthy(self, timeout: float = 60) -> str:
        """Until one member is the primary and every other streams from it; when
        ``synchronous``, one of them synchronously and named so in etcd (so it may take
        over). The primary's name."""
        deadline = time.monotonic() + timeout
        names = set(self.nodes)

        def healthy() -> bool:
            primary = self.primary()
            if primary is None or set(self.replicas()) != names - {primary}:
                return False
            try:
                rows = self.streaming()
            except psycopg.Error:
                return False
            if {a for a, s, _ in rows if s == "streaming"} != names - {primary}:
                return False
            if not self.synchronous or len(names) == 1:
                return True
            # PostgreSQL replicates synchronously (sync_state) about 2 s before Patroni
            # names the standby in etcd's /sync key (the role sync_standby); only then may
            # it promote itself: in between, a dead primary means no failover at all.
            roles = {m.get("name"): m.get("role") for m in self.members()}
            return any(y == "sync" and roles.get(a) == "sync_standby" for a, _, y in rows)

        self._wait(deadline, healthy, "one primary and every replica streaming")
        primary = self.primary()
        assert primary is not None
        return primary

    def heal(self, timeout: float = 90) -> str:
        """Start every member that is down and wait until the cluster is healthy: for a
        test that shares the cluster with tests that killed members."""
        for name, member in self.nodes.items():
            if not member.patroni_running():
                self.kill_member(name)  # a postmaster left behind by ``patroni=False``
                self.start_member(name)
        return self.wait_healthy(timeout)

    def wait_primary(self, timeout: float = 30, *, other_than: str | None = None) -> str:
        """Until a write through ``dsn()`` succeeds (an INSERT into a scratch table; on a
        member other than ``other_than`` if given); that member's name."""
        deadline = time.monotonic() + timeout
        by_port = {m.port: m.name for m in self.nodes.values()}
        last: object = None
        while True:
            try:
                with psycopg.connect(self.dsn(), autocommit=True) as conn:
                    conn.execute(
                        sql.SQL("CREATE TABLE IF NOT EXISTS {} (at timestamptz, port int)").format(
                            sql.Identifier(PROBE_TABLE)
                        )
                    )
                    row = conn.execute(
                        sql.SQL(
                            "INSERT INTO {} VALUES (now(), inet_server_port()) RETURNING port"
                        ).format(sql.Identifier(PROBE_TABLE))
                    ).fetchone()
                assert row is not None
                name = by_port[int(row[0])]
                if name != other_than:
                    return name
                last = f"the write went to {name} still"
            except psycopg.Error as err:
                last = err
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no writable primary within {timeout} s (last: {last}); "
                    f"members: {self.members()}\n{self.logs(10)}"
                )
            time.sleep(0.05)

    def logs(self, lines: int = 40) -> str:
        """The end of each member's log (and etcd's), for a failure's message."""
        parts = [f"--- {m.log}\n{_tail(m.log, lines)}" for m in self.nodes.values()]
        parts.append(f"--- {self.root / 'etcd.log'}\n{_tail(self.root / 'etcd.log', lines)}")
        return "\n".join(parts)

    # ---------------------------------------------------------------- connecting

    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        """A libpq DSN naming every member; libpq keeps the one that takes writes."""
        members = list(self.nodes.values())
        parts = {
            "host": ",".join(HOST for _ in members),
            "port": ",".join(str(m.port) for m in members),
            "user": self.user,
            "password": self.password,
            "dbname": dbname,
            "target_session_attrs": "read-write",
            "connect_timeout": "2",
        }
        return " ".join(f"{k}={v}" for k, v in {**parts, **extra}.items())

    def member_dsn(self, name: str, dbname: str = "postgres") -> str:
        """A DSN to one member, whatever its role."""
        return (
            f"host={HOST} port={self.nodes[name].port} user={self.user} "
            f"password={self.password} dbname={dbname} connect_timeout=2"
        )

    def create_database(self, name: str) -> str:
        """A new empty database on the primary (replicated like everything); its DSN."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    # -------------------------------------------------------------------- inside

    def config(self, member: Member) -> dict[str, Any]:
        """A member's Patroni configuration (what ``patroni.yml`` holds)."""
        secret = self.password
        return {
            "scope": self.scope,
            "namespace": "/llmgw/",
            "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"{HOST}:{member.api_port}",
                "connect_address": f"{HOST}:{member.api_port}",
            },
            "etcd3": {"hosts": [f"{HOST}:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": self.ttl,
                    "loop_wait": self.loop_wait,
                    "retry_timeout": self.retry_timeout,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": self.synchronous,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": dict(PARAMETERS),
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "data-checksums"],
            },
            "postgresql": {
                "listen": f"{HOST}:{member.port}",
                "connect_address": f"{HOST}:{member.port}",
                "data_dir": str(member.data),
                "bin_dir": str(BIN),
                "pgpass": str(member.base / "pgpass"),
                "authentication": {
                    "superuser": {"username": self.user, "password": secret},
                    "replication": {"username": "replicator", "password": secret},
                    "rewind": {"username": "rewinder", "password": secret},
                },
                "parameters": {"unix_socket_directories": str(member.base)},
                "pg_hba": [
                    "local all all trust",
                    f"host all all {HOST}/32 scram-sha-256",
                    f"host replication replicator {HOST}/32 scram-sha-256",
                ],
                "basebackup": [{"checkpoint": "fast"}],
            },
            "watchdog": {"mode": "off"},
        }

    def _write_config(self, member: Member) -> None:
        member.config.write_text(yaml.safe_dump(self.config(member), sort_keys=False))
        member.config.chmod(0o600)  # passwords
        if os.geteuid() == 0:
            owner = pwd.getpwnam(USER)
            os.chown(member.config, owner.pw_uid, owner.pw_gid)

    def _start_etcd(self, deadline: float) -> None:
        client = f"http://{HOST}:{self.etcd_port}"
        peer = f"http://{HOST}:{self.etcd_peer_port}"
        argv = [
            str(ETCD),
            "--name=etcd1",
            f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=etcd1={peer}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self.scope}-{secrets.token_hex(4)}",
            "--logger=zap",
            "--log-level=warn",
        ]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.root)}
        with (self.root / "etcd.log").open("ab") as log:
            # As whoever runs the tests: etcd keeps nothing PostgreSQL's user must read.
            self._etcd = _spawn(argv, self.root, env, log, as_owner=False)

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as resp:
                    return bool(json.loads(resp.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        self._wait(deadline, healthy, "etcd")

    def _wait(self, deadline: float, ready: Callable[[], bool], what: str) -> None:
        while not ready():
            if self._etcd is not None and self._etcd.poll() is not None:
                raise RuntimeError(f"etcd exited ({self._etcd.returncode})")
            for member in self.nodes.values():
                if member.patroni is not None and member.patroni.poll() is not None:
                    raise RuntimeError(
                        f"{member.name}'s Patroni exited ({member.patroni.returncode})"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}; members: {self.members()}")
            time.sleep(0.1)


_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _term_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it ends, so a
    test run killed outright (a CI timeout's SIGTERM or SIGKILL, before ``stop()`` could
    run) does not leave the cluster behind: Patroni stops its PostgreSQL on SIGTERM."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(
    argv: list[str], cwd: Path, env: dict[str, str], log: IO[bytes], as_owner: bool = True
) -> subprocess.Popen[bytes]:
    """A process in a session of its own (so a kill of its group takes its children),
    as PostgreSQL's user when we are root and ``as_owner``. Started from the main
    thread, it gets SIGTERM when this process dies (from another thread it would get it
    when that thread ends, a worker thread's end being no reason to stop a cluster)."""
    owner = pwd.getpwnam(USER) if as_owner and os.geteuid() == 0 else None
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        user=owner.pw_uid if owner else None,
        group=owner.pw_gid if owner else None,
        extra_groups=os.getgrouplist(USER, owner.pw_gid) if owner else None,
        preexec_fn=_term_with_parent
        if threading.current_thread() is threading.main_thread()
        else None,
    )


# ------------------------------------------------------------------------ fixtures


@contextlib.contextmanager
def running_cluster(**options: Any) -> Iterator[PatroniCluster]:
    """A started cluster of its own, stopped and removed on leaving."""
    cluster = PatroniCluster.new(**options)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def patroni_cluster(
    tmp_path_factory: pytest.TempPathFactory, **options: Any
) -> Iterator[PatroniCluster]:
    """For a fixture of any scope: ``yield from patroni_cluster(tmp_path_factory)``. A
    cluster of its own; on teardown its logs are kept under pytest's temporary folder
    (``patroni-logs*``) before everything else goes."""
    cluster = PatroniCluster.new(**options)
    try:
        cluster.start()
        yield cluster
    finally:
        _keep_logs(cluster, tmp_path_factory)
        cluster.stop()


_SHARED = pytest.StashKey[PatroniCluster | BaseException]()


def shared_cluster(request: pytest.FixtureRequest) -> PatroniCluster:
    """The test session's one cluster (default options), started on first use and
    stopped when the session ends; healed (every member up, one primary, replicas
    streaming) on each call. Call it from a function-scoped fixture::

        @pytest.fixture
        def ha(request: pytest.FixtureRequest) -> PatroniCluster:
            return shared_cluster(request)
    """
    config = request.config
    found = config.stash.get(_SHARED, None)
    if isinstance(found, BaseException):
        raise RuntimeError(f"the session's Patroni cluster failed to start: {found}")
    if found is None:
        problem = missing()
        if problem:
            pytest.fail(problem)  # loudly, as the other PostgreSQL tests do
        cluster = PatroniCluster.new()
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")

        def cleanup() -> None:
            _keep_logs(cluster, factory)
            cluster.stop()

        config.add_cleanup(cleanup)
        try:
            cluster.start()
        except Exception as exc:
            config.stash[_SHARED] = exc
            raise
        config.stash[_SHARED] = cluster
        return cluster
    found.heal()
    return found


def _keep_logs(cluster: PatroniCluster, factory: pytest.TempPathFactory) -> None:
    with contextlib.suppress(Exception):
        keep = factory.mktemp("patroni-logs")
        for member in cluster.nodes.values():
            if member.log.exists():
                shutil.copy(member.log, keep / f"{member.name}.log")
        if (cluster.root / "etcd.log").exists():
            shutil.copy(cluster.root / "etcd.log", keep / "etcd.log")
