"""Who may do what to an organisation and what it holds: each rule once, asked by the
services (never by an edge).

Cluster roles reach everywhere: a ``viewer`` reads every organisation, an ``operator``
also manages every project's keys and sets limits, an ``admin`` also makes and renames
organisations and changes anyone's memberships. Within an organisation:

- a ``member`` (of the organisation, or of one of its teams) sees its teams and
  projects, the keys of their teams' projects and their own, and makes keys of their own;
- a ``manager`` of the organisation also sees all its keys, usage, members and audit,
  and makes and revokes its projects' keys (and revokes its people's own); a team's
  manager does so for the team's projects;
- an ``admin`` of the organisation also changes its teams, projects and memberships; a
  team's admin its projects and members. Nobody takes their own admin role away.

The organisation's name, its limits and the cluster itself stay with the cluster's staff.
"""

from __future__ import annotations

from llmgw.server.people.records import Project, Team
from llmgw.server.principal import Principal, reaches


def sees_org(p: Principal, org_id: str) -> bool:
    """Its teams and projects, by name."""
    return p.may("viewer") or org_id in p.orgs


def reads_org(p: Principal, org_id: str) -> bool:
    """All of it: every key, usage, member and audit entry."""
    return p.may("viewer") or reaches(p.orgs.get(org_id), "manager")


def changes_org(p: Principal, org_id: str) -> bool:
    """Its teams, projects and memberships."""
    return p.may("admin") or reaches(p.orgs.get(org_id), "admin")


def reads_team(p: Principal, team: Team) -> bool:
    return reads_org(p, team.org_id) or reaches(p.teams.get(team.id), "manager")


def changes_team(p: Principal, team: Team) -> bool:
    """Its projects and members."""
    return changes_org(p, team.org_id) or reaches(p.teams.get(team.id), "admin")


def manages_keys(p: Principal, project: Project) -> bool:
    """Makes and revokes the project's keys, and reads its usage."""
    return (
        p.may("operator")
        or reaches(p.orgs.get(project.org_id), "manager")
        or reaches(p.teams.get(project.team_id), "manager")
    )


def manages_own_keys(p: Principal, org_id: str) -> bool:
    """Revokes the keys the organisation's people made for themselves (their person
    does too)."""
    return p.may("operator") or reaches(p.orgs.get(org_id), "manager")


def sees_keys(p: Principal, project: Project) -> bool:
    """The project's keys (never the keys themselves) and their usage."""
    return p.may("viewer") or manages_keys(p, project) or project.team_id in p.teams


def staff(p: Principal) -> bool:
    """Limits and what else stays with the cluster's staff."""
    return p.may("operator")


def manages_people(p: Principal) -> bool:
    """Makes people, sets their cluster role, deactivates them."""
    return p.may("admin")


def makes_orgs(p: Principal) -> bool:
    """Makes, renames and removes organisations."""
    return p.may("admin")


def sees_tokens(p: Principal, person_id: str) -> bool:
    """A person's personal tokens (never the tokens themselves); revokes them."""
    return p.person == person_id or p.may("admin")


def makes_token(p: Principal, person_id: str) -> bool:
    """A personal token acting as the person: theirs alone to make."""
    return p.person is not None and p.person == person_id


def makes_personal_key(p: Principal, org_id: str) -> bool:
    """A gateway key of the caller's own in an organisation."""
    return p.person is not None and (org_id in p.orgs or p.may("operator"))
