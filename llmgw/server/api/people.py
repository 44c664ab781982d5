"""People, personal tokens, organisations, teams, projects, memberships and limits, as
admin API routes over ``PeopleService`` and ``OrgService`` (``server/people/``), which
check every right. The routes are open to anyone signed in (``member``): what each
caller may see or change is the services' to say, and an organisation's id a caller
may not see is a 404 like one that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.server.access import Access
from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.gateway.grants import limits_set_json
from llmgw.server.gateway.keyservice import KeyService
from llmgw.server.people.asks import (
    ChangePerson,
    Member,
    NewOrg,
    NewPerson,
    NewProject,
    NewTeam,
    NewToken,
    Rename,
    SetLimits,
)
from llmgw.server.people.orgs import OrgService
from llmgw.server.people.service import PeopleService
from llmgw.server.people.views import (
    me_json,
    membership_json,
    org_json,
    person_json,
    project_json,
    team_json,
    token_json,
)
from llmgw.server.schema import spec
from llmgw.wire.admin import (
    LimitsSetJson,
    MeJson,
    MembershipJson,
    NewPersonTokenJson,
    OrgJson,
    PersonJson,
    PersonTokenJson,
    ProjectJson,
    TeamJson,
)

OBJ = {"type": "object"}
LIST = {"type": "array", "items": {"type": "object"}}


@dataclass(frozen=True)
class MemberQuery:
    team: str | None = spec(None, doc="the team (id or name) the membership is of", max_length=128)


def routes(people: PeopleService, orgs: OrgService, keys: KeyService) -> Ops:
    directory = people.directory

    async def me(call: Call[None, None]) -> MeJson:
        return me_json(call.principal, directory)

    async def list_people(call: Call[None, None]) -> list[PersonJson]:
        return [person_json(p) for p in people.listing(call.principal)]

    async def create_person(call: Call[NewPerson, None]) -> PersonJson:
        return person_json(await people.create(call.body, call.principal))

    async def show_person(call: Call[None, None]) -> PersonJson:
        return person_json(people.show(call.params["person"], call.principal))

    async def change_person(call: Call[ChangePerson, None]) -> PersonJson:
        changed = await people.change(call.params["person"], call.body, call.principal)
        return person_json(changed)

    async def list_tokens(call: Call[None, None]) -> list[PersonTokenJson]:
        return [token_json(t) for t in people.tokens(call.params["person"], call.principal)]

    async def new_token(call: Call[NewToken, None]) -> NewPersonTokenJson:
        record, token = await people.new_token(call.params["person"], call.body, call.principal)
        return {**token_json(record), "token": token}

    async def revoke_token(call: Call[None, None]) -> PersonTokenJson:
        p = call.params
        return token_json(await people.revoke_token(p["person"], p["token_id"], call.principal))

    async def list_orgs(call: Call[None, None]) -> list[OrgJson]:
        return [org_json(o) for o in orgs.listing(call.principal)]

    async def create_org(call: Call[NewOrg, None]) -> OrgJson:
        return org_json(await orgs.create_org(call.body, call.principal))

    async def show_org(call: Call[None, None]) -> OrgJson:
        return org_json(orgs.org(call.params["org"], call.principal))

    async def rename_org(call: Call[Rename, None]) -> OrgJson:
        return org_json(await orgs.rename_org(call.params["org"], call.body, call.principal))

    async def remove_org(call: Call[None, None]) -> OrgJson:
        removed = await orgs.remove_org(call.params["org"], call.principal, keys.keys_in)
        return org_json(removed)

    async def list_teams(call: Call[None, None]) -> list[TeamJson]:
        org = orgs.org(call.params["org"], call.principal)
        return [team_json(t) for t in directory.teams_of(org.id)]

    async def create_team(call: Call[NewTeam, None]) -> TeamJson:
        return team_json(await orgs.create_team(call.params["org"], call.body, call.principal))

    async def remove_team(call: Call[None, None]) -> TeamJson:
        p = call.params
        return team_json(await orgs.remove_team(p["org"], p["team"], call.principal))

    async def list_projects(call: Call[None, None]) -> list[ProjectJson]:
        org = orgs.org(call.params["org"], call.principal)
        return [project_json(p, directory) for p in directory.projects_of(org.id)]

    async def create_project(call: Call[NewProject, None]) -> ProjectJson:
        made = await orgs.create_project(call.params["org"], call.body, call.principal)
        return project_json(made, directory)

    async def remove_project(call: Call[None, None]) -> ProjectJson:
        p = call.params
        gone = await orgs.remove_project(p["org"], p["project"], call.principal, keys.keys_in)
        return project_json(gone, directory)

    async def list_members(call: Call[None, None]) -> list[MembershipJson]:
        found = orgs.members(call.params["org"], call.principal)
        return [membership_json(m, directory) for m in found]

    async def set_member(call: Call[Member, None]) -> MembershipJson:
        member = await orgs.set_member(call.params["org"], call.body, call.principal)
        return membership_json(member, directory)

    async def remove_member(call: Call[None, MemberQuery]) -> MembershipJson:
        p = call.params
        gone = await orgs.remove_member(p["org"], p["person"], call.query.team, call.principal)
        return membership_json(gone, directory)

    async def org_limits(call: Call[SetLimits, None]) -> LimitsSetJson:
        set_ = await orgs.set_limits("org", call.params["org"], None, call.body, call.principal)
        return limits_set_json(set_, directory.now)

    async def team_limits(call: Call[SetLimits, None]) -> LimitsSetJson:
        p = call.params
        set_ = await orgs.set_limits("team", p["org"], p["team"], call.body, call.principal)
        return limits_set_json(set_, directory.now)

    async def project_limits(call: Call[SetLimits, None]) -> LimitsSetJson:
        p = call.params
        set_ = await orgs.set_limits("project", p["org"], p["project"], call.body, call.principal)
        return limits_set_json(set_, directory.now)

    org = "/api/v1/orgs/{org}"
    member: Access = "member"
    return [
        Op("GET", "/api/v1/me", me, "Who the caller is, and where they belong", access=member),
        Op("GET", "/api/v1/people", list_people, "People", answer=LIST, access=member),
        Op(
            "POST",
            "/api/v1/people",
            create_person,
            "Make an account for a person",
            body=NewPerson,
            status=201,
            errors=(403, 409),
            access=member,
        ),
        Op(
            "GET",
            "/api/v1/people/{person}",
            show_person,
            "One person",
            errors=(404,),
            access=member,
        ),
        Op(
            "POST",
            "/api/v1/people/{person}",
            change_person,
            "Change a person: name, e-mail, cluster role, active",
            body=ChangePerson,
            errors=(403, 404),
            access=member,
        ),
        Op(
            "GET",
            "/api/v1/people/{person}/tokens",
            list_tokens,
            "A person's personal tokens (never the tokens)",
            answer=LIST,
            errors=(403, 404),
            access=member,
        ),
        Op(
            "POST",
            "/api/v1/people/{person}/tokens",
            new_token,
            "Make a personal token (shown once), for yourself",
            body=NewToken,
            status=201,
            errors=(403, 404),
            access=member,
        ),
        Op(
            "DELETE",
            "/api/v1/people/{person}/tokens/{token_id}",
            revoke_token,
            "Revoke a personal token at once",
            errors=(403, 404),
            access=member,
        ),
        Op("GET", "/api/v1/orgs", list_orgs, "Organisations", answer=LIST, access=member),
        Op(
            "POST",
            "/api/v1/orgs",
            create_org,
            "Make an organisation",
            body=NewOrg,
            status=201,
            errors=(403, 409),
            access=member,
        ),
        Op("GET", org, show_org, "One organisation", errors=(404,), access=member),
        Op(
            "POST",
            org,
            rename_org,
            "Rename an organisation",
            body=Rename,
            errors=(403, 404, 409),
            access=member,
        ),
        Op(
            "DELETE",
            org,
            remove_org,
            "Remove an organisation without teams or keys",
            errors=(403, 404, 409),
            access=member,
        ),
        Op(
            "GET",
            org + "/teams",
            list_teams,
            "Its teams",
            answer=LIST,
            errors=(404,),
            access=member,
        ),
        Op(
            "POST",
            org + "/teams",
            create_team,
            "Make a team",
            body=NewTeam,
            status=201,
            errors=(403, 404, 409),
            access=member,
        ),
        Op(
            "DELETE",
            org + "/teams/{team}",
            remove_team,
            "Remove a team without projects",
            errors=(403, 404, 409),
            access=member,
        ),
        Op(
            "GET",
            org + "/projects",
            list_projects,
            "Its projects",
            answer=LIST,
            errors=(404,),
            access=member,
        ),
        Op(
            "POST",
            org + "/projects",
            create_project,
            "Make a project in a team",
            body=NewProject,
            status=201,
            errors=(403, 404, 409),
            access=member,
        ),
        Op(
            "DELETE",
            org + "/projects/{project}",
            remove_project,
            "Remove a project without active keys",
            errors=(403, 404, 409),
            access=member,
        ),
        Op(
            "GET",
            org + "/members",
            list_members,
            "Its members and its teams'",
            answer=LIST,
            errors=(404,),
            access=member,
        ),
        Op(
            "POST",
            org + "/members",
            set_member,
            "Make a person a member, manager or admin of it or of one of its teams",
            body=Member,
            errors=(403, 404),
            access=member,
        ),
        Op(
            "DELETE",
            org + "/members/{person}",
            remove_member,
            "End a person's membership of it (or, with team, of one of its teams)",
            query=MemberQuery,
            errors=(403, 404),
            access=member,
        ),
        Op(
            "POST",
            org + "/limits",
            org_limits,
            "Its limits (the cluster's staff)",
            body=SetLimits,
            errors=(403, 404),
            access=member,
        ),
        Op(
            "POST",
            org + "/teams/{team}/limits",
            team_limits,
            "A team's limits (the cluster's staff)",
            body=SetLimits,
            errors=(403, 404),
            access=member,
        ),
        Op(
            "POST",
            org + "/projects/{project}/limits",
            project_limits,
            "A project's limits (the cluster's staff)",
            body=SetLimits,
            errors=(403, 404),
            access=member,
        ),
    ]
