"""Another organisation's ids, on the real admin app: people of one organisation (its
admin, a manager, a member, each with a personal token) name the other's organisation,
team, project, person and keys on every ``/api/v1/orgs/{org}/...`` route and on the
key and usage routes, and are answered 404 every time, with none of the other
organisation's names, keys or usage in any answer; and nothing of it changes."""

from __future__ import annotations

import datetime as dt
import re

import httpx

from llmgw.server.app import ControlPlane
from llmgw.server.people.asks import NewOrg, NewProject, NewTeam
from llmgw.server.requests import CreateKey
from tests.support.people import SETUP, person_with_token

# A body each route takes, valid but for the ids: what is refused is the id alone.
BODIES: dict[tuple[str, str], dict[str, object]] = {
    ("POST", "/api/v1/orgs/{org}"): {"name": "Renamed"},
    ("POST", "/api/v1/orgs/{org}/teams"): {"name": "new-team"},
    ("POST", "/api/v1/orgs/{org}/projects"): {"name": "new-project", "team": "{team}"},
    ("POST", "/api/v1/orgs/{org}/members"): {"person": "{own}", "role": "admin", "team": "{team}"},
    ("POST", "/api/v1/orgs/{org}/limits"): {"rpm": 1},
    ("POST", "/api/v1/orgs/{org}/teams/{team}/limits"): {"rpm": 1},
    ("POST", "/api/v1/orgs/{org}/projects/{project}/limits"): {"rpm": 1},
}


def filled(value: object, ids: dict[str, str]) -> object:
    if isinstance(value, str):
        return re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], value)
    if isinstance(value, dict):
        return {k: filled(v, ids) for k, v in value.items()}
    return value


async def test_another_organisations_ids_are_not_found_on_every_route(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, _ = plane
    orgs = cp.orgs
    ours = await orgs.create_org(NewOrg(name="acme"), SETUP)
    our_team = await orgs.create_team(ours.id, NewTeam(name="acme-team"), SETUP)
    await orgs.create_project(ours.id, NewProject(name="acme-project", team=our_team.id), SETUP)
    theirs = await orgs.create_org(NewOrg(name="globex"), SETUP)
    team = await orgs.create_team(theirs.id, NewTeam(name="globex-team"), SETUP)
    project = await orgs.create_project(
        theirs.id, NewProject(name="globex-project", team=team.id), SETUP
    )
    stranger, stranger_token = await person_with_token(
        cp, "globex-stranger", None, ((theirs.id, "member", team.id),)
    )
    their_key, _ = await cp.keys.create(
        CreateKey(name="globex-key", org=theirs.id, project=project.id), SETUP
    )
    stranger_who = cp.directory.by_token(stranger_token)
    assert stranger_who is not None
    personal, _ = await cp.keys.create(
        CreateKey(name="globex-personal", personal=True), stranger_who
    )
    today = dt.datetime.now(dt.UTC).date().isoformat()
    await cp.store.add_usage([(today, their_key.id, "qwen", "r1", 7, 70, 700)])
    callers = {}
    for login, role in (
        ("acme-admin", "admin"),
        ("acme-manager", "manager"),
        ("acme-member", "member"),
    ):
        person, token = await person_with_token(cp, login, None, ((ours.id, role, None),))  # type: ignore[arg-type]
        callers[login] = (person, token)

    # Nothing of theirs may be in any answer: their names, their keys' ids, their usage.
    secrets = ["globex", their_key.id, personal.id, "globex-stranger"]
    before = (cp.directory.now.teams[team.id], cp.directory.now.projects[project.id])
    org_ops = [op for op in cp.routes() if op.path.startswith("/api/v1/orgs/{org}")]
    assert len(org_ops) >= 15
    transport = httpx.ASGITransport(app=cp.admin_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
        for login, (person, token) in callers.items():
            auth = {"authorization": f"Bearer {token}"}
            # Their organisation in the path; then ours, with their team, project, person.
            for org in (theirs.id, theirs.name, ours.id):
                ids = {
                    "org": org,
                    "team": team.id,
                    "project": project.id,
                    "person": stranger.id,
                    "own": person.id,
                }
                for op in org_ops:
                    if org == ours.id and not re.search(r"\{(team|project|person)\}", op.path):
                        if (op.method, op.path) not in BODIES or "{team}" not in str(
                            BODIES[(op.method, op.path)]
                        ):
                            continue  # names nothing of theirs
                    path = str(filled(op.path, ids))
                    body = filled(BODIES.get((op.method, op.path)), ids)
                    kwargs = {"json": body} if op.body is not None else {}
                    if op.path.endswith("/members/{person}"):
                        kwargs["params"] = {"team": team.id}
                    answer = await client.request(op.method, path, headers=auth, **kwargs)  # type: ignore[arg-type]
                    where = f"{op.method} {path} as {login}: {answer.text[:200]}"
                    assert answer.status_code == 404, where
                    assert not any(s in answer.text for s in secrets), where
            # Their keys and usage.
            for method in ("GET", "DELETE"):
                for key in (their_key.id, personal.id):
                    answer = await client.request(method, f"/api/v1/keys/{key}", headers=auth)
                    assert answer.status_code == 404, f"{method} {key} as {login}"
            for key in (their_key.id, personal.id):
                answer = await client.post(
                    f"/api/v1/keys/{key}", headers=auth, json={"priority": 1}
                )
                assert answer.status_code == 404, f"priority of {key} as {login}"
            for ask in (
                {"name": "k", "org": theirs.id},
                {"name": "k", "org": theirs.name, "project": project.id},
                {"name": "k", "project": project.id},
                {"name": "k", "org": ours.id, "project": project.id},
                {"name": "k", "org": theirs.id, "personal": True},
            ):
                answer = await client.post("/api/v1/keys", headers=auth, json=ask)
                assert answer.status_code == 404, f"{ask} as {login}: {answer.text}"
            listing = await client.get("/api/v1/keys", headers=auth)
            assert listing.status_code == 200
            assert not any(s in listing.text for s in secrets), login
            for query in ({"org": theirs.id}, {"org": theirs.name}):
                answer = await client.get("/api/v1/usage", headers=auth, params=query)
                assert answer.status_code == 404, f"usage {query} as {login}"
            for by in ("org", "team", "project", "key", "person", None):
                query = {"by": by} if by else {}
                answer = await client.get("/api/v1/usage", headers=auth, params=query)
                assert answer.status_code == 200
                assert not any(s in answer.text for s in secrets), f"usage by {by} as {login}"
            for path in (f"/api/v1/people/{stranger.id}", f"/api/v1/people/{stranger.login}"):
                answer = await client.get(path, headers=auth)
                assert answer.status_code == 404, f"{path} as {login}"
            listing = await client.get("/api/v1/orgs", headers=auth)
            assert [o["id"] for o in listing.json()] == [ours.id]
    # Nothing of theirs changed, and their key and usage are as they were.
    assert (cp.directory.now.teams[team.id], cp.directory.now.projects[project.id]) == before
    assert cp.directory.now.orgs[theirs.id] == theirs
    assert cp.keys.keys.find(their_key.id) == their_key
    assert cp.directory.memberships_of(stranger.id)[0].scope_id == team.id
    rows = await cp.store.usage(today)
    assert [(r["key_id"], r["requests"]) for r in rows] == [(their_key.id, 7)]
