"""The admin API's calls about people: their accounts and tokens, organisations with
their teams, projects, members and limits, the audit log, and signing in from a device
(``llmgw login``)."""

from __future__ import annotations

from llmgw.client import routes as r
from llmgw.client.adminbase import AdminBase
from llmgw.client.routes import Body, Query
from llmgw.wire.admin import (
    AuditEntryJson,
    DeviceCodeJson,
    DeviceTokenJson,
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


class PeopleCalls(AdminBase):
    # --- people, their tokens, organisations and the audit log

    def me(self) -> MeJson:
        return self.call(r.ME)

    def people(self) -> list[PersonJson]:
        return self.call(r.PEOPLE)

    def person(self, ref: str) -> PersonJson:
        return self.call(r.PERSON, ref)

    def create_person(self, body: Body) -> PersonJson:
        return self.call(r.CREATE_PERSON, body=body)

    def change_person(self, ref: str, body: Body) -> PersonJson:
        return self.call(r.CHANGE_PERSON, ref, body=body)

    def person_tokens(self, ref: str) -> list[PersonTokenJson]:
        return self.call(r.PERSON_TOKENS, ref)

    def create_person_token(self, ref: str, body: Body) -> NewPersonTokenJson:
        return self.call(r.CREATE_PERSON_TOKEN, ref, body=body)

    def revoke_person_token(self, ref: str, token_id: str) -> PersonTokenJson:
        return self.call(r.REVOKE_PERSON_TOKEN, ref, token_id)

    def orgs(self) -> list[OrgJson]:
        return self.call(r.ORGS)

    def org(self, ref: str) -> OrgJson:
        return self.call(r.ORG, ref)

    def create_org(self, name: str) -> OrgJson:
        return self.call(r.CREATE_ORG, body={"name": name})

    def rename_org(self, ref: str, name: str) -> OrgJson:
        return self.call(r.RENAME_ORG, ref, body={"name": name})

    def remove_org(self, ref: str) -> OrgJson:
        return self.call(r.REMOVE_ORG, ref)

    def org_teams(self, org: str) -> list[TeamJson]:
        return self.call(r.TEAMS, org)

    def create_team(self, org: str, name: str) -> TeamJson:
        return self.call(r.CREATE_TEAM, org, body={"name": name})

    def remove_team(self, org: str, team: str) -> TeamJson:
        return self.call(r.REMOVE_TEAM, org, team)

    def org_projects(self, org: str) -> list[ProjectJson]:
        return self.call(r.PROJECTS, org)

    def create_project(self, org: str, team: str, name: str) -> ProjectJson:
        return self.call(r.CREATE_PROJECT, org, body={"name": name, "team": team})

    def remove_project(self, org: str, project: str) -> ProjectJson:
        return self.call(r.REMOVE_PROJECT, org, project)

    def org_members(self, org: str) -> list[MembershipJson]:
        return self.call(r.MEMBERS, org)

    def set_member(self, org: str, body: Body) -> MembershipJson:
        return self.call(r.SET_MEMBER, org, body=body)

    def remove_member(self, org: str, person: str, team: str | None = None) -> MembershipJson:
        return self.call(r.REMOVE_MEMBER, org, person, query={"team": team} if team else None)

    def set_limits(
        self, body: Body, org: str, team: str | None = None, project: str | None = None
    ) -> LimitsSetJson:
        """An organisation's limits, or with ``team`` or ``project`` one of its own."""
        if team is not None:
            return self.call(r.TEAM_LIMITS, org, team, body=body)
        if project is not None:
            return self.call(r.PROJECT_LIMITS, org, project, body=body)
        return self.call(r.ORG_LIMITS, org, body=body)

    def audit(self, query: Query) -> list[AuditEntryJson]:
        return self.call(r.AUDIT, query=query)

    def device_login(self, client: str) -> DeviceCodeJson:
        """Start ``llmgw login``: a code for its person to approve (needs no token)."""
        return self.call(r.DEVICE_LOGIN, body={"client": client})

    def device_token(self, device_code: str) -> DeviceTokenJson:
        """The approved code's personal token, once; else an ``AdminError`` whose
        ``kind`` is ``authorization_pending`` while its person has not answered."""
        return self.call(r.DEVICE_TOKEN, body={"device_code": device_code})
