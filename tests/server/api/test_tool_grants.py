"""MCP tool grants and guard policies of keys and levels, set through the admin API:
what the gateway's key allows at once, a revoke at an organisation that reaches every
level and key beneath it, the grants listing, a standby's copy, and the refusals. Called
on the real admin app, in process, over the SQLite store."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx

from llmgw.server.app import ControlPlane
from llmgw.server.gateway import key_hash
from llmgw.server.gateway.limits import Key
from llmgw.server.people.records import Limits, Team
from llmgw.server.store import Audit

ORG = "/api/v1/orgs/acme"


async def tree_and_key(api: httpx.AsyncClient, name: str = "ci") -> tuple[str, str]:
    """Organisation acme, team vision, project vision/demo, and a key of the project:
    (the key, its id)."""
    for path, body in (
        ("/api/v1/orgs", {"name": "acme"}),
        ("/api/v1/orgs/acme/teams", {"name": "vision"}),
        ("/api/v1/orgs/acme/projects", {"name": "demo", "team": "vision"}),
    ):
        answer = await api.post(path, json=body)
        assert answer.status_code in (201, 409), answer.text
    made = await api.post("/api/v1/keys", json={"name": name, "org": "acme", "project": "demo"})
    assert made.status_code == 201, made.text
    return str(made.json()["key"]), str(made.json()["id"])


def gateway_key(cp: ControlPlane, key: str) -> Key:
    return cp.gateway.keys.keys[key_hash(key)]


async def post(api: httpx.AsyncClient, path: str, body: object, status: int = 200) -> object:
    answer = await api.post(path, json=body)
    assert answer.status_code == status, answer.text
    return answer.json()


async def test_a_grant_set_on_a_key_is_what_the_gateway_allows_at_once(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, api = plane
    key, key_id = await tree_and_key(api)
    held = gateway_key(cp, key)
    assert not held.tools.any and not held.tools.allows("jira.create_issue")

    answer = await post(api, f"/api/v1/keys/{key_id}/limits", {"tools": ["jira.*"], "rpm": 30})
    assert answer == {
        "rpm": 30,
        "tpm": None,
        "budget": None,
        "models": [],
        "tools": ["jira.*"],
        "guard": [],
        "revoked": [],
    }
    assert held.tools.allows("jira.create_issue") and not held.tools.allows("wiki.get")
    assert held.record.rpm == 30
    shown = (await api.get(f"/api/v1/keys/{key_id}")).json()
    assert (shown["tools"], shown["guard"]) == (["jira.*"], [])
    # A level above narrows it: the project grants jira's reading tools only.
    await post(api, f"{ORG}/projects/demo/limits", {"tools": ["jira.get_*"]})
    assert held.tools.allows("jira.get_issue") and not held.tools.allows("jira.create_issue")
    # Closed at the team: nothing beneath it, whatever the key and project grant.
    await post(api, f"{ORG}/teams/vision/limits", {"tools": []})
    assert held.tools.closed == "team vision" and not held.tools.allows("jira.get_issue")
    await post(api, f"{ORG}/teams/vision/limits", {"clear": ["tools"]})
    assert held.tools.allows("jira.get_issue")
    # Kept in the store: a control plane started again reads the same.
    (again,) = [k for k in await cp.store.list_api_keys() if k.id == key_id]
    assert (again.tools, again.rpm) == (("jira.*",), 30)


async def test_a_revoke_at_an_organisation_reaches_every_level_and_key_beneath_it(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, api = plane
    key, key_id = await tree_and_key(api)
    _, other_id = await tree_and_key(api, "other")
    await post(api, f"{ORG}/limits", {"tools": ["jira.*", "wiki.*"]})
    await post(api, f"{ORG}/teams/vision/limits", {"tools": ["jira.*", "*.search"]})
    await post(api, f"{ORG}/projects/demo/limits", {"tools": ["jira.get_issue", "wiki.get"]})
    await post(api, f"/api/v1/keys/{key_id}/limits", {"tools": ["jira.*"]})
    await post(api, f"/api/v1/keys/{other_id}/limits", {"tools": ["wiki.get"]})
    # A key of another organisation (the default one's) that names jira.
    elsewhere = await post(api, "/api/v1/keys", {"name": "elsewhere"}, 201)
    assert isinstance(elsewhere, dict)
    await post(api, f"/api/v1/keys/{elsewhere['id']}/limits", {"tools": ["jira.*"]})
    held = gateway_key(cp, key)
    assert held.tools.allows("jira.get_issue")
    before = len(await cp.store.audit_log(1000))

    answer = await post(api, f"{ORG}/limits", {"revoke_tools": "jira"})
    assert isinstance(answer, dict)
    assert answer["tools"] == ["wiki.*"]
    revoked = {(r["level"], r["label"]): (r["patterns"], r["closed"]) for r in answer["revoked"]}
    assert revoked == {
        ("team", "team vision"): ([], True),
        ("project", "project vision/demo"): (["wiki.get"], False),
        ("key", "key ci"): ([], True),
    }
    # The other key named nothing of jira: left alone, and so is what is not jira's.
    now = {k.id: k.tools for k in await cp.store.list_api_keys()}
    assert now[other_id] == ("wiki.get",)
    assert now[elsewhere["id"]] == ("jira.*",)
    assert now[key_id] == ()
    # `*.search` reaches jira's tools too (jira.search): it goes, and the team is closed.
    team = next(t for t in cp.directory.now.teams.values() if t.name == "vision")
    assert team.limits.tools == ()
    # At once, in the gateway: the key is closed.
    assert held.tools.closed is not None and not held.tools.allows("jira.get_issue")
    # One audit entry per level or key changed: organisation, team, project, key.
    entries = (await cp.store.audit_log(1000))[: len(await cp.store.audit_log(1000)) - before]
    assert sorted(e["action"] for e in entries) == [
        "key.limits",
        "org.limits",
        "project.limits",
        "team.limits",
    ]


async def test_the_grants_listing_names_each_level_and_key_and_filters_by_server(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, api = plane
    _, key_id = await tree_and_key(api)
    await post(api, f"{ORG}/limits", {"tools": ["jira.*", "wiki.*"]})
    await post(api, f"{ORG}/teams/vision/limits", {"tools": []})
    await post(api, f"/api/v1/keys/{key_id}/limits", {"tools": ["wiki.get"]})
    every = (await api.get("/api/v1/mcp/grants")).json()
    assert [(g["level"], g["label"], g["patterns"], g["closed"]) for g in every] == [
        ("org", "organisation acme", ["jira.*", "wiki.*"], False),
        ("team", "team vision", [], True),
        ("key", "key ci", ["wiki.get"], False),
    ]
    org_id = every[0]["id"]
    assert all(g["org"] == org_id for g in every)
    jira = (await api.get("/api/v1/mcp/grants", params={"server": "jira"})).json()
    assert [(g["label"], g["patterns"]) for g in jira] == [
        ("organisation acme", ["jira.*"]),
        ("team vision", []),
    ]
    bad = await api.get("/api/v1/mcp/grants", params={"server": "Not A Server"})
    assert bad.status_code == 400 and "server" in bad.text


async def test_bad_patterns_unknown_policies_and_unknown_keys_are_refused_by_name(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, api = plane
    _, key_id = await tree_and_key(api)
    bad = await api.post(f"/api/v1/keys/{key_id}/limits", json={"tools": ["jira..x"]})
    assert bad.status_code == 400 and "'jira..x' is not a tool pattern" in bad.text
    nameless = await api.post(f"{ORG}/limits", json={"tools": ["noserver"]})
    assert nameless.status_code == 400 and "'noserver'" in nameless.text
    unknown = await api.post(f"/api/v1/keys/{key_id}/limits", json={"guard": ["pii"]})
    assert unknown.status_code == 400
    assert "no guard policy 'pii'" in unknown.text
    assert "llmgw ctl guard policy list" in unknown.text
    missing = await api.post("/api/v1/keys/nosuchkey/limits", json={"rpm": 5})
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "unknown_key"
    assert "no key nosuchkey: `llmgw ctl keys list` lists them" in missing.text
    # Nothing was changed by the refusals.
    (record,) = [k for k in await cp.store.list_api_keys() if k.id == key_id]
    assert (record.tools, record.guard) == (None, ())

    # Once the guard keeps a policy of that name, it may be named.
    await cp.store.put_setting("guard", json.dumps({"policies": [{"name": "pii"}]}))
    await post(api, f"/api/v1/keys/{key_id}/limits", {"guard": ["pii"]})
    await post(api, f"{ORG}/limits", {"guard": ["pii"]})
    assert gateway_key_by_id(cp, key_id).policies == ("pii",)
    await post(api, f"/api/v1/keys/{key_id}/limits", {"clear": ["guard"]})
    assert gateway_key_by_id(cp, key_id).policies == ("pii",)  # the organisation's still


def gateway_key_by_id(cp: ControlPlane, key_id: str) -> Key:
    return next(k for k in cp.gateway.keys.keys.values() if k.record.id == key_id)


async def test_a_standbys_copy_brings_grants_to_its_gateway(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, api = plane
    key, _ = await tree_and_key(api)
    held = gateway_key(cp, key)
    (team,) = [t for t in await cp.store.directory.all(Team) if t.name == "vision"]
    # The leader's write, as a standby's copy of the store receives it: no API call here.
    granted = replace(team, limits=Limits(tools=("wiki.*",)))
    await cp.store.directory.put(granted, Audit("admin", "team.limits", "vision"))
    assert not held.tools.allows("wiki.get")
    await cp.reload({"teams"})
    assert held.tools.allows("wiki.get")
    record = replace(held.record, tools=())
    await cp.store.set_limits([(record, Audit("admin", "key.limits", record.id))])
    await cp.reload({"api_keys"})
    assert gateway_key(cp, key).tools.closed == "key ci"
