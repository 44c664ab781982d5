"""The Patroni harness (tests/support/patroni.py) does what the HA tests rely on: one
primary and a streaming replica behind one DSN; a kill -9 of the primary loses no
committed row and a new primary takes writes within about ``ttl``; the old primary comes
back as a replica; ``stop()`` leaves no process and no folder behind."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

import psutil
import psycopg
import pytest

from tests.support.patroni import PatroniCluster, running_cluster, shared_cluster

# Timing: it measures how long Patroni takes to fail over, so it runs alone.
pytestmark = [pytest.mark.e2e, pytest.mark.timing]


@pytest.fixture
def ha(request: pytest.FixtureRequest) -> PatroniCluster:
    """The session's cluster, healthy: every member up, one primary, replicas streaming."""
    return shared_cluster(request)


def poll(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def write_row(ha: PatroniCluster) -> str:
    """A row with a fresh token, committed through the cluster's DSN; the token."""
    token = secrets.token_hex(8)
    with psycopg.connect(ha.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS harness_rows (token text PRIMARY KEY)")
        conn.execute("INSERT INTO harness_rows VALUES (%s)", (token,))
    return token


def has_row(dsn: str, token: str) -> bool:
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM harness_rows WHERE token = %s", (token,)
            ).fetchone()
    except psycopg.Error:
        return False
    return row is not None and row[0] == 1


def test_start_gives_one_primary_and_one_streaming_replica(ha: PatroniCluster) -> None:
    primary = ha.primary()
    assert primary is not None
    assert ha.replicas() == [name for name in ha.nodes if name != primary]
    (replica,) = ha.replicas()

    roles = {m["name"]: (m["role"], m["state"]) for m in ha.members()}
    assert roles == {primary: ("leader", "running"), replica: ("sync_standby", "running")}
    assert ha.streaming() == [(replica, "streaming", "sync")]

    # The DSN names both; libpq keeps the writable one.
    ports = ",".join(str(m.port) for m in ha.nodes.values())
    assert f"host=127.0.0.1,127.0.0.1 port={ports} " in ha.dsn()
    assert "target_session_attrs=read-write" in ha.dsn()
    assert ha.wait_primary(5) == primary
    token = write_row(ha)

    # The replica has it (replayed soon after the commit) and refuses writes.
    poll(lambda: has_row(ha.member_dsn(replica), token), 10, "the row on the replica")
    with psycopg.connect(ha.member_dsn(replica), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO harness_rows VALUES ('no')")


def test_kill_of_the_primary_fails_over_within_ttl_and_it_rejoins(ha: PatroniCluster) -> None:
    token = write_row(ha)

    started = time.monotonic()
    old = ha.kill_primary_postgres()  # its Patroni too: the machine died
    new = ha.wait_primary(30, other_than=old)
    took = time.monotonic() - started
    # The leader key outlives its owner by up to ttl; then a loop (loop_wait) of the
    # replica, its promotion and the probe's retries: 5 s is ample (measured: ~10.4 s).
    assert took <= ha.ttl + 5, f"failover took {took:.1f} s"
    assert new != old
    assert ha.primary() == new
    assert ha.nodes[old].postmaster() is None
    assert has_row(ha.dsn(), token), "a committed row was lost in the failover"

    # Writes go on while the old primary is away (synchronous_mode is not strict).
    later = write_row(ha)

    ha.start_member(old)
    assert ha.wait_healthy(60) == new
    assert ha.replicas() == [old]
    assert ("sync_standby", "running") in {(m["role"], m["state"]) for m in ha.members()}
    poll(lambda: has_row(ha.member_dsn(old), later), 10, "the old primary replaying new rows")


def test_a_postgres_crash_alone_is_restarted_in_place(ha: PatroniCluster) -> None:
    token = write_row(ha)
    old = ha.kill_primary_postgres(patroni=False)
    # Its Patroni, still the leader, starts PostgreSQL again (crash recovery): no failover.
    assert ha.wait_primary(15) == old
    assert has_row(ha.dsn(), token)
    assert ha.wait_healthy(30) == old


def test_stop_leaves_nothing_behind() -> None:
    with running_cluster(size=1) as solo:
        root = solo.root
        assert solo.wait_primary(5) == "pg1"
        postmaster = solo.nodes["pg1"].postmaster()
        assert postmaster is not None
    assert not root.exists()
    with pytest.raises(psutil.NoSuchProcess):  # not even a zombie
        postmaster.status()

    def ours(proc: psutil.Process) -> bool:
        try:
            cmdline = " ".join(proc.cmdline())
            return str(root) in cmdline or proc.cwd().startswith(str(root))
        except psutil.Error:
            return False

    assert [p.pid for p in psutil.process_iter() if ours(p)] == []
