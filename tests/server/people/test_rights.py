"""``rights``: each rule of who may do what to an organisation, asked of principals
made by hand: cluster roles reach everywhere, a membership reaches its own
organisation or team and no other."""

from __future__ import annotations

from llmgw.server.people import rights
from llmgw.server.people.records import Project, Team
from llmgw.server.principal import OrgRole, Principal, Role

TEAM = Team("t1", "o1", "research")
OTHER_TEAM = Team("t2", "o1", "ops")
PROJECT = Project("p1", "o1", "t1", "chat")
ELSEWHERE = Project("p9", "o9", "t9", "chat")


def person(
    role: Role | None = None,
    orgs: dict[str, OrgRole] | None = None,
    teams: dict[str, OrgRole] | None = None,
) -> Principal:
    return Principal("someone", role, "token", "id1", orgs or {}, teams or {})


def test_cluster_roles_reach_every_organisation() -> None:
    viewer, operator, admin = person("viewer"), person("operator"), person("admin")
    for p in (viewer, operator, admin):
        assert rights.sees_org(p, "o9") and rights.reads_org(p, "o9")
        assert rights.reads_team(p, TEAM) and rights.sees_keys(p, ELSEWHERE)
    assert not rights.manages_keys(viewer, ELSEWHERE) and not rights.staff(viewer)
    assert rights.manages_keys(operator, ELSEWHERE) and rights.staff(operator)
    assert not rights.changes_org(operator, "o9") and not rights.changes_team(operator, TEAM)
    assert rights.changes_org(admin, "o9") and rights.changes_team(admin, TEAM)


def test_a_member_sees_their_organisation_and_reads_only_their_teams_keys() -> None:
    member = person(orgs={"o1": "member"}, teams={"t1": "member"})
    assert rights.sees_org(member, "o1") and not rights.sees_org(member, "o9")
    assert not rights.reads_org(member, "o1") and not rights.reads_team(member, TEAM)
    assert rights.sees_keys(member, PROJECT) and not rights.manages_keys(member, PROJECT)
    assert not rights.sees_keys(member, Project("p2", "o1", "t2", "other"))
    assert not rights.sees_keys(member, ELSEWHERE)
    assert not rights.changes_org(member, "o1") and not rights.staff(member)


def test_a_manager_reads_and_manages_keys_but_changes_nothing_of_the_organisation() -> None:
    manager = person(orgs={"o1": "manager"})
    assert rights.reads_org(manager, "o1") and rights.reads_team(manager, OTHER_TEAM)
    assert rights.manages_keys(manager, PROJECT)
    assert not rights.changes_org(manager, "o1") and not rights.changes_team(manager, TEAM)
    assert not rights.reads_org(manager, "o9") and not rights.manages_keys(manager, ELSEWHERE)
    team_manager = person(orgs={"o1": "member"}, teams={"t1": "manager"})
    assert rights.reads_team(team_manager, TEAM) and not rights.reads_team(team_manager, OTHER_TEAM)
    assert rights.manages_keys(team_manager, PROJECT)
    assert not rights.manages_keys(team_manager, Project("p2", "o1", "t2", "other"))


def test_an_organisation_admin_changes_it_but_not_another_nor_the_cluster() -> None:
    admin = person(orgs={"o1": "admin"})
    assert rights.changes_org(admin, "o1") and rights.changes_team(admin, TEAM)
    assert rights.manages_keys(admin, PROJECT)
    assert not rights.changes_org(admin, "o9") and not rights.sees_org(admin, "o9")
    assert not rights.staff(admin)
    team_admin = person(orgs={"o1": "member"}, teams={"t1": "admin"})
    assert rights.changes_team(team_admin, TEAM) and not rights.changes_team(team_admin, OTHER_TEAM)
    assert not rights.changes_org(team_admin, "o1")


def test_nobody_anonymous_has_any_right() -> None:
    nobody = Principal.anonymous("10.0.0.9")
    assert not nobody.known
    assert not rights.sees_org(nobody, "o1") and not rights.sees_keys(nobody, PROJECT)
    assert not rights.manages_keys(nobody, PROJECT) and not rights.staff(nobody)
