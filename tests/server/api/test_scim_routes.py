"""``/scim/v2`` and ``/api/v1/auth/scim`` in the real admin app, in process: SCIM's token
opens SCIM alone and nothing else opens it; its answers are SCIM's (media type, error
shape, paging, attributes); its settings are a cluster admin's, and its token is never
shown back nor logged."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from llmgw.server.app import ControlPlane
from llmgw.server.people.asks import NewPerson, NewToken
from llmgw.server.principal import Principal
from llmgw.wire.admin.scim import ScimJson, ScimTokenJson
from tests.server.api.test_answer_shapes import problems

MEDIA = "application/scim+json"
ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
PATCH_OP = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
Plane = tuple[ControlPlane, httpx.AsyncClient]


async def scim_token(client: httpx.AsyncClient) -> dict[str, str]:
    made = await client.post("/api/v1/auth/scim/token")
    assert made.status_code == 200, made.text
    return {"authorization": f"Bearer {made.json()['token']}"}


async def personal_token(cp: ControlPlane, login: str, role: Any) -> str:
    admin = Principal.system("test")
    person = await cp.people.create(NewPerson(login=login, role=role), admin)
    me = cp.directory.principal(person, "session")
    assert me is not None
    _, token = await cp.people.new_token(person.id, NewToken(name="t"), me)
    return token


def scim_error(answer: httpx.Response, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith(MEDIA)
    doc: dict[str, Any] = answer.json()
    assert doc["schemas"] == [ERROR] and doc["status"] == str(status), doc
    return doc


async def test_scims_token_opens_scim_alone_and_no_other_token_opens_it(plane: Plane) -> None:
    cp, client = plane
    # Off until a token is made: even the admin token is refused.
    refused = await client.get("/scim/v2/Users")
    assert "ctl auth scim token" in scim_error(refused, 401)["detail"]
    assert refused.headers["www-authenticate"].startswith("Bearer")
    scim = await scim_token(client)
    assert (await client.get("/scim/v2/Users", headers=scim)).status_code == 200
    admin_personal = await personal_token(cp, "root", "admin")
    for other in ({}, {"authorization": f"Bearer {admin_personal}"}):
        scim_error(await client.get("/scim/v2/Users", headers=other), 401)
    # ... and SCIM's token opens nothing of the admin API.
    answer = await client.get("/api/v1/people", headers=scim)
    assert answer.status_code == 401, answer.text
    # A new token ends the one before; off ends SCIM.
    newer = await scim_token(client)
    scim_error(await client.get("/scim/v2/Users", headers=scim), 401)
    assert (await client.get("/scim/v2/Users", headers=newer)).status_code == 200
    off = await client.delete("/api/v1/auth/scim")
    assert off.status_code == 200 and off.json()["token"] is None
    scim_error(await client.get("/scim/v2/Users", headers=newer), 401)


async def test_scims_settings_are_a_cluster_admins(plane: Plane) -> None:
    cp, client = plane
    operator = {"authorization": f"Bearer {await personal_token(cp, 'olga', 'operator')}"}
    for method, path in (
        ("GET", "/api/v1/auth/scim"),
        ("POST", "/api/v1/auth/scim/token"),
        ("DELETE", "/api/v1/auth/scim"),
        ("POST", "/api/v1/auth/scim/maps"),
    ):
        answer = await client.request(method, path, headers=operator, json={"maps": []})
        assert answer.status_code == 403, (path, answer.text)
    assert cp.scim.auth.now.token_hash is None


async def test_the_token_is_shown_once_never_again_nor_logged(
    plane: Plane, caplog: pytest.LogCaptureFixture
) -> None:
    cp, client = plane
    caplog.set_level(logging.DEBUG)
    made = (await client.post("/api/v1/auth/scim/token")).json()
    token = made["token"]
    assert token.startswith("llmgw-scim-") and made["endpoint"] == "/scim/v2"
    scim = {"authorization": f"Bearer {token}"}
    said = [
        await client.get("/api/v1/auth/scim"),
        await client.post("/api/v1/auth/scim/maps", json={"maps": ["eng=cluster:viewer"]}),
        await client.get("/scim/v2/Users", headers=scim),
        await client.get("/scim/v2/ServiceProviderConfig", headers=scim),
        await client.get("/scim/v2/nowhere", headers=scim),
    ]
    shown = said[0].json()
    assert shown["token"] == "set" and shown["maps"] == []
    # The shapes ctl reads (llmgw.wire.admin.scim), exactly.
    assert problems(ScimJson, shown) == [] and problems(ScimJson, said[1].json()) == []
    assert problems(ScimTokenJson, made) == []
    assert said[1].json()["maps"] == ["eng=cluster:viewer"]
    for answer in said:
        assert token not in answer.text
    audit = await cp.store.audit_log(limit=50)
    assert any(r["action"] == "scim.token" for r in audit)
    assert token not in str(audit) and token not in caplog.text


async def test_users_answer_as_scim_says_paged_and_narrowed(plane: Plane) -> None:
    _, client = plane
    scim = await scim_token(client)
    ids = []
    for n in range(5):
        made = await client.post(
            "/scim/v2/Users",
            headers={**scim, "content-type": MEDIA},
            json={"userName": f"user{n}", "displayName": f"User {n}", "externalId": f"e{n}"},
        )
        assert made.status_code == 201, made.text
        assert made.headers["content-type"].startswith(MEDIA)
        assert made.headers["location"] == made.json()["meta"]["location"]
        assert made.headers["location"].endswith(f"/scim/v2/Users/{made.json()['id']}")
        ids.append(made.json()["id"])
    page = (await client.get("/scim/v2/Users?startIndex=2&count=2", headers=scim)).json()
    assert page["totalResults"] == 5 and page["startIndex"] == 2 and page["itemsPerPage"] == 2
    assert [r["id"] for r in page["Resources"]] == ids[1:3]
    only = (await client.get(f"/scim/v2/Users/{ids[0]}?attributes=externalId", headers=scim)).json()
    assert only == {"schemas": only["schemas"], "id": ids[0], "externalId": "e0"}
    less = await client.get(f"/scim/v2/Users/{ids[0]}?excludedAttributes=displayName", headers=scim)
    assert "displayName" not in less.json() and less.json()["userName"] == "user0"
    found = await client.post(
        "/scim/v2/Users/.search",
        headers=scim,
        json={"filter": 'externalId eq "e3"', "attributes": ["userName"]},
    )
    assert [r.get("userName") for r in found.json()["Resources"]] == ["user3"]
    bad = scim_error(await client.get('/scim/v2/Users?filter=userName sw "u"', headers=scim), 400)
    assert bad["scimType"] == "invalidFilter" and "only eq" in bad["detail"]
    clash = await client.post("/scim/v2/Users", headers=scim, json={"userName": "USER1"})
    assert scim_error(clash, 409)["scimType"] == "uniqueness"
    gone = await client.delete(f"/scim/v2/Users/{ids[4]}", headers=scim)
    assert gone.status_code == 204
    scim_error(await client.get(f"/scim/v2/Users/{ids[4]}", headers=scim), 404)
    scim_error(await client.put("/scim/v2/ResourceTypes", headers=scim), 405)


async def test_a_group_with_members_and_a_user_shows_its_groups(plane: Plane) -> None:
    _, client = plane
    scim = await scim_token(client)
    alice = (await client.post("/scim/v2/Users", headers=scim, json={"userName": "alice"})).json()
    group = await client.post(
        "/scim/v2/Groups", headers=scim, json={"displayName": "eng", "members": []}
    )
    assert group.status_code == 201, group.text
    gid = group.json()["id"]
    added = await client.patch(
        f"/scim/v2/Groups/{gid}",
        headers=scim,
        json={
            "schemas": [PATCH_OP],
            "Operations": [{"op": "Add", "path": "members", "value": [{"value": alice["id"]}]}],
        },
    )
    assert [m["value"] for m in added.json()["members"]] == [alice["id"]]
    shown = (await client.get(f"/scim/v2/Users/{alice['id']}", headers=scim)).json()
    assert shown["groups"][0]["value"] == gid and shown["groups"][0]["display"] == "eng"
    found = await client.get(
        "/scim/v2/Groups", headers=scim, params={"filter": 'displayName eq "ENG"'}
    )
    assert [g["id"] for g in found.json()["Resources"]] == [gid]
    nobody = await client.patch(
        f"/scim/v2/Groups/{gid}",
        headers=scim,
        json={
            "schemas": [PATCH_OP],
            "Operations": [{"op": "add", "path": "members", "value": [{"value": "nobody"}]}],
        },
    )
    assert "no user nobody" in scim_error(nobody, 400)["detail"]


async def test_a_standby_reads_and_sends_writes_to_the_leader(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp, client = plane
    scim = await scim_token(client)
    made = (await client.post("/scim/v2/Users", headers=scim, json={"userName": "ivy"})).json()
    monkeypatch.setattr(cp, "_standby", lambda: {"api_address": "10.0.0.1:8080"})
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cp.admin_app()), base_url="http://cp"
    ) as standby:
        assert (await standby.get(f"/scim/v2/Users/{made['id']}", headers=scim)).status_code == 200
        refused = await standby.post("/scim/v2/Users", headers=scim, json={"userName": "jo"})
        # Not a 409, which a provider reads as "the user exists".
        assert "10.0.0.1:8080" in scim_error(refused, 503)["detail"]
    assert cp.directory.by_login("jo") is None
