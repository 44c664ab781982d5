"""The People and Organisations pages of a real control plane, called in process over
its SQLite store with people's own sessions: each caller (a cluster admin, viewer and
operator, an organisation's admin, a team's manager, a plain member) sees exactly the
forms they may send; every new form wants the session's CSRF token; a form sent by
someone who may not is refused by the service and changes nothing; another
organisation's ids are not found."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from starlette.routing import Route

from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.people.asks import Member, NewOrg, NewPerson, NewProject, NewTeam
from llmgw.server.principal import Principal
from llmgw.server.sessions import COOKIE
from llmgw.server.store import open_store

SYSTEM = Principal.system("test")
# Every form a page of these screens may draw, by its id.
FORMS = ("new-person", "new-org", "new-team", "new-project", "set-member", "new-key-form")


@dataclass
class World:
    cp: ControlPlane
    client: httpx.AsyncClient
    acme: str
    globex: str
    ml: str
    chat: str
    globex_project: str
    ids: dict[str, str]

    def as_(self, login: str) -> dict[str, str]:
        cookie = self.cp.sessions.open_person(login, self.ids[login])
        return {"cookie": f"{COOKIE}={cookie}"}

    async def page(self, login: str, path: str) -> tuple[str, str]:
        """The page as ``login`` sees it, and the CSRF token it carries."""
        answer = await self.client.get(path, headers=self.as_(login))
        assert answer.status_code == 200, (login, path, answer.text[-400:])
        found = re.search(r'name="csrf" value="([^"]+)"', answer.text)
        return answer.text, found.group(1) if found else ""

    async def post(
        self, login: str, path: str, form: dict[str, str], csrf: bool = True
    ) -> httpx.Response:
        headers = self.as_(login)
        if csrf:
            # The token of this login's session: read from a page it opens.
            cookie = headers["cookie"].split("=", 1)[1]
            session = self.cp.sessions.read(cookie)
            assert session is not None
            form = {**form, "csrf": self.cp.sessions.csrf(session)}
        return await self.client.post(path, data=form, headers=headers)


def forms(text: str) -> set[str]:
    return {f for f in FORMS if f'id="{f}"' in text}


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
    people, orgs = cp.people, cp.orgs
    ids: dict[str, str] = {}
    for login, role in [
        ("root", "admin"),
        ("vic", "viewer"),
        ("olga", "operator"),
        ("alice", None),
        ("carol", None),
        ("bob", None),
        ("gina", None),
        ("dave", None),
    ]:
        made = await people.create(NewPerson(login=login, role=role), SYSTEM)  # type: ignore[arg-type]
        ids[login] = made.id
    acme = await orgs.create_org(NewOrg("acme"), SYSTEM)
    globex = await orgs.create_org(NewOrg("globex"), SYSTEM)
    ml = await orgs.create_team(acme.id, NewTeam("ml"), SYSTEM)
    chat = await orgs.create_project(acme.id, NewProject("chat", "ml"), SYSTEM)
    await orgs.create_team(globex.id, NewTeam("ops"), SYSTEM)
    other = await orgs.create_project(globex.id, NewProject("pager", "ops"), SYSTEM)
    await orgs.set_member(acme.id, Member("alice", "admin"), SYSTEM)
    await orgs.set_member(acme.id, Member("carol", "manager", "ml"), SYSTEM)
    await orgs.set_member(acme.id, Member("bob", "member", "ml"), SYSTEM)
    await orgs.set_member(globex.id, Member("gina", "admin"), SYSTEM)
    transport = httpx.ASGITransport(app=cp.admin_app())
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
            yield World(cp, client, acme.id, globex.id, ml.id, chat.id, other.id, ids)
    finally:
        await cp.gateway.close()
        await cp.inspector.close()
        await store.close()


async def test_each_caller_sees_exactly_the_forms_they_may_send(world: World) -> None:
    org = f"/admin/org/{world.acme}"
    expected = {
        # The cluster's admin: everything.
        "root": {"new-team", "new-project", "set-member", "new-key-form"},
        # The organisation's admin: its teams, projects, members and project keys.
        "alice": {"new-team", "new-project", "set-member", "new-key-form"},
        # The team's manager: the team's projects' keys, nothing of its shape.
        "carol": {"new-key-form"},
        # A member: a key of their own, nothing else.
        "bob": {"new-key-form"},
        # The cluster's viewer reads and sends nothing; its operator manages keys.
        "vic": set(),
        "olga": {"new-key-form"},
    }
    for login, wanted in expected.items():
        text, _ = await world.page(login, org)
        assert forms(text) == wanted, login
        assert "chat" in text and "ml" in text, login  # everyone sees teams and projects
    # Whose a key may be: exactly the projects each manages, or themselves.
    owners = {
        login: re.findall(r'<option value="((?:project|personal):[^"]+)"', text)
        for login in ("alice", "carol", "bob", "olga")
        for text in [(await world.page(login, org))[0]]
    }
    assert owners["carol"] == [f"project:{world.chat}", f"personal:{world.acme}"]
    assert owners["bob"] == [f"personal:{world.acme}"]
    # The cluster's operator manages every project's keys, and may have one of her own.
    assert owners["olga"] == [f"project:{world.chat}", f"personal:{world.acme}"]
    assert owners["alice"] == owners["olga"]
    # A team's manager reads the usage; a plain member does not get the link.
    assert "/admin/usage?org=" in (await world.page("carol", org))[0]
    assert "/admin/usage?org=" in (await world.page("alice", org))[0]
    assert "/admin/usage?org=" not in (await world.page("bob", org))[0]
    # People and organisations are made by the cluster's admin alone.
    for login in expected:
        people_html, _ = await world.page(login, "/admin/people")
        orgs_html, _ = await world.page(login, "/admin/org")
        assert ("new-person" in forms(people_html)) == (login == "root"), login
        assert ("new-org" in forms(orgs_html)) == (login == "root"), login
    # A person's page: the admin changes them; only they make their own tokens.
    bob = f"/admin/people/{world.ids['bob']}"
    root_sees, _ = await world.page("root", bob)
    assert 'id="change-person"' in root_sees and 'id="person-active"' in root_sees
    assert 'id="new-token-form"' not in root_sees
    own, _ = await world.page("bob", bob)
    assert 'id="new-token-form"' in own and 'id="change-person"' not in own
    viewer_sees, _ = await world.page("vic", bob)
    assert 'id="change-person"' not in viewer_sees and "Personal tokens" not in viewer_sees


async def test_a_member_opens_their_own_pages_and_no_cluster_page(world: World) -> None:
    bob = world.as_("bob")
    for path in ("/admin/org", f"/admin/org/{world.acme}", "/admin/keys", "/admin/usage"):
        answer = await world.client.get(path, headers=bob)
        assert answer.status_code == 200, path
    own = await world.client.get(f"/admin/people/{world.ids['bob']}", headers=bob)
    assert own.status_code == 200 and "bob" in own.text
    for path in ("/admin", "/admin/nodes", "/admin/models", "/admin/audit", "/admin/gpus"):
        answer = await world.client.get(path, headers=bob)
        assert answer.status_code == 403, path
        assert "it needs the viewer role" in answer.text
    # The header links only the pages they may open.
    text = (await world.client.get("/admin/org", headers=bob)).text
    assert 'href="/admin/org"' in text and 'href="/admin/nodes"' not in text
    assert "Signed in as bob (member)" in text
    # Another organisation, and another person, are not found.
    assert (await world.client.get(f"/admin/org/{world.globex}", headers=bob)).status_code == 404
    alice = f"/admin/people/{world.ids['alice']}"
    assert (await world.client.get(alice, headers=bob)).status_code == 404
    # The organisations they may pick on the usage page are theirs.
    usage = (await world.client.get("/admin/usage?by=project", headers=bob)).text
    assert f'value="{world.acme}"' in usage and f'value="{world.globex}"' not in usage


def new_posts(world: World) -> list[str]:
    """Every change these screens take, each path filled in with real ids."""
    app = world.cp.admin_app()
    paths = [
        r.path
        for r in app.routes
        if isinstance(r, Route)
        and "POST" in (r.methods or ())
        and r.path.startswith(("/admin/org", "/admin/people", "/admin/keys"))
    ]
    fill = {
        "{org}": world.acme,
        "{team}": world.ml,
        "{project}": world.chat,
        "{person}": world.ids["bob"],
        "{token_id}": "x",
        "{key_id}": "x",
    }
    out = []
    for path in paths:
        for name, value in fill.items():
            path = path.replace(name, value)
        out.append(path)
    return out


async def test_every_new_form_wants_the_sessions_csrf_token(world: World) -> None:
    posts = new_posts(world)
    assert len(posts) >= 15
    before = world.cp.directory.now
    counts = (len(before.teams), len(before.projects), len(before.memberships))
    for path in posts:
        for login in ("root", "alice"):
            form = {"name": "x", "person": "dave", "team": "", "active": "false"}
            answer = await world.post(login, path, form, csrf=False)
            assert answer.status_code == 403, (login, path)
            assert "form token is missing or old" in answer.text, path
            forged = await world.post(login, path, {**form, "csrf": "forged"}, csrf=False)
            assert forged.status_code == 403, (login, path)
    now = world.cp.directory.now
    assert (len(now.teams), len(now.projects), len(now.memberships)) == counts
    assert all(p.active for p in now.people.values())


async def test_a_form_sent_by_someone_who_may_not_is_refused_by_the_service(world: World) -> None:
    org = f"/admin/org/{world.acme}"
    refused = [
        ("bob", f"{org}/teams", {"name": "rogue"}, "making a team needs the admin role"),
        ("carol", f"{org}/teams", {"name": "rogue"}, "making a team needs the admin role"),
        ("vic", f"{org}/teams", {"name": "rogue"}, "making a team needs the admin role"),
        (
            "bob",
            f"{org}/members",
            {"person": "dave", "role": "admin", "team": ""},
            "changing members needs the admin role",
        ),
        (
            "carol",
            f"{org}/projects",
            {"name": "rogue", "team": world.ml},
            "making a project needs the admin role",
        ),
        ("alice", "/admin/people", {"login": "eve", "role": "admin"}, "needs the cluster's admin"),
        ("vic", "/admin/org", {"name": "rogue"}, "needs the cluster's admin role"),
        (
            "bob",
            f"{org}/keys",
            {"name": "k", "owner": f"project:{world.chat}"},
            "manager role",
        ),
        ("vic", "/admin/keys", {"name": "k", "owner": f"project:{world.chat}"}, "manager role"),
        (
            "alice",
            f"/admin/people/{world.ids['bob']}/active",
            {"active": "false"},
            "changing people needs the cluster's admin role",
        ),
    ]
    for login, path, form, words in refused:
        answer = await world.post(login, path, form)
        assert answer.status_code == 403, (login, path, answer.text[-300:])
        assert words in html.unescape(answer.text), (login, path)
    now = world.cp.directory.now
    assert not any(t.name == "rogue" for t in now.teams.values())
    assert not any(o.name == "rogue" for o in now.orgs.values())
    assert world.cp.directory.by_login("eve") is None
    assert world.cp.directory.find_person("bob").active  # type: ignore[union-attr]
    assert world.cp.keys.records(SYSTEM) == []
    # Nobody takes their own admin role away, from a page either.
    own = await world.post(
        "alice", f"{org}/members", {"person": "alice", "role": "member", "team": ""}
    )
    assert own.status_code == 403 and "your own admin role" in html.unescape(own.text)


async def test_another_organisations_ids_are_not_found_on_every_form(world: World) -> None:
    globex = f"/admin/org/{world.globex}"
    for path, form in [
        (f"{globex}/teams", {"name": "x"}),
        (f"{globex}/members", {"person": "dave", "role": "member", "team": ""}),
        (f"{globex}/keys", {"name": "k", "owner": f"personal:{world.globex}"}),
        (f"{globex}/projects/{world.globex_project}/remove", {}),
    ]:
        answer = await world.post("alice", path, form)
        assert answer.status_code == 404, path
    acme = f"/admin/org/{world.acme}"
    # A project of another organisation named on this one's page is not found here.
    foreign = await world.post(
        "alice", f"{acme}/keys", {"name": "k", "owner": f"project:{world.globex_project}"}
    )
    assert foreign.status_code == 404
    team = await world.post(
        "alice", f"{acme}/projects", {"name": "x", "team": world.globex_project}
    )
    assert team.status_code == 404
    assert world.cp.keys.records(SYSTEM) == []


async def test_an_org_admin_adds_a_member_and_makes_a_project_key_shown_once(world: World) -> None:
    org = f"/admin/org/{world.acme}"
    added = await world.post(
        "alice", f"{org}/members", {"person": "dave", "role": "manager", "team": world.ml}
    )
    assert added.status_code == 303 and added.headers["location"] == org
    (membership,) = world.cp.directory.memberships_of(world.ids["dave"])
    assert (membership.kind, membership.scope_id, membership.role) == ("team", world.ml, "manager")
    made = await world.post(
        "alice", f"{org}/keys", {"name": "chatbot", "owner": f"project:{world.chat}", "rpm": "60"}
    )
    assert made.status_code == 200
    key = re.search(r'<code id="new-key">(sk-[^<]+)</code>', made.text)
    assert key is not None
    (record,) = world.cp.keys.records(SYSTEM)
    assert (record.org_id, record.project_id, record.person_id, record.rpm) == (
        world.acme,
        world.chat,
        None,
        60,
    )
    # Shown once: the page after it lists the key, never the key itself.
    again, _ = await world.page("alice", org)
    assert record.id in again and key.group(1) not in again
    assert "acme / ml/chat" in again
    # Dave, now the team's manager, sees it and may revoke it; bob sees it, may not.
    dave, _ = await world.page("dave", org)
    assert f"{org}/keys/{record.id}/revoke" in dave
    bob, _ = await world.page("bob", org)
    assert record.id in bob and f"/keys/{record.id}/revoke" not in bob
    gone = await world.post("dave", f"{org}/keys/{record.id}/revoke", {})
    assert gone.status_code == 303
    assert world.cp.keys.records(SYSTEM)[0].revoked_at is not None


async def test_a_deactivated_person_is_refused_at_their_next_page(world: World) -> None:
    bob = world.as_("bob")
    assert (await world.client.get("/admin/org", headers=bob)).status_code == 200
    path = f"/admin/people/{world.ids['bob']}/active"
    answer = await world.post("root", path, {"active": "false"})
    assert answer.status_code == 303
    text, _ = await world.page("root", f"/admin/people/{world.ids['bob']}")
    assert 'id="state">deactivated' in text
    after = await world.client.get("/admin/org", headers=bob)
    assert after.status_code == 303 and after.headers["location"].startswith("/admin/login")


async def test_a_person_makes_and_revokes_their_own_token_shown_once(world: World) -> None:
    path = f"/admin/people/{world.ids['bob']}/tokens"
    made = await world.post("bob", path, {"name": "laptop", "days": "30"})
    assert made.status_code == 200
    token = re.search(r'<code id="new-token">(llmgw-pat-[^<]+)</code>', made.text)
    assert token is not None
    principal = world.cp.directory.by_token(token.group(1))
    assert principal is not None and principal.name == "bob"
    # Nobody else makes one for them, not even the cluster's admin.
    refused = await world.post("root", path, {"name": "theirs"})
    assert refused.status_code == 403 and "made by its person alone" in refused.text
    (record,) = world.cp.directory.tokens_of(world.ids["bob"])
    text, _ = await world.page("bob", f"/admin/people/{world.ids['bob']}")
    assert "laptop" in text and token.group(1) not in text
    revoked = await world.post("bob", f"{path}/{record.id}/revoke", {})
    assert revoked.status_code == 303
    assert world.cp.directory.by_token(token.group(1)) is None


async def test_the_usage_page_sums_by_organisation_team_project_and_person(world: World) -> None:
    for by in ("org", "team", "project", "person", "key", "day"):
        answer = await world.client.get(
            f"/admin/usage?by={by}&org={world.acme}", headers=world.as_("alice")
        )
        assert answer.status_code == 200, by
        assert f'<option value="{by}" selected>' in answer.text, by
        assert f'<option value="{world.acme}" selected>' in answer.text
    # An organisation the caller does not belong to is not found, as in the API.
    other = await world.client.get(f"/admin/usage?org={world.globex}", headers=world.as_("bob"))
    assert other.status_code == 404


async def test_the_admin_changes_a_persons_role_and_an_unchanged_role_is_not_pinned(
    world: World,
) -> None:
    path = f"/admin/people/{world.ids['carol']}"
    # The form sends the role as it is: a change of name alone leaves it unpinned, so an
    # identity provider's groups may still set it.
    same = await world.post("root", path, {"name": "Carol C", "email": "", "role": "none"})
    assert same.status_code == 303
    carol = world.cp.directory.find_person("carol")
    assert carol is not None and carol.name == "Carol C"
    assert (carol.role, carol.role_by_hand) == (None, False)
    raised = await world.post("root", path, {"name": "Carol C", "role": "operator"})
    assert raised.status_code == 303
    carol = world.cp.directory.find_person("carol")
    assert carol is not None and (carol.role, carol.role_by_hand) == ("operator", True)
    text, _ = await world.page("root", path)
    assert '<option value="operator" selected>' in text
    # She now opens the cluster's pages; taken back to none, she does not.
    assert (await world.client.get("/admin/nodes", headers=world.as_("carol"))).status_code == 200
    await world.post("root", path, {"role": "none"})
    assert (await world.client.get("/admin/nodes", headers=world.as_("carol"))).status_code == 403
    bad = await world.post("root", path, {"role": "boss"})
    assert bad.status_code == 400 and "role: 'boss' is not none" in html.unescape(bad.text)
