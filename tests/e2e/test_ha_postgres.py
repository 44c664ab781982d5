"""Two control planes sharing one PostgreSQL store: leadership is a lease in it.

A real PostgreSQL 15 (run as the postgres user) for the module; each test has a database
of its own. The leading control plane is killed (-9): the other takes the lease within
about ``ha.lease_seconds`` (10), while clients chatting through it see no failure, and
the node's agent comes to it with its engine untouched. A leader cut off from the store
(a silent partition: nothing gets through, nothing says so) stops leading within the
lease time, and the two never lead at once.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.catalog import SCHEDULING, ctl_json, join, serve, wait_ready
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.load import Load
from tests.e2e.standbys import answered, leader_state
from tests.support.postgres import PostgresServer, TcpProxy, missing, start_postgres
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e

_names = itertools.count()


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    problem = missing()
    if problem:
        pytest.fail(problem)
    server = start_postgres()
    try:
        yield server
    finally:
        server.remove()


class Proxy:
    """A TcpProxy run on a thread of its own, for a test that is not async."""

    def __init__(self, target_port: int, listen: str | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxy = TcpProxy(target_port, listen=listen)
        self.done: asyncio.Event | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        async def main() -> None:
            self.done = asyncio.Event()
            async with self.proxy:
                ready.set()
                await self.done.wait()

        try:
            self.loop.run_until_complete(main())
        finally:
            self.loop.close()

    @property
    def port(self) -> int:
        return self.proxy.port

    def silence(self) -> None:
        self.loop.call_soon_threadsafe(self.proxy.silence)

    def close(self) -> None:
        assert self.done is not None
        self.loop.call_soon_threadsafe(self.done.set)
        self.thread.join(10)


def pair(root: Path, dsn_a: str, dsn_b: str) -> tuple[Cluster, Cluster]:
    """Control plane a (initialised on PostgreSQL, leading) and b (joined)."""
    a = Cluster(root / "a", init_args=["--store", "postgres", "--dsn", dsn_a])
    (root / "a").mkdir(parents=True)
    a.init()
    (a.data_dir / "server.yaml").write_text((a.data_dir / "server.yaml").read_text() + SCHEDULING)
    a.start_server()
    wait_for(lambda: leader_state(a)[0] == 200, 15, "a to take the lease")
    b = Cluster(root / "b", name="cp-b")
    (root / "b").mkdir(parents=True)
    b.join_as_standby(a)
    config = b.data_dir / "server.yaml"
    text = config.read_text()
    assert "backend: postgres" in text  # the join handed the store over
    config.write_text(text.replace(dsn_a, dsn_b) + SCHEDULING)
    b.start_server()
    return a, b


def database(pg: PostgresServer) -> str:
    return pg.create_database(f"llmgw_ha_{next(_names)}_{int(time.time())}")


def test_the_lease_passes_to_the_standby_when_the_leader_dies(
    pg: PostgresServer, tmp_path: Path, binary: Path
) -> None:
    dsn = database(pg)
    a, b = pair(tmp_path, dsn, dsn)
    try:
        status, state = leader_state(b)
        assert (status, state["role"], state["leader"]["name"]) == (503, "standby", "cp-a")
        join(a, "n1", binary)
        serve(a, write_tiny_model(a.root / "tiny.gguf"), "tiny")
        (row,) = wait_ready(a, "tiny", 1)
        key = ctl_json(a, "keys", "create", "--name", "load")["key"]
        # The standby reads the same store: the key is known there within a second.
        wait_for(lambda: answered(b, key), 10, "the standby to serve with the new key")
        with Load(b, key) as load:
            assert a.server is not None
            a.server.signal(signal.SIGKILL)
            a.server.popen.wait(10)
            killed = time.monotonic()
            wait_for(lambda: leader_state(b)[0] == 200, 15, "b to take the lease")
            took = time.monotonic() - killed
            assert took <= 15, took
            status, state = leader_state(b)
            assert state["role"] == "leader" and state["term"] == 2
            assert ctl_json(b, "keys", "create", "--name", "after")["name"] == "after"
            b.wait_state("n1", "Ready", 15)
            (again,) = wait_ready(b, "tiny", 1, timeout=15)
            assert again["pid"] == row["pid"]
            load.flowing_for(3)
            assert load.errors == []
        # The old leader started again: the lease is held, so it follows.
        a.start_server()
        wait_for(
            lambda: leader_state(a)[1].get("leader", {}).get("name") == "cp-b", 15, "a to follow"
        )
        assert leader_state(a)[0] == 503
    finally:
        b.stop()
        a.stop()


def test_a_leader_cut_from_the_store_steps_down_and_two_never_lead(
    pg: PostgresServer, tmp_path: Path
) -> None:
    dsn = database(pg)
    dbname = dsn.split("dbname=")[1].split()[0]
    proxy = Proxy(pg.port)
    try:
        through = pg.dsn(dbname).replace(f"port={pg.port}", f"port={proxy.port}")
        a, b = pair(tmp_path, through, dsn)
        try:
            leading: list[tuple[float, bool, bool]] = []
            proxy.silence()
            cut = time.monotonic()

            def roles() -> bool:
                both = (leader_state(a)[0] == 200, leader_state(b)[0] == 200)
                leading.append((time.monotonic() - cut, *both))
                return both == (False, True)

            wait_for(roles, 20, "b to lead and a to have stepped down", step=0.2)
            stepped = next(t for t, at_a, _ in leading if not at_a)
            assert stepped <= 10, leading  # within the lease time
            assert not any(at_a and at_b for _, at_a, at_b in leading), leading
            # The cut-off one learns from b itself (over their link) that b leads, and
            # refuses writes, naming it.
            wait_for(
                lambda: (leader_state(a)[1].get("leader") or {}).get("name") == "cp-b",
                10,
                "a to learn that b leads",
            )
            code, body = a.api_error("/api/v1/keys", body={"name": "split"})
            assert code == 409 and body["error"]["leader"] == b.listen
        finally:
            b.stop()
            a.stop()
    finally:
        proxy.close()
