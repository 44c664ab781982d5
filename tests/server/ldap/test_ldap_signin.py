"""LDAP sign-in through a real control plane's admin app, in process, against a real
slapd (tests/support/slapd.py): the settings routes (admin only, the password sealed
and never answered), ``test`` naming the step that failed, and the sign-in page's login
form: a person made from the directory with their nested groups' grants, the same
"wrong login or password" for every bad guess, counted by the sign-in limiter, a
hand-set role never lowered, a deactivated person refused, and no password in any
answer or log line."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw import pki
from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.ldap.settings import SETTING
from llmgw.server.people.asks import ChangePerson, Member, NewOrg, NewPerson, NewTeam, NewToken
from llmgw.server.principal import Principal
from llmgw.server.sessions import COOKIE
from llmgw.server.store import open_store
from llmgw.wire.admin.ldap import LdapSettingsJson, LdapTestJson
from tests.server.api.test_answer_shapes import problems
from tests.support import slapd
from tests.support.slapd import Slapd

ADMIN = Principal.system("test")
MAPS = [
    "engineering=Acme/ML:member",
    f"{slapd.group('cluster-admins')}=cluster:operator",
    "ops=Acme:manager",
]
WRONG = "Wrong login or password."


@pytest.fixture
def data_dir(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "data"
    # Nothing listens: the app is called in process.
    _, token = init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    return root, token


@pytest.fixture
async def cp(data_dir: tuple[Path, str]) -> AsyncIterator[ControlPlane]:
    root, _ = data_dir
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    plane = ControlPlane(data, config, store)
    await plane.load()
    org = await plane.orgs.create_org(NewOrg("Acme"), ADMIN)
    await plane.orgs.create_team(org.id, NewTeam("ML"), ADMIN)
    try:
        yield plane
    finally:
        await plane.gateway.close()
        await plane.inspector.close()
        await store.close()


@pytest.fixture
async def client(cp: ControlPlane, data_dir: tuple[Path, str]) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=cp.admin_app())
    _, token = data_dir
    headers = {"authorization": f"Bearer {token}", "origin": "http://cp"}
    async with httpx.AsyncClient(transport=transport, base_url="http://cp", headers=headers) as c:
        yield c


def settings(server: Slapd, **more: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "url": server.url,
        "bind_dn": slapd.SERVICE_DN,
        "bind_password": slapd.SERVICE_PASSWORD,
        "base_dn": slapd.PEOPLE,
        "group_base": slapd.GROUPS,
        "maps": MAPS,
    }
    return {**body, **more}


async def set_ldap(client: httpx.AsyncClient, server: Slapd, **more: Any) -> LdapSettingsJson:
    answer = await client.post("/api/v1/auth/ldap", json=settings(server, **more))
    assert answer.status_code == 200, answer.text
    doc: LdapSettingsJson = answer.json()
    return doc


async def ldap_test(
    client: httpx.AsyncClient, login: str, password: str | None = None
) -> LdapTestJson:
    body = {"login": login} if password is None else {"login": login, "password": password}
    answer = await client.post("/api/v1/auth/ldap/test", json=body)
    assert answer.status_code == 200, answer.text
    doc: LdapTestJson = answer.json()
    assert problems(LdapTestJson, doc) == []
    return doc


async def sign_in(client: httpx.AsyncClient, login: str, password: str) -> httpx.Response:
    return await client.post(
        "/admin/login",
        data={"login": login, "password": password, "next": "/admin"},
        headers={"authorization": ""},
    )


async def test_settings_are_kept_sealed_shown_without_the_password_and_turned_off(
    cp: ControlPlane, client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    shown = await set_ldap(client, directory_server)
    assert problems(LdapSettingsJson, shown) == []
    assert shown["enabled"] and shown["bind_password"] == "set"
    assert shown["user_filter"] == "(uid={login})" and shown["group_base"] == slapd.GROUPS
    assert [m["target"] for m in shown["maps"]] == ["Acme/ML", "cluster", "Acme"]
    again = await client.get("/api/v1/auth/ldap")
    assert again.json() == shown
    raw = await cp.store.get_setting(SETTING)
    assert raw is not None and slapd.SERVICE_PASSWORD not in raw
    assert json.loads(raw)["bind_password"].startswith("sealed1:")
    audit = json.dumps(await cp.store.audit_log(limit=10))
    assert "auth.ldap.set" in audit and slapd.SERVICE_PASSWORD not in audit
    # A change without the password keeps the one kept.
    kept = await client.post(
        "/api/v1/auth/ldap",
        json={k: v for k, v in settings(directory_server).items() if k != "bind_password"},
    )
    assert kept.status_code == 200 and (await ldap_test(client, "alice"))["ok"]
    off = await client.delete("/api/v1/auth/ldap")
    assert off.status_code == 200 and off.json()["enabled"] is False
    assert not await cp.store.get_setting(SETTING)
    refused = await client.post("/api/v1/auth/ldap/test", json={"login": "alice"})
    assert refused.status_code == 404 and "ctl auth ldap set" in refused.json()["error"]["message"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"url": "http://dir"}, "url"),
        ({"bind_dn": "not a dn"}, "bind_dn"),
        ({"user_filter": "(uid=alice)"}, "user_filter"),
        ({"maps": ["engineering=Initech:member"]}, "maps"),
        ({"maps": ["ops=cluster:manager"]}, "maps"),
        ({"ca_pem": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----"}, "ca_pem"),
        (
            {
                "url": "ldaps://127.0.0.1:1",
                "ca_pem": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----",
            },
            "ca_pem",
        ),
        ({"url": "ldap://127.0.0.1:1", "ca_pem": pki.make_ca("x").cert_pem.decode()}, "ca_pem"),
    ],
)
async def test_bad_settings_are_refused_naming_the_field_and_nothing_is_kept(
    cp: ControlPlane,
    client: httpx.AsyncClient,
    directory_server: Slapd,
    change: dict[str, Any],
    field: str,
) -> None:
    answer = await client.post("/api/v1/auth/ldap", json=settings(directory_server, **change))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == field
    assert not await cp.store.get_setting(SETTING)


async def test_no_password_the_first_time_is_refused(
    client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    body = {k: v for k, v in settings(directory_server).items() if k != "bind_password"}
    answer = await client.post("/api/v1/auth/ldap", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "bind_password"


async def test_only_the_cluster_s_admins_see_change_or_test_the_settings(
    cp: ControlPlane, client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    await set_ldap(client, directory_server)
    person = await cp.people.create(NewPerson("olga", role="operator"), ADMIN)
    me = cp.directory.principal(person, "token")
    assert me is not None
    _, token = await cp.people.new_token("olga", NewToken("t"), me)
    headers = {"authorization": f"Bearer {token}"}
    for method, path, body in (
        ("GET", "/api/v1/auth/ldap", None),
        ("POST", "/api/v1/auth/ldap", settings(directory_server)),
        ("DELETE", "/api/v1/auth/ldap", None),
        ("POST", "/api/v1/auth/ldap/test", {"login": "alice"}),
    ):
        answer = await client.request(method, path, json=body, headers=headers)
        assert answer.status_code == 403, (method, path, answer.text)
    assert (await client.get("/api/v1/auth/ldap")).json()["enabled"] is True


async def test_test_walks_the_steps_and_names_the_one_that_failed(
    client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    await set_ldap(client, directory_server)
    good = await ldap_test(client, "alice")
    assert good["ok"] and good["failed"] is None
    assert [s["step"] for s in good["steps"]] == ["connect", "service_bind", "find", "groups"]
    assert good["person"] == {
        "dn": slapd.dn("alice"),
        "name": "Alice Liddell",
        "email": "alice@example.org",
    }
    # Nested: engineering holds ml-engineers; the loop of loop-a and loop-b ends.
    assert sorted(good["groups"]) == sorted(
        slapd.group(g) for g in ("ml-engineers", "engineering", "loop-a", "loop-b")
    )
    assert good["grants"] == [{"group": "engineering", "target": "Acme/ML", "role": "member"}]
    bob = await ldap_test(client, "bob", slapd.PASSWORDS["bob"])
    assert bob["ok"] and [s["step"] for s in bob["steps"]][3] == "person_bind"
    assert {g["role"] for g in bob["grants"]} == {"operator", "manager"}

    unknown = await ldap_test(client, "mallory")
    assert unknown["failed"] == "find" and "no one under" in unknown["message"]
    assert unknown["person"] is None and unknown["steps"][-1]["ok"] is False
    wrong_person = await ldap_test(client, "alice", "not-her-password")
    assert (
        wrong_person["failed"] == "person_bind" and "invalidCredentials" in wrong_person["message"]
    )

    await set_ldap(client, directory_server, bind_password="not-the-service-password")
    wrong_bind = await ldap_test(client, "alice")
    assert wrong_bind["failed"] == "service_bind"
    assert "refused the service account" in wrong_bind["message"]
    assert "invalidCredentials" in wrong_bind["message"]
    assert [s["step"] for s in wrong_bind["steps"]] == ["connect", "service_bind"]

    with socket_closed() as port:
        await set_ldap(client, directory_server, url=f"ldap://127.0.0.1:{port}")
        down = await ldap_test(client, "alice")
    assert down["failed"] == "connect" and "cannot reach" in down["message"]


class socket_closed:
    """A port nothing listens on, for as long as the block lasts."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound, never listening: connections refused
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


async def test_the_sign_in_page_offers_a_login_and_password_only_while_ldap_is_set(
    client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    page = await client.get("/admin/login")
    assert 'name="login"' not in page.text and 'name="token"' in page.text
    await set_ldap(client, directory_server)
    page = await client.get("/admin/login")
    assert 'name="login"' in page.text and 'name="password"' in page.text
    assert 'name="token"' in page.text  # the admin token stays, for bootstrap and recovery
    turkish = await client.get("/admin/login", headers={"cookie": "llmgw_lang=tr"})
    assert "Kullanıcı adı" in turkish.text and "Parola" in turkish.text


async def test_a_person_signs_in_with_the_directory_and_gets_what_their_groups_give(
    cp: ControlPlane, client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    await set_ldap(client, directory_server)
    answer = await sign_in(client, "Bob", slapd.PASSWORDS["bob"])
    assert answer.status_code == 303 and answer.headers["location"] == "/admin"
    cookie = answer.cookies[COOKIE]
    bob = cp.directory.by_login("bob")
    assert bob is not None and bob.source == "ldap" and bob.subject == slapd.dn("bob")
    assert (bob.name, bob.email) == ("Bob Builder", "bob@example.org")
    # cluster-admins holds ops, which holds bob: operator; ops itself: Acme's manager.
    assert bob.role == "operator" and bob.role_by_hand is False
    acme = next(o for o in cp.directory.now.orgs.values() if o.name == "Acme")
    member = [(m.kind, m.scope_id, m.role) for m in cp.directory.memberships_of(bob.id)]
    assert member == [("org", acme.id, "manager")]
    client.cookies.clear()
    headers = {"authorization": "", "cookie": f"{COOKIE}={cookie}"}
    page = await client.get("/admin", headers=headers)
    assert page.status_code == 200 and "bob" in page.text
    audit = await cp.store.audit_log(limit=5)
    assert any(r["action"] == "person.sign_in" and r["target"] == "bob" for r in audit)


async def test_every_bad_guess_is_the_same_wrong_login_or_password_and_counts(
    client: httpx.AsyncClient, directory_server: Slapd, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await set_ldap(client, directory_server)
    guesses = [
        ("alice", "not-her-password"),  # a wrong password
        ("mallory", "whatever"),  # no such person
        ("alice", ""),  # empty: LDAP would take it as an anonymous bind
        ("*", slapd.PASSWORDS["alice"]),  # a wildcard reaches the filter escaped
        ("alice)(uid=*", slapd.PASSWORDS["alice"]),
    ]
    for login, password in guesses:
        answer = await sign_in(client, login, password)
        assert answer.status_code == 401, (login, answer.text)
        assert WRONG in answer.text and COOKIE not in answer.cookies
    # Five wrong guesses from this address: even the right password waits now.
    blocked = await sign_in(client, "alice", slapd.PASSWORDS["alice"])
    assert blocked.status_code == 429 and "Retry-After" in blocked.headers
    for secret in (slapd.SERVICE_PASSWORD, slapd.PASSWORDS["alice"], "not-her-password"):
        assert secret not in caplog.text


async def test_a_directory_that_does_not_answer_is_said_and_not_counted_as_a_guess(
    client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    with socket_closed() as port:
        await set_ldap(client, directory_server, url=f"ldap://127.0.0.1:{port}")
        for _ in range(6):
            answer = await sign_in(client, "alice", slapd.PASSWORDS["alice"])
            assert answer.status_code == 503 and "cannot be asked now" in answer.text
    await set_ldap(client, directory_server)
    assert (await sign_in(client, "alice", slapd.PASSWORDS["alice"])).status_code == 303


async def test_a_group_change_holds_at_the_next_sign_in_but_never_lowers_a_hand_set_role(
    cp: ControlPlane, client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    await set_ldap(client, directory_server)
    assert (await sign_in(client, "alice", slapd.PASSWORDS["alice"])).status_code == 303
    alice = cp.directory.by_login("alice")
    assert alice is not None
    ml = next(t for t in cp.directory.now.teams.values() if t.name == "ML")
    assert [(m.scope_id, m.role) for m in cp.directory.memberships_of(alice.id)] == [
        (ml.id, "member")
    ]
    assert (await sign_in(client, "carol", slapd.PASSWORDS["carol"])).status_code == 303
    carol = cp.directory.by_login("carol")
    assert carol is not None
    # An admin makes carol the team's manager by hand, and bob a cluster admin.
    await cp.orgs.set_member("Acme", Member("carol", "manager", "ML"), ADMIN)
    before = [slapd.dn("alice")]
    try:
        # The directory's admin takes alice out of ml-engineers and carol out of
        # engineering (ml-engineers stays in it).
        slapd.set_members(directory_server, "ml-engineers", [slapd.dn("bob")])
        slapd.set_members(directory_server, "engineering", [slapd.group("ml-engineers")])
        assert (await sign_in(client, "alice", slapd.PASSWORDS["alice"])).status_code == 303
        assert cp.directory.memberships_of(alice.id) == []
        assert (await sign_in(client, "carol", slapd.PASSWORDS["carol"])).status_code == 303
        kept = [(m.scope_id, m.role, m.by_hand) for m in cp.directory.memberships_of(carol.id)]
        assert kept == [(ml.id, "manager", True)]
    finally:
        slapd.set_members(directory_server, "ml-engineers", before)
        slapd.set_members(
            directory_server, "engineering", [slapd.group("ml-engineers"), slapd.dn("carol")]
        )
    assert (await sign_in(client, "bob", slapd.PASSWORDS["bob"])).status_code == 303
    await cp.people.change("bob", ChangePerson(role="admin"), ADMIN)
    assert (await sign_in(client, "bob", slapd.PASSWORDS["bob"])).status_code == 303
    bob = cp.directory.by_login("bob")
    assert bob is not None and bob.role == "admin" and bob.role_by_hand


async def test_a_deactivated_person_is_refused_though_their_password_is_right(
    cp: ControlPlane, client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    await set_ldap(client, directory_server)
    assert (await sign_in(client, "bob", slapd.PASSWORDS["bob"])).status_code == 303
    await cp.people.change("bob", ChangePerson(active=False), ADMIN)
    answer = await sign_in(client, "bob", slapd.PASSWORDS["bob"])
    assert answer.status_code == 403 and "deactivated" in answer.text
    assert COOKIE not in answer.cookies


async def test_a_standby_signs_in_whom_it_knows_writing_nothing_and_sends_a_newcomer_to_the_leader(
    cp: ControlPlane, client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    await set_ldap(client, directory_server)
    assert (await sign_in(client, "bob", slapd.PASSWORDS["bob"])).status_code == 303
    written = len(await cp.store.audit_log(limit=1000))
    cp.ldap.leading = lambda: False
    answer = await sign_in(client, "bob", slapd.PASSWORDS["bob"])
    assert answer.status_code == 303 and COOKIE in answer.cookies
    # Still checked against the directory: a wrong password is refused there too.
    assert (await sign_in(client, "bob", "not-his")).status_code == 401
    newcomer = await sign_in(client, "carol", slapd.PASSWORDS["carol"])
    assert newcomer.status_code == 409 and "sign in on the leader once" in newcomer.text
    assert cp.directory.by_login("carol") is None
    assert len(await cp.store.audit_log(limit=1000)) == written


async def test_ldaps_holds_the_server_to_the_ca_given_and_refuses_another(
    client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    tls = {"url": directory_server.ldaps_url, "ca_pem": directory_server.ca_pem}
    shown = await set_ldap(client, directory_server, **tls)
    assert shown["ca"] == "set" and shown["url"] == directory_server.ldaps_url
    good = await ldap_test(client, "bob", slapd.PASSWORDS["bob"])
    assert good["ok"], good
    assert (await sign_in(client, "bob", slapd.PASSWORDS["bob"])).status_code == 303
    # Without it the system's CAs do not know the server's; another CA does not either.
    await set_ldap(client, directory_server, url=directory_server.ldaps_url)
    untrusted = await ldap_test(client, "bob")
    assert untrusted["failed"] == "connect" and untrusted["steps"][-1]["ok"] is False
    other = pki.make_ca("another").cert_pem.decode()
    await set_ldap(client, directory_server, url=directory_server.ldaps_url, ca_pem=other)
    assert (await ldap_test(client, "bob"))["failed"] == "connect"
    assert (await sign_in(client, "bob", slapd.PASSWORDS["bob"])).status_code == 503


async def test_a_base_dn_not_in_the_directory_is_the_admins_to_mend_not_a_wrong_password(
    client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    await set_ldap(client, directory_server, base_dn="ou=nobody,dc=example,dc=org")
    found = await ldap_test(client, "alice")
    assert found["failed"] == "find" and "is not in the directory" in found["message"]
    answer = await sign_in(client, "alice", slapd.PASSWORDS["alice"])
    assert answer.status_code == 503 and "cannot be asked now" in answer.text


async def test_active_directory_takes_its_own_filters_and_its_server_walks_the_nesting(
    client: httpx.AsyncClient, directory_server: Slapd
) -> None:
    shown = await set_ldap(client, directory_server, ad=True)
    assert shown["user_filter"] == "(&(objectClass=user)(sAMAccountName={login}))"
    assert shown["group_filter"] == "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={dn}))"
    # slapd knows neither; with filters it knows, AD's way asks once and walks nothing
    # (AD's rule in chain answers the nested groups itself).
    await set_ldap(
        client, directory_server, ad=True, user_filter="(uid={login})", group_filter="(member={dn})"
    )
    found = await ldap_test(client, "alice")
    assert found["ok"]
    assert sorted(found["groups"]) == [slapd.group("loop-a"), slapd.group("ml-engineers")]
