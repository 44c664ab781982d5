"""Keys of projects and people (``KeyService`` over the directory): an organisation's
admin and managers make and revoke its projects' keys; a member makes keys of their own
and sees their team's; nobody but the cluster's staff reads another organisation's
keys or usage, and a key, project or organisation of another's is not found."""

from __future__ import annotations

import datetime as dt

import pytest

from llmgw.server.people.asks import SetKeyLimits
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import CreateKey, UpdateKey, UsageQuery
from llmgw.server.store import ApiKeyRecord
from tests.server.people.conftest import NOW, World

OPERATOR = Principal("op", "operator", "token")
VIEWER = Principal("v", "viewer", "token")
TODAY = dt.datetime.fromtimestamp(NOW, dt.UTC).date().isoformat()


async def key(world: World, by: Principal, **ask: object) -> ApiKeyRecord:
    record, _ = await world.keys.create(CreateKey(name="k", **ask), by)  # type: ignore[arg-type]
    return record


async def test_an_org_admin_and_manager_make_and_revoke_their_projects_keys(
    world: World,
) -> None:
    a = world.a
    for person in (a.admin, a.manager):
        who = world.who(person)
        made = await key(world, who, org=a.org.name, project="research/chat")
        assert (made.org_id, made.project_id, made.person_id) == (a.org.id, a.project.id, None)
        assert world.keys.find(made.id, who) == made
        revoked = await world.keys.revoke(made.id, who)
        assert revoked.revoked_at is not None
    # A priority is the cluster's operators' to change.
    made = await key(world, world.who(a.admin), org=a.org.id, project=a.project.id)
    with pytest.raises(Refusal) as refused:
        await world.keys.update(made.id, UpdateKey(priority=5), world.who(a.admin))
    assert refused.value.status == 403
    assert (await world.keys.update(made.id, UpdateKey(priority=5), OPERATOR)).priority == 5


async def test_a_member_makes_their_own_key_and_sees_their_teams_keys(world: World) -> None:
    a = world.a
    member = world.who(a.member)
    with pytest.raises(Refusal) as refused:
        await key(world, member, org=a.org.id, project=a.project.id)
    assert refused.value.status == 403
    own = await key(world, member, personal=True)
    assert (own.org_id, own.project_id, own.person_id) == (a.org.id, None, a.member.id)
    teams = await key(world, world.who(a.manager), org=a.org.id, project=a.project.id)
    assert {r.id for r in world.keys.records(member)} == {own.id, teams.id}
    with pytest.raises(Refusal):
        await world.keys.revoke(teams.id, member)
    assert (await world.keys.revoke(own.id, member)).revoked_at is not None
    # The organisation's manager sees and revokes a member's own key; a viewer only sees.
    mine = await key(world, member, personal=True)
    assert world.keys.find(mine.id, VIEWER) == mine
    with pytest.raises(Refusal):
        await world.keys.revoke(mine.id, VIEWER)
    assert (await world.keys.revoke(mine.id, world.who(a.manager))).revoked_at is not None


async def test_a_manager_who_is_also_a_cluster_viewer_manages_their_orgs_keys(
    world: World,
) -> None:
    a = world.a
    member_key = await key(world, world.who(a.member), personal=True)
    viewer_manager = Principal(
        a.manager.login, "viewer", "token", a.manager.id, {a.org.id: "manager"}
    )
    revoked = await world.keys.revoke(member_key.id, viewer_manager)
    assert revoked.revoked_at is not None


async def test_nobody_reads_another_organisations_keys_or_usage(world: World) -> None:
    a, b = world.a, world.b
    theirs = await key(world, world.who(b.admin), org=b.org.id, project=b.project.id)
    personal = await key(world, world.who(b.member), personal=True)
    ours = await key(world, world.who(a.admin), org=a.org.id, project=a.project.id)
    await world.store.add_usage(
        [
            (TODAY, theirs.id, "qwen", "r1", 3, 30, 70),
            (TODAY, personal.id, "qwen", "r1", 1, 1, 1),
            (TODAY, ours.id, "qwen", "r1", 2, 20, 10),
        ]
    )
    for person in (a.admin, a.manager, a.member):
        who = world.who(person)
        assert {r.id for r in world.keys.records(who)} <= {ours.id}
        for other in (theirs, personal):
            for attempt in (world.keys.find, world.keys.revoke):
                with pytest.raises(Refusal) as hidden:
                    result = attempt(other.id, who)
                    if not isinstance(result, ApiKeyRecord):
                        await result
                assert hidden.value.status == 404
        rows = await world.keys.usage(UsageQuery(), who)
        assert {r["key_id"] for r in rows} <= {ours.id}
        for by in ("org", "team", "project", "key", "person"):
            summed = await world.keys.usage(UsageQuery(by=by), who)  # type: ignore[arg-type]
            assert b.org.id not in {r["id"] for r in summed} and theirs.id not in str(summed)
        with pytest.raises(Refusal) as hidden:
            await world.keys.usage(UsageQuery(org=b.org.name), who)
        assert hidden.value.status == 404
    manager_rows = await world.keys.usage(UsageQuery(by="org"), world.who(a.manager))
    assert [(r["id"], r["requests"]) for r in manager_rows] == [(a.org.id, 2)]
    everything = await world.keys.usage(UsageQuery(by="org"), VIEWER)
    assert {r["id"]: r["requests"] for r in everything} == {a.org.id: 2, b.org.id: 4}


async def test_another_organisations_project_or_org_is_not_found_for_a_new_key(
    world: World,
) -> None:
    a, b = world.a, world.b
    admin = world.who(a.admin)
    for ask in (
        {"project": b.project.id},
        {"org": b.org.id, "project": b.project.id},
        {"org": a.org.id, "project": b.project.id},
        {"org": b.org.name},
        {"org": b.org.id, "personal": True},
    ):
        with pytest.raises(Refusal) as hidden:
            await key(world, admin, **ask)
        assert hidden.value.status == 404, ask
    assert world.keys.keys_in(b.project.id) == 0


async def test_a_keys_tools_are_set_by_who_manages_it_and_hidden_from_others(
    world: World,
) -> None:
    a, b = world.a, world.b
    made = await key(world, world.who(a.manager), org=a.org.id, project=a.project.id)
    ask = SetKeyLimits(tools=("jira.*",))
    # Its team's member sees it but does not manage it.
    with pytest.raises(Refusal) as refused:
        await world.keys.set_limits(made.id, ask, world.who(a.member))
    assert refused.value.status == 403
    # Another organisation's admin: as if there were no such key.
    with pytest.raises(Refusal) as hidden:
        await world.keys.set_limits(made.id, ask, world.who(b.admin))
    assert (hidden.value.status, hidden.value.code) == (404, "unknown_key")
    assert world.keys.find(made.id, OPERATOR).tools is None
    set_ = await world.keys.set_limits(made.id, ask, world.who(a.manager))
    assert set_.limits.tools == ("jira.*",)
    assert world.keys.find(made.id, OPERATOR).tools == ("jira.*",)
    (stored,) = [r for r in await world.store.list_api_keys() if r.id == made.id]
    assert stored.tools == ("jira.*",)
