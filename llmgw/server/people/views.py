"""People, organisations and the rest as the admin API shows them (``wire.admin``)."""

from __future__ import annotations

from llmgw.server.people.directory import Directory
from llmgw.server.people.records import (
    Limits,
    Membership,
    Org,
    Person,
    PersonToken,
    Project,
    Team,
)
from llmgw.server.principal import Principal
from llmgw.wire.admin import (
    LimitsJson,
    MeJson,
    MembershipJson,
    OrgJson,
    PersonJson,
    PersonTokenJson,
    ProjectJson,
    TeamJson,
)


def limits_json(limits: Limits) -> LimitsJson:
    return {
        "rpm": limits.rpm,
        "tpm": limits.tpm,
        "budget": limits.budget,
        "models": list(limits.models),
        "tools": None if limits.tools is None else list(limits.tools),
        "guard": list(limits.guard),
    }


def person_json(p: Person) -> PersonJson:
    return {
        "id": p.id,
        "login": p.login,
        "name": p.name,
        "email": p.email,
        "role": p.role,
        "role_by_hand": p.role_by_hand,
        "source": p.source,
        "active": p.active,
        "created_at": p.created_at,
        "updated_at": p.updated_at,
    }


def membership_json(m: Membership, directory: Directory) -> MembershipJson:
    now = directory.now
    scope = now.orgs.get(m.scope_id) if m.kind == "org" else now.teams.get(m.scope_id)
    person = directory.person(m.person_id)
    return {
        "person_id": m.person_id,
        "login": person.login if person else None,
        "kind": m.kind,
        "scope_id": m.scope_id,
        "scope_name": scope.name if scope else None,
        "role": m.role,
        "by_hand": m.by_hand,
    }


def me_json(by: Principal, directory: Directory) -> MeJson:
    person = directory.person(by.person) if by.person else None
    memberships = directory.memberships_of(person.id) if person else []
    return {
        "name": by.name,
        "person": person_json(person) if person else None,
        "role": by.role,
        "via": by.via,
        "memberships": [membership_json(m, directory) for m in memberships],
    }


def org_json(o: Org) -> OrgJson:
    return {"id": o.id, "name": o.name, "limits": limits_json(o.limits), "created_at": o.created_at}


def team_json(t: Team) -> TeamJson:
    return {
        "id": t.id,
        "org_id": t.org_id,
        "name": t.name,
        "limits": limits_json(t.limits),
        "created_at": t.created_at,
    }


def project_json(p: Project, directory: Directory) -> ProjectJson:
    team = directory.now.teams.get(p.team_id)
    return {
        "id": p.id,
        "org_id": p.org_id,
        "team_id": p.team_id,
        "team": team.name if team else None,
        "name": p.name,
        "limits": limits_json(p.limits),
        "created_at": p.created_at,
    }


def token_json(t: PersonToken) -> PersonTokenJson:
    return {
        "id": t.id,
        "name": t.name,
        "created_at": t.created_at,
        "expires_at": t.expires_at,
        "revoked_at": t.revoked_at,
    }
