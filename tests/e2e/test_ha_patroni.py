"""Two control planes on a store under Patroni: etcd, two PostgreSQL 15 (the postgres
user's) with synchronous replication, all on loopback, from Debian's packages.

With four clients chatting through the standby the whole time: the leading control plane
is killed (-9) and the other takes the lease; then the store's primary is killed (-9,
its Patroni too) and the replica is promoted by Patroni: the store takes writes again
within about Patroni's ttl, nothing created before the kill is lost, and not one request
fails.
"""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.catalog import ctl_json, join, serve, wait_ready
from tests.e2e.cluster import wait_for
from tests.e2e.load import Load
from tests.e2e.standbys import answered, leader_state
from tests.e2e.test_ha_postgres import pair
from tests.support.patroni import PatroniCluster, shared_cluster
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e

_names = itertools.count()


@pytest.fixture
def ha(request: pytest.FixtureRequest) -> PatroniCluster:
    return shared_cluster(request)


def test_control_planes_and_their_store_fail_over_while_clients_are_served(
    ha: PatroniCluster, tmp_path: Path, binary: Path
) -> None:
    dsn = ha.create_database(f"llmgw_patroni_{next(_names)}_{int(time.time())}")
    a, b = pair(tmp_path, dsn, dsn)
    try:
        join(a, "n1", binary)
        serve(a, write_tiny_model(a.root / "tiny.gguf"), "tiny")
        (row,) = wait_ready(a, "tiny", 1)
        key = ctl_json(a, "keys", "create", "--name", "load")["key"]
        before = ctl_json(a, "keys", "create", "--name", "made-before")["id"]
        wait_for(lambda: answered(b, key), 10, "the standby to serve with the new key")
        with Load(b, key) as load:
            # 1. The leading control plane dies: the standby takes the lease.
            assert a.server is not None
            a.server.signal(signal.SIGKILL)
            a.server.popen.wait(10)
            wait_for(lambda: leader_state(b)[0] == 200, 15, "b to take the lease")
            b.wait_state("n1", "Ready", 15)

            # 2. The store's primary dies under load: Patroni promotes the replica.
            old = ha.kill_primary_postgres()
            killed = time.monotonic()

            def writable() -> bool:
                status, _, _ = b.post(
                    "/api/v1/keys",
                    f'{{"name": "after-{time.monotonic_ns()}"}}'.encode(),
                    b.admin_token,
                    timeout=10,
                )
                return status == 201

            wait_for(writable, 40, "the store to take writes through b again", step=0.2)
            took = time.monotonic() - killed
            # About Patroni's ttl (10): its leader key expires, the replica promotes
            # itself, libpq finds it, and b holds the lease again (a round, 2 s).
            assert took <= ha.ttl + 10, took
            assert ha.primary() not in (None, old)
            # Nothing made before the kill was lost (replication was synchronous).
            ids = {k["id"] for k in ctl_json(b, "keys", "list")}
            assert before in ids
            assert [m["name"] for m in ctl_json(b, "models")] == ["tiny"]
            (again,) = wait_ready(b, "tiny", 1, timeout=20)
            assert again["pid"] == row["pid"]
            load.flowing_for(3)
            assert load.errors == []
    finally:
        b.stop()
        a.stop()
