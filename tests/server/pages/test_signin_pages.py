"""The Sign-in page of a real control plane, called in process over its SQLite store
with people's own sessions: the cluster's admin sees OIDC, LDAP and SCIM with their
settings, maps and last change, and every form; a viewer, an operator and an
organisation's admin are refused the page and every form (which changes nothing); no
secret, hash or sealed value of any of the three is in the page; every form wants the
session's CSRF token; SCIM's new token is shown on its answer page and never again."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.ldap.service import LdapTest
from llmgw.server.ldap.settings import LdapSet
from llmgw.server.people.asks import Member, NewOrg, NewPerson, NewTeam
from llmgw.server.people.oidcsettings import OidcSet
from llmgw.server.people.signins import SignIns
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.sessions import COOKIE
from llmgw.server.store import open_store

SYSTEM = Principal.system("test")
PAGE = "/admin/signin"
CLIENT_SECRET = "oidc-client-secret-Zq81"
BIND_PASSWORD = "ldap-bind-password-Wm42"
# Every form of the page, by its id, and where it posts (with a form that would change
# something if it were let through).
FORMS: dict[str, tuple[str, dict[str, str]]] = {
    "oidc-off": (f"{PAGE}/oidc/off", {}),
    "ldap-off": (f"{PAGE}/ldap/off", {}),
    "ldap-test": (f"{PAGE}/ldap/test", {"login": "alice"}),
    "scim-off": (f"{PAGE}/scim/off", {}),
    "scim-token": (f"{PAGE}/scim/token", {}),
    "scim-maps": (f"{PAGE}/scim/maps", {"maps": "admins=cluster:admin"}),
}


@dataclass
class World:
    cp: ControlPlane
    client: httpx.AsyncClient
    ids: dict[str, str]
    # SCIM's token made when the world was.
    scim_token: str

    def as_(self, login: str) -> dict[str, str]:
        cookie = self.cp.sessions.open_person(login, self.ids[login])
        return {"cookie": f"{COOKIE}={cookie}"}

    async def page(self, login: str) -> httpx.Response:
        return await self.client.get(PAGE, headers=self.as_(login))

    async def post(
        self, login: str, path: str, form: dict[str, str], csrf: bool = True
    ) -> httpx.Response:
        headers = self.as_(login)
        if csrf:
            cookie = headers["cookie"].split("=", 1)[1]
            session = self.cp.sessions.read(cookie)
            assert session is not None
            form = {**form, "csrf": self.cp.sessions.csrf(session)}
        return await self.client.post(path, data=form, headers=headers)

    async def settings(self) -> dict[str, str | None]:
        store = self.cp.store
        return {k: await store.get_setting(k) for k in ("auth.oidc", "auth.ldap", "auth.scim")}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    # Nothing listens: the app is called in process.
    init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    return root


@pytest.fixture
async def world(data_dir: Path) -> AsyncIterator[World]:
    root = data_dir
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    cp = ControlPlane(data, config, store)
    await cp.load()
    ids: dict[str, str] = {}
    logins = [("root", "admin"), ("vic", "viewer"), ("olga", "operator"), ("alice", None)]
    for login, role in logins:
        made = await cp.people.create(NewPerson(login=login, role=role), SYSTEM)  # type: ignore[arg-type]
        ids[login] = made.id
    acme = await cp.orgs.create_org(NewOrg("acme"), SYSTEM)
    await cp.orgs.create_team(acme.id, NewTeam("ml"), SYSTEM)
    await cp.orgs.set_member(acme.id, Member("alice", "admin"), SYSTEM)
    root_p = cp.directory.session_principal(ids["root"])
    assert root_p is not None
    await cp.oidc.set(
        OidcSet(
            client_id="llmgw-cluster",
            client_secret=CLIENT_SECRET,
            issuer="https://idp.example.com/realms/acme",
            maps=("gpu-admins=cluster:admin", "ml-people=acme/ml:member"),
        ),
        root_p,
    )
    await cp.ldap.set(
        LdapSet(
            # Nothing listens there: a test of it fails at its first step.
            url="ldap://127.0.0.1:1",
            bind_dn="cn=llmgw,dc=example,dc=com",
            base_dn="dc=example,dc=com",
            bind_password=BIND_PASSWORD,
            maps=("cn=ops,ou=groups,dc=example,dc=com=acme:manager",),
        ),
        root_p,
    )
    scim_token = await cp.scim.auth.new_token(root_p)
    transport = httpx.ASGITransport(app=cp.admin_app())
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
            yield World(cp, client, ids, scim_token)
    finally:
        await cp.gateway.close()
        await cp.inspector.close()
        await store.close()


def secrets_of(world: World, kept: dict[str, str | None]) -> list[str]:
    """Every secret the three keep, in every form it has: as given, its hash, sealed."""
    found = [CLIENT_SECRET, BIND_PASSWORD, world.scim_token]
    found.append(hashlib.sha256(world.scim_token.encode()).hexdigest())
    oidc = json.loads(kept["auth.oidc"] or "{}")
    ldap = json.loads(kept["auth.ldap"] or "{}")
    found += [oidc["client_secret"], ldap["bind_password"]]
    assert all(len(s) > 10 for s in found)
    return found


def form_ids(text: str) -> set[str]:
    return {f for f in FORMS if f'id="{f}"' in text}


async def test_the_admin_sees_all_three_and_every_form_and_no_secret(world: World) -> None:
    answer = await world.page("root")
    assert answer.status_code == 200, answer.text[-400:]
    text = answer.text
    assert form_ids(text) == set(FORMS)
    for shown in (
        "https://idp.example.com/realms/acme",
        "llmgw-cluster",
        "gpu-admins",
        "acme/ml",
        "ldap://127.0.0.1:1",
        "cn=llmgw,dc=example,dc=com",
        "cn=ops,ou=groups,dc=example,dc=com",
        "/scim/v2",
    ):
        assert shown in text, shown
    # When each last changed and by whom, from the audit.
    for way in ("oidc", "ldap", "scim"):
        section = text.split(f'<section id="{way}">', 1)[1].split("</section>", 1)[0]
        assert "Last changed" in section and "by root" in section, way
    for secret in secrets_of(world, await world.settings()):
        assert secret not in text
    # The header and the People page link the page for an admin, and for nobody else.
    people = (await world.client.get("/admin/people", headers=world.as_("root"))).text
    assert 'id="signin-link"' in people and 'href="/admin/signin"' in people
    for login in ("vic", "olga", "alice"):
        other = (await world.client.get("/admin/people", headers=world.as_(login))).text
        assert 'href="/admin/signin"' not in other, login


async def test_the_page_speaks_turkish(world: World) -> None:
    headers = {**world.as_("root"), "accept-language": "tr-TR,tr;q=0.9"}
    text = (await world.client.get(PAGE, headers=headers)).text
    assert "Oturum açma" in text and "Grup eşlemeleri" in text and "Kapat" in text


async def test_everyone_but_the_clusters_admins_is_refused_the_page_and_every_form(
    world: World,
) -> None:
    before = await world.settings()
    for login in ("vic", "olga", "alice"):
        assert (await world.page(login)).status_code == 403, login
        for form_id, (path, form) in FORMS.items():
            answer = await world.post(login, path, form)
            assert answer.status_code == 403, (login, form_id)
            assert world.scim_token not in answer.text
    assert await world.settings() == before
    # The token made before still opens SCIM.
    assert world.cp.scim.auth.token_ok(world.scim_token)


async def test_every_form_wants_the_csrf_token(world: World) -> None:
    before = await world.settings()
    for form_id, (path, form) in FORMS.items():
        answer = await world.post("root", path, form, csrf=False)
        assert answer.status_code == 403, form_id
        assert "form token" in answer.text, form_id
        wrong = await world.post("root", path, {**form, "csrf": "x" * 40}, csrf=False)
        assert wrong.status_code == 403, form_id
    assert await world.settings() == before


async def test_the_scim_token_is_shown_once(world: World) -> None:
    answer = await world.post("root", f"{PAGE}/scim/token", {})
    assert answer.status_code == 200
    found = re.search(r'<code id="new-scim-token">(llmgw-scim-[^<]+)</code>', answer.text)
    assert found is not None
    token = found.group(1)
    assert world.cp.scim.auth.token_ok(token)
    # The one before has ended.
    assert not world.cp.scim.auth.token_ok(world.scim_token)
    again = (await world.page("root")).text
    assert token not in again and 'id="new-scim-token"' not in again
    assert hashlib.sha256(token.encode()).hexdigest() not in again


async def test_the_ldap_test_shows_each_step_and_where_it_failed(world: World) -> None:
    answer = await world.post(
        "root", f"{PAGE}/ldap/test", {"login": "alice", "password": "her-pw-Tq7"}
    )
    assert answer.status_code == 200, answer.text[-400:]
    tested = answer.text.split('id="ldap-tested"', 1)[1].split("</section>", 1)[0]
    assert "Failed at connect" in tested
    assert re.search(r'<tr class="bad"><td>connect</td>', tested)
    # The password typed is never drawn back.
    assert "her-pw-Tq7" not in answer.text


async def test_the_admin_sets_scim_maps_and_turns_each_off(world: World) -> None:
    answer = await world.post(
        "root", f"{PAGE}/scim/maps", {"maps": "gpu-ops=cluster:operator\n\nml=acme/ml:member\n"}
    )
    assert answer.status_code == 303
    text = (await world.page("root")).text
    assert "gpu-ops=cluster:operator\nml=acme/ml:member" in text
    # A map naming an organisation that is not there: refused by the service, by name.
    bad = await world.post("root", f"{PAGE}/scim/maps", {"maps": "x=nowhere:member"})
    assert bad.status_code == 400 and "nowhere" in bad.text
    for way in ("oidc", "ldap", "scim"):
        assert (await world.post("root", f"{PAGE}/{way}/off", {})).status_code == 303, way
    kept = await world.settings()
    assert kept["auth.oidc"] == "" and kept["auth.ldap"] == ""
    assert not world.cp.scim.auth.token_ok(world.scim_token)
    text = (await world.page("root")).text
    assert form_ids(text) == {"scim-token", "scim-maps"}
    assert "Last changed" in text and "ldap://127.0.0.1:1" not in text
    nothing = await world.post("root", f"{PAGE}/kerberos/off", {})
    assert nothing.status_code == 404


async def test_the_service_refuses_everyone_but_the_clusters_admins(world: World) -> None:
    """Behind the gate's ``admin`` the service decides again, for any other edge."""
    signins = SignIns(world.cp.oidc, world.cp.ldap, world.cp.scim, world.cp.store)
    before = await world.settings()
    for login in ("vic", "olga", "alice"):
        by = world.cp.directory.session_principal(world.ids[login])
        assert by is not None
        calls = [
            signins.shown(by),
            signins.off("oidc", by),
            signins.off("ldap", by),
            signins.off("scim", by),
            signins.test_ldap(LdapTest(login="alice"), by),
            signins.new_scim_token(by),
            signins.set_scim_maps(["x=cluster:admin"], by),
        ]
        for call in calls:
            with pytest.raises(Refusal) as caught:
                await call
            assert caught.value.status == 403, login
    assert await world.settings() == before
