"""Signing out of the admin pages ends the session on every control plane.

A leader and a standby, as real processes on loopback (no node is needed), on SQLite
(the standby follows the leader's store by its changes) and on PostgreSQL (both read one
store; the standby reads it again every second).
Signed in on the leader, the same cookie opens the standby's pages (a session is a
signed cookie every control plane of the cluster honours). Signed out on the leader,
the standby refuses that cookie within 2 s; signed out on a standby, the leader does
(the standby sends the sign-out over the control planes' link). Another session stays
open on both throughout.

Rotating the admin token on the leader (``llmgw ctl admin-token rotate`` on its machine)
ends the old token and every session opened with it: the standby refuses both within
2 s, the new token opens the API and signs in on both, and the leader's admin.token
holds it, so ctl there goes on working.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.cluster import Cluster, run
from tests.e2e.standbys import standby_of
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


def sign_in(cluster: Cluster, token: str | None = None) -> str:
    """A session opened on ``cluster`` (with its data dir's admin token, or ``token``):
    its cookie, as the browser sends it back."""
    answer = httpx.post(
        f"{base(cluster)}/admin/login",
        data={"token": token or cluster.admin_token},
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
    return until_refused(lambda: opens(cluster, cookie), f"{cluster.name}'s pages", since)


def until_refused(admitted: Callable[[], bool], what: str, since: float) -> float:
    """Poll until ``admitted`` says no; how long after ``since`` it did."""
    while admitted():
        waited = time.monotonic() - since
        assert waited < WITHIN, f"{what} still open {waited:.2f} s after it ended"
        time.sleep(0.05)
    return time.monotonic() - since


def bearer_opens(cluster: Cluster, token: str) -> bool:
    """Whether ``token`` opens ``cluster``'s admin API (else 401)."""
    answer = httpx.get(f"{base(cluster)}/api/v1/keys", headers={"authorization": f"Bearer {token}"})
    assert answer.status_code in (200, 401), answer.text
    return answer.status_code == 200


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


def test_rotating_the_admin_token_ends_the_old_one_and_its_sessions_on_both(
    pair: tuple[Cluster, Cluster],
) -> None:
    leader, standby = pair
    old = leader.admin_token
    cookie = sign_in(leader)
    assert opens(standby, cookie) and bearer_opens(standby, old)

    # A standby cannot write the store: it names the leader and changes nothing.
    status, refused = standby.api_error("/api/v1/admin-token/rotate", body={})
    assert status == 409 and refused["error"]["type"] == "not_leader", refused
    assert bearer_opens(leader, old) and bearer_opens(standby, old)

    # On the leader's machine, as its operator types it (the token from its data dir).
    out = run("ctl", "admin-token", "rotate", "--json", "--data-dir", str(leader.data_dir))
    said = time.monotonic()
    new = json.loads(out.stdout)["token"]
    assert new != old and old not in out.stdout
    # The leader refuses the old token and its session at once; the standby within 2 s.
    assert not bearer_opens(leader, old) and not opens(leader, cookie)
    until_refused(lambda: bearer_opens(standby, old), "the old token on cp-b", said)
    refused_within(standby, cookie, said)

    # The new token opens the API and signs in on both.
    for cluster in (leader, standby):
        assert bearer_opens(cluster, new)
        assert opens(cluster, sign_in(cluster, new))
    # The leader's admin.token holds it, so ctl there goes on working; the standby's copy
    # is the old one, to be replaced by hand (docs/ha.md).
    assert leader.admin_token == new and standby.admin_token == old
    assert json.loads(run("ctl", "status", "--json", "--data-dir", str(leader.data_dir)).stdout)
