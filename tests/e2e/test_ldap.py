"""LDAP sign-in end to end: a real slapd (tests/support/slapd.py), a leader and a standby
as real processes on loopback (SQLite, the standby following the leader's store), and
``llmgw ctl auth ldap`` as a person types it.

``ctl auth ldap set`` on the leader seals the service account's password in the store;
``ctl auth ldap test`` tries the settings from the control plane and names the step
that failed (a good person, an unknown one, a wrong bind password); a person signs in
on the leader's page with their directory password, and then on the standby, which read
the same settings from its copy of the store. No password is in any output or log.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.cluster import Cluster, run, wait_for
from tests.e2e.standbys import standby_of
from tests.support import slapd
from tests.support.slapd import Slapd

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def directory_server() -> Iterator[Slapd]:
    problem = slapd.missing()
    if problem:
        pytest.fail(problem)
    with slapd.running() as server:
        yield server


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Cluster, Cluster]]:
    leader = Cluster(tmp_path / "a")
    leader.init()
    leader.start_server()
    standby: Cluster | None = None
    try:
        standby = standby_of(leader, tmp_path / "b")
        yield leader, standby
    finally:
        if standby is not None:
            standby.stop()
        leader.stop()


def ctl(cluster: Cluster, *args: str, check: bool = True) -> tuple[int, str]:
    proc = run(
        "ctl",
        "auth",
        "ldap",
        *args,
        "--server",
        cluster.listen,
        "--token",
        cluster.admin_token,
        check=check,
    )
    return proc.returncode, proc.stdout + proc.stderr


def base(cluster: Cluster) -> str:
    return f"http://{cluster.listen}"


def sign_in(cluster: Cluster, login: str, password: str) -> httpx.Response:
    return httpx.post(
        f"{base(cluster)}/admin/login",
        data={"login": login, "password": password, "next": "/admin"},
        headers={"origin": base(cluster)},
    )


def test_ctl_sets_and_tests_ldap_and_people_sign_in_on_leader_and_standby(
    pair: tuple[Cluster, Cluster], directory_server: Slapd, tmp_path: Path
) -> None:
    leader, standby = pair
    password_file = tmp_path / "bind-password"
    password_file.write_text(slapd.SERVICE_PASSWORD + "\n")
    password_file.chmod(0o600)
    settings = [
        "--url",
        directory_server.url,
        "--bind-dn",
        slapd.SERVICE_DN,
        "--base-dn",
        slapd.PEOPLE,
        "--group-base",
        slapd.GROUPS,
        "--map",
        "cluster-admins=cluster:operator",
    ]
    _, said = ctl(leader, "set", *settings, "--bind-password-file", str(password_file))
    assert re.search(r"bind password\s+set\n", said) and slapd.SERVICE_PASSWORD not in said
    assert "cluster-admins" in said and "operator" in said

    code, said = ctl(leader, "test", "bob")
    assert code == 0, said
    for step in ("connect", "service_bind", "find", "groups"):
        assert step in said
    assert f"person: {slapd.dn('bob')} (Bob Builder, bob@example.org)" in said
    assert slapd.group("cluster-admins") in said  # through ops: a nested group
    assert "gives: cluster: operator (from cluster-admins)" in said

    code, said = ctl(leader, "test", "mallory", check=False)
    assert code == 1 and "failed at find" in said and "no one under" in said

    person_password = tmp_path / "bob-password"
    person_password.write_text("not-bobs-password")
    code, said = ctl(leader, "test", "bob", "--password-file", str(person_password), check=False)
    assert code == 1 and "failed at person_bind" in said and "invalidCredentials" in said

    wrong = tmp_path / "wrong-bind-password"
    wrong.write_text("not-the-service-password")
    ctl(leader, "set", *settings, "--bind-password-file", str(wrong))
    code, said = ctl(leader, "test", "bob", check=False)
    assert code == 1 and "failed at service_bind" in said
    assert "refused the service account" in said and "invalidCredentials" in said
    ctl(leader, "set", *settings, "--bind-password-file", str(password_file))

    answer = sign_in(leader, "bob", slapd.PASSWORDS["bob"])
    assert answer.status_code == 303, answer.text
    cookie = answer.headers["set-cookie"].split(";")[0]
    page = httpx.get(f"{base(leader)}/admin", headers={"cookie": cookie})
    assert page.status_code == 200 and "bob" in page.text and "operator" in page.text
    wrong_guess = sign_in(leader, "bob", "not-bobs-password")
    unknown = sign_in(leader, "mallory", "whatever")
    assert wrong_guess.status_code == unknown.status_code == 401
    assert (
        "Wrong login or password." in wrong_guess.text
        and "Wrong login or password." in unknown.text
    )

    # The standby reads the same settings from its copy of the store, and knows bob
    # once the leader's write of him reaches it.
    def standby_signs_bob_in() -> bool:
        return sign_in(standby, "bob", slapd.PASSWORDS["bob"]).status_code == 303

    wait_for(standby_signs_bob_in, 10, "the standby to sign bob in")
    newcomer = sign_in(standby, "alice", slapd.PASSWORDS["alice"])
    assert newcomer.status_code == 409 and "sign in on the leader once" in newcomer.text

    _, said = ctl(leader, "show")
    assert slapd.SERVICE_PASSWORD not in said and re.search(r"bind password\s+set\n", said)
    _, said = ctl(leader, "off")
    assert "LDAP sign-in is off" in said
    assert 'name="login"' not in httpx.get(f"{base(leader)}/admin/login").text

    for cluster in (leader, standby):
        assert cluster.server is not None
        log = cluster.server.text()
        for secret in (slapd.SERVICE_PASSWORD, slapd.PASSWORDS["bob"], "not-bobs-password"):
            assert secret not in log, f"{secret!r} in {cluster.name}'s log"
