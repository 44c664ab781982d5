"""Limits of organisations, teams and projects reach the gateway's keys at once: set
through the admin API, or arriving in a standby's copy of the store, and a standby's
usage counted in its levels' budgets on the leader. Called on the real admin app, in
process, over the SQLite store."""

from __future__ import annotations

from dataclasses import replace

import httpx

from llmgw.server.app import ControlPlane
from llmgw.server.gateway import key_hash
from llmgw.server.gateway.limits import Key
from llmgw.server.people.records import Limits, Project
from llmgw.server.store import Audit


async def project_key(api: httpx.AsyncClient) -> str:
    """A key of project vision/demo of organisation acme."""
    for path, body in (
        ("/api/v1/orgs", {"name": "acme"}),
        ("/api/v1/orgs/acme/teams", {"name": "vision"}),
        ("/api/v1/orgs/acme/projects", {"name": "demo", "team": "vision"}),
    ):
        answer = await api.post(path, json=body)
        assert answer.status_code == 201, answer.text
    made = await api.post("/api/v1/keys", json={"name": "k", "org": "acme", "project": "demo"})
    assert made.status_code == 201, made.text
    return str(made.json()["key"])


def refusal(cp: ControlPlane, key: Key) -> str | None:
    answer = cp.gateway.keys.over_limit(key)
    if answer is None:
        return None
    assert isinstance(answer.body, bytes)
    return answer.body.decode()


async def test_limits_set_through_the_api_hold_at_once_and_name_the_level_as_it_is_now(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, api = plane
    key = cp.gateway.keys.keys[key_hash(await project_key(api))]
    assert key.chain == ()  # nothing limited yet
    cp.gateway.usage.add(key, "m", "r", 7, 5)
    assert refusal(cp, key) is None

    answer = await api.post("/api/v1/orgs/acme/projects/demo/limits", json={"tpm": 12})
    assert answer.status_code == 200, answer.text
    assert "over project vision/demo's limit of 12 tokens per minute" in (refusal(cp, key) or "")
    # The organisation's budget, and then its new name, reach the refusal too.
    await api.post("/api/v1/orgs/acme/projects/demo/limits", json={"clear": ["tpm"]})
    await api.post("/api/v1/orgs/acme/limits", json={"budget": 12})
    assert "over organisation acme's limit of 12 tokens a month" in (refusal(cp, key) or "")
    renamed = await api.post("/api/v1/orgs/acme", json={"name": "acme2"})
    assert renamed.status_code == 200, renamed.text
    assert "over organisation acme2's limit" in (refusal(cp, key) or "")


async def test_a_standbys_store_brings_limits_and_its_usage_counts_in_the_levels(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, api = plane
    key = cp.gateway.keys.keys[key_hash(await project_key(api))]
    (project,) = [p for p in await cp.store.directory.all(Project) if p.name == "demo"]
    # The leader's write, as a standby's copy of the store receives it: no API call here.
    limited = replace(project, limits=Limits(budget=100))
    await cp.store.directory.put(limited, Audit("admin", "project.limits", "demo"))
    assert key.chain == ()
    await cp.reload({"projects"})
    assert [level.label for level in key.chain] == ["project vision/demo"]
    # On the leader, a standby's usage of the key counts in its project's budget.
    await cp.gateway.take_usage([("2027-01-01", key.record.id, "m", "r", 1, 60, 40)])
    assert "over project vision/demo's limit of 100 tokens a month" in (refusal(cp, key) or "")
