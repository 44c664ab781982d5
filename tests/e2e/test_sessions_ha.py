"""Signing out of the admin pages ends the session on every control plane.

A leader and a standby, as real processes on loopback (no node is needed), on SQLite
(the standby follows the leader's store by its changes) and on PostgreSQL (both read one
store; the standby reads it again every second).
Signed in on the leader, the same cookie opens the standby's pages (a session is a
signed cookie every control plane of the cluster honours). Signed out on the leader,
the standby refuses that cookie within 2 s; signed out on a standby, the leader does
(the standby sends the sign-out over the control planes' link). Another session stays
open on both throughout.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.test_ha import standby_of
from tests.e2e.test_ha_postgres import pair as postgres_pair
from tests.support.postgres import PostgresServer, missing, start_postgres

pytestmark = pytest.mark.e2e

# What the issue asks: a signed-out cookie refused everywhere within this.
WITHIN = 2.0


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


@pytest.fixture(params=["sqlite", "postgres"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Cluster, Cluster]]:
    """A leader (cp-a) and a standby (cp-b) joined to it, on the backend of the param."""
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("pg")
        dsn = server.create_database(f"llmgw_sessions_{int(time.time() * 1000)}")
        leader, standby = postgres_pair(tmp_path, dsn, dsn)
        try:
            yield leader, standby
        finally:
            standby.stop()
            leader.stop()
        return
    leader = Cluster(tmp_path / "a")
    leader.init()
    leader.start_server()
    follower: Cluster | None = None
    try:
        follower = standby_of(leader, tmp_path / "b")
        yield leader, follower
    finally:
        if follower is not None:
            follower.stop()
        leader.stop()


def audited_sign_outs(leader: Cluster) -> list[str]:
    """Who signed out, oldest first, as the leader's audit trail says (its own page)."""
    page = httpx.get(f"{base(leader)}/admin/audit", headers={"cookie": sign_in(leader)})
    assert page.status_code == 200, page.text
    return re.findall(r"<td>([^<]*)</td>\s*<td>admin\.sign_out</td>", page.text)[::-1]


def base(cluster: Cluster) -> str:
    return f"http://{cluster.listen}"


def sign_in(cluster: Cluster) -> str:
    """A session opened on ``cluster``: its cookie, as the browser sends it back."""
    answer = httpx.post(
        f"{base(cluster)}/admin/login",
        data={"token": cluster.admin_token},
        headers={"origin": base(cluster)},
    )
    assert answer.status_code == 303, answer.text
    return answer.headers["set-cookie"].split(";")[0]


def opens(cluster: Cluster, cookie: str) -> bool:
    """Whether ``cookie`` opens a page of ``cluster`` (else it is sent to sign in)."""
    answer = httpx.get(f"{base(cluster)}/admin/nodes", headers={"cookie": cookie})
    assert answer.status_code in (200, 303), answer.text
    if answer.status_code == 303:
        assert answer.headers["location"].startswith("/admin/login")
    return answer.status_code == 200


def sign_out(cluster: Cluster, cookie: str) -> float:
    """Sign out on ``cluster`` as its page's button does; when it answered (monotonic)."""
    page = httpx.get(f"{base(cluster)}/admin", headers={"cookie": cookie})
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert page.status_code == 200 and found is not None
    answer = httpx.post(
        f"{base(cluster)}/admin/logout",
        data={"csrf": found.group(1)},
        headers={"cookie": cookie, "origin": base(cluster)},
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/admin/login"
    return time.monotonic()


def refused_within(cluster: Cluster, cookie: str, since: float) -> float:
    """Poll until ``cluster`` refuses ``cookie``; how long after ``since`` it did."""
    while opens(cluster, cookie):
        waited = time.monotonic() - since
        assert waited < WITHIN, f"{cluster.name} still opens pages {waited:.2f} s after sign-out"
        time.sleep(0.05)
    return time.monotonic() - since


def test_signing_out_on_either_control_plane_ends_the_session_on_both(
    pair: tuple[Cluster, Cluster],
) -> None:
    leader, standby = pair
    cookie = sign_in(leader)
    bystander = sign_in(leader)
    assert opens(leader, cookie) and opens(standby, cookie)

    # Out on the leader: the standby hears of it through the store's changes.
    said = sign_out(leader, cookie)
    assert not opens(leader, cookie)
    refused_within(standby, cookie, said)

    # Out on the standby (signed in there): the leader keeps it, and both refuse it.
    second = sign_in(standby)
    assert opens(leader, second) and opens(standby, second)
    said = sign_out(standby, second)
    assert not opens(standby, second)
    refused_within(leader, second, said)

    # Only the sessions signed out ended; the audit trail names both sign-outs.
    assert opens(leader, bystander) and opens(standby, bystander)
    outs = audited_sign_outs(leader)
    assert len(outs) == 2 and outs[1].endswith("via cp-b"), outs

    # A standby started again still refuses what was signed out before.
    standby.start_server()
    assert not opens(standby, cookie) and not opens(standby, second)
    assert opens(standby, bystander)
