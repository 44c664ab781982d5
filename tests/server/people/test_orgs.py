"""``OrgService``: an organisation's admin manages its teams, projects and members and
cannot take their own admin role away; its name, its limits and the organisation itself
stay with the cluster's staff; a member reads its members only as far as their own
teams, and another organisation's ids are not found."""

from __future__ import annotations

import pytest

from llmgw.server.people.asks import Member, NewOrg, NewProject, NewTeam, Rename, SetLimits
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from tests.server.people.conftest import ROOT, World

OPERATOR = Principal("op", "operator", "token")


async def test_an_org_admin_manages_teams_projects_and_members(world: World) -> None:
    a, orgs = world.a, world.orgs
    admin = world.who(a.admin)
    team = await orgs.create_team(a.org.name, NewTeam(name="ops"), admin)
    project = await orgs.create_project(a.org.id, NewProject(name="bots", team="ops"), admin)
    assert (team.org_id, project.team_id) == (a.org.id, team.id)
    assert orgs.project(a.org, "ops/bots") == project
    member = await orgs.set_member(a.org.id, Member(a.member.id, "manager", "ops"), admin)
    assert (member.kind, member.scope_id, member.role, member.by_hand) == (
        "team",
        team.id,
        "manager",
        True,
    )
    assert world.who(a.member).teams[team.id] == "manager"
    await orgs.remove_member(a.org.id, a.member.login, "ops", admin)
    with pytest.raises(Refusal) as busy:
        await orgs.remove_team(a.org.id, "ops", admin)
    assert busy.value.status == 409
    await orgs.remove_project(a.org.id, project.id, admin, lambda scope: 0)
    await orgs.remove_team(a.org.id, team.id, admin)
    assert [t.name for t in world.directory.teams_of(a.org.id)] == ["research"]
    # Another organisation's admin may do none of it here: it is not found for them.
    with pytest.raises(Refusal) as hidden:
        await orgs.create_team(a.org.id, NewTeam(name="x"), world.who(world.b.admin))
    assert hidden.value.status == 404


async def test_a_manager_or_member_changes_nothing_of_the_organisation(world: World) -> None:
    a, orgs = world.a, world.orgs
    for person in (a.manager, a.member):
        who = world.who(person)
        with pytest.raises(Refusal) as refused:
            await orgs.create_team(a.org.id, NewTeam(name="x"), who)
        assert refused.value.status == 403
        with pytest.raises(Refusal) as refused:
            await orgs.set_member(a.org.id, Member(person.id, "admin"), who)
        assert refused.value.status == 403
    # A team's admin makes projects and members of that team only.
    await orgs.set_member(a.org.id, Member(a.member.id, "admin", a.team.id), ROOT)
    team_admin = world.who(a.member)
    made = await orgs.create_project(a.org.id, NewProject("docs", a.team.id), team_admin)
    assert made.team_id == a.team.id
    with pytest.raises(Refusal):
        await orgs.set_member(a.org.id, Member(a.manager.id, "admin"), team_admin)


async def test_an_org_admin_cannot_take_their_own_admin_role_away(world: World) -> None:
    a, orgs = world.a, world.orgs
    admin = world.who(a.admin)
    for role in ("manager", "member"):
        with pytest.raises(Refusal) as refused:
            await orgs.set_member(a.org.id, Member(a.admin.id, role), admin)  # type: ignore[arg-type]
        assert refused.value.status == 403 and "own admin role" in refused.value.message
    with pytest.raises(Refusal) as refused:
        await orgs.remove_member(a.org.id, a.admin.login, None, admin)
    assert refused.value.status == 403
    assert world.who(a.admin).orgs[a.org.id] == "admin"
    # Another admin of the organisation can.
    second = await world.person("acme-second")
    await world.join(second, a.org, "admin")
    await orgs.set_member(a.org.id, Member(a.admin.id, "member"), world.who(second))
    assert world.who(a.admin).orgs[a.org.id] == "member"


async def test_the_name_limits_and_the_org_itself_stay_with_the_cluster_staff(
    world: World,
) -> None:
    a, orgs = world.a, world.orgs
    admin = world.who(a.admin)
    with pytest.raises(Refusal) as refused:
        await orgs.rename_org(a.org.id, Rename(name="evil"), admin)
    assert refused.value.status == 403
    for level, ref in (("org", None), ("team", a.team.id), ("project", a.project.id)):
        with pytest.raises(Refusal) as refused:
            await orgs.set_limits(level, a.org.id, ref, SetLimits(tpm=10**9), admin)
        assert refused.value.status == 403, level
    with pytest.raises(Refusal) as refused:
        await orgs.create_org(NewOrg(name="mine"), admin)
    assert refused.value.status == 403
    with pytest.raises(Refusal) as refused:
        await orgs.remove_org(a.org.id, admin, lambda scope: 0)
    assert refused.value.status == 403
    assert world.directory.now.orgs[a.org.id] == a.org
    # An operator sets limits (and clears them); an admin renames.
    limits = (
        await orgs.set_limits("project", a.org.id, "research/chat", SetLimits(tpm=500), OPERATOR)
    ).limits
    assert limits.tpm == 500 and world.directory.now.projects[a.project.id].limits.tpm == 500
    cleared = (
        await orgs.set_limits(
            "project", a.org.id, a.project.id, SetLimits(clear=("tpm",)), OPERATOR
        )
    ).limits
    assert cleared.tpm is None
    with pytest.raises(Refusal) as bad:
        await orgs.set_limits("org", a.org.id, None, SetLimits(clear=("nope",)), OPERATOR)
    assert bad.value.status == 400 and bad.value.field == "clear"
    renamed = await orgs.rename_org(a.org.id, Rename(name="Acme Corp"), ROOT)
    assert orgs.org("acme corp", ROOT) == renamed


async def test_a_member_reads_only_their_own_teams_members(world: World) -> None:
    a, b, orgs = world.a, world.b, world.orgs
    member = world.who(a.member)
    seen = {(m.person_id, m.kind) for m in orgs.members(a.org.id, member)}
    assert seen == {(a.member.id, "team")}
    manager = world.who(a.manager)
    everyone = {m.person_id for m in orgs.members(a.org.id, manager)}
    assert everyone == {a.admin.id, a.manager.id, a.member.id}
    # Another organisation's members: not found, for its member, manager and admin.
    for person in (a.member, a.manager, a.admin):
        with pytest.raises(Refusal) as hidden:
            orgs.members(b.org.id, world.who(person))
        assert hidden.value.status == 404
        assert [o.id for o in orgs.listing(world.who(person))] == [a.org.id]


async def test_another_organisations_team_project_or_member_is_not_found(world: World) -> None:
    a, b, orgs = world.a, world.b, world.orgs
    admin = world.who(a.admin)
    attempts = [
        orgs.create_project(a.org.id, NewProject("x", b.team.id), admin),
        orgs.remove_team(a.org.id, b.team.id, admin),
        orgs.remove_project(a.org.id, b.project.id, admin, lambda scope: 0),
        orgs.set_member(a.org.id, Member(a.member.id, "member", b.team.id), admin),
        orgs.remove_member(a.org.id, b.member.id, None, admin),
        orgs.remove_member(a.org.id, b.member.id, b.team.id, admin),
        orgs.set_limits("team", a.org.id, b.team.id, SetLimits(rpm=1), OPERATOR),
        orgs.set_limits("project", a.org.id, b.project.id, SetLimits(rpm=1), OPERATOR),
    ]
    for attempt in attempts:
        with pytest.raises(Refusal) as hidden:
            await attempt
        assert hidden.value.status == 404
    assert world.directory.now.teams[b.team.id] == b.team
    assert world.directory.now.projects[b.project.id] == b.project
    assert world.who(b.member).teams == {b.team.id: "member"}
