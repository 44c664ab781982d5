"""``/api/v1/keys``: a key's priority, set when it is made and changed after, shown in
its JSON and carried by the gateway's own copy of the key. Called on the real admin
app, in process, over the SQLite store."""

from __future__ import annotations

import httpx

from llmgw.server.app import ControlPlane
from llmgw.server.gateway import key_hash


async def test_a_keys_priority_is_set_shown_changed_and_kept(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, api = plane
    made = (await api.post("/api/v1/keys", json={"name": "batch", "priority": -3})).json()
    plain = (await api.post("/api/v1/keys", json={"name": "web"})).json()
    assert (made["priority"], plain["priority"]) == (-3, 0)
    listed = {k["name"]: k["priority"] for k in (await api.get("/api/v1/keys")).json()}
    assert listed == {"batch": -3, "web": 0}

    answer = await api.post(f"/api/v1/keys/{plain['id']}", json={"priority": 10})
    assert answer.status_code == 200, answer.text
    assert answer.json()["priority"] == 10
    assert (await api.get(f"/api/v1/keys/{plain['id']}")).json()["priority"] == 10
    # The gateway's queue reads it from its own copy of the key, at once.
    assert cp.gateway.keys.keys[key_hash(plain["key"])].record.priority == 10
    # And the store has it for the next start.
    stored = {k.id: k.priority for k in await cp.store.list_api_keys()}
    assert stored == {made["id"]: -3, plain["id"]: 10}


async def test_a_bad_priority_or_an_unknown_key_is_refused(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    _, api = plane
    made = (await api.post("/api/v1/keys", json={"name": "k"})).json()
    too_high = await api.post(f"/api/v1/keys/{made['id']}", json={"priority": 10**6})
    assert too_high.status_code == 400 and too_high.json()["error"]["field"] == "priority"
    assert (
        await api.post("/api/v1/keys", json={"name": "x", "priority": "high"})
    ).status_code == 400
    missing = await api.post("/api/v1/keys/nope", json={"priority": 1})
    assert missing.status_code == 404
