"""Organisations, their teams and projects, memberships and limits, as a service.

Every request names its organisation first, and every other id it names (a team, a
project, a person's membership) is checked to belong to that organisation: an id of
another organisation's is answered as not found, whatever the caller's role there. The
rules of who may do what are ``rights.py``'s. Names are unique among their siblings
(organisations in the cluster, teams in their organisation, projects in their team),
so each may be named by id or by name; a project also as ``team/project``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

from llmgw.server.gateway.grants import (
    LimitsSet,
    asked,
    level_of,
    limits_detail,
    limits_of,
    policy_names,
    revocations,
    without,
)
from llmgw.server.gateway.limits import KeyBook
from llmgw.server.people import rights
from llmgw.server.people.asks import Member, NewOrg, NewProject, NewTeam, Rename, SetLimits
from llmgw.server.people.directory import Directory
from llmgw.server.people.records import (
    DEFAULT_ORG,
    Membership,
    Org,
    Project,
    ScopeKind,
    Team,
)
from llmgw.server.people.service import refuse
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.store import ApiKeyRecord, Audit
from llmgw.server.store.base import Limited

NO_SUCH_ORG = "no such organisation; see `llmgw ctl orgs list`"


def _same(a: str, b: str) -> bool:
    return a.strip().casefold() == b.strip().casefold()


class OrgService:
    def __init__(
        self,
        directory: Directory,
        changed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        keys: KeyBook | None = None,
        policies: Callable[[], Awaitable[frozenset[str]]] | None = None,
    ) -> None:
        """``changed`` is told when limits or names may have changed (the gateway takes
        them: its keys' levels and how a refusal names them). ``keys``: the gateway's
        keys, whose tools a revoke at a level takes too; ``policies``: the names of the
        guard policies that exist (the store's ``"guard"`` document by default)."""
        self.directory = directory
        self.store = directory.store
        self.changed = changed
        self.clock = clock
        self.keys = keys
        self.policies = policies or (lambda: policy_names(self.store))

    # ---------------------------------------------------------------- finding

    def org(self, ref: str, by: Principal) -> Org:
        """An organisation the caller may see, by id or name; else 404."""
        found = self.directory.find_org(ref)
        if found is None or not rights.sees_org(by, found.id):
            raise Refusal(404, "not_found", NO_SUCH_ORG)
        return found

    def team(self, org: Org, ref: str) -> Team:
        teams = self.directory.teams_of(org.id)
        found = next((t for t in teams if t.id == ref), None) or next(
            (t for t in teams if _same(t.name, ref)), None
        )
        if found is None:
            raise Refusal(404, "not_found", f"{org.name} has no team {ref!r}")
        return found

    def project(self, org: Org, ref: str) -> Project:
        projects = self.directory.projects_of(org.id)
        found = next((p for p in projects if p.id == ref), None)
        if found is None and "/" in ref:
            team_ref, _, name = ref.partition("/")
            team = self.team(org, team_ref)
            found = next(
                (p for p in projects if p.team_id == team.id and _same(p.name, name)), None
            )
        if found is None:
            named = [p for p in projects if _same(p.name, ref)]
            if len(named) > 1:
                raise Refusal(
                    409,
                    "conflict",
                    f"{org.name} has {len(named)} projects {ref!r}; name it as TEAM/PROJECT",
                )
            found = named[0] if named else None
        if found is None:
            raise Refusal(404, "not_found", f"{org.name} has no project {ref!r}")
        return found

    def listing(self, by: Principal) -> list[Org]:
        orgs = sorted(self.directory.now.orgs.values(), key=lambda o: o.name)
        return [o for o in orgs if rights.sees_org(by, o.id)]

    # ---------------------------------------------------------- organisations

    async def create_org(self, ask: NewOrg, by: Principal) -> Org:
        if not rights.makes_orgs(by):
            raise refuse("making an organisation needs the cluster's admin role")
        self._unique(self.directory.now.orgs.values(), ask.name, "an organisation")
        org = Org(secrets.token_hex(6), ask.name.strip(), created_at=self.clock())
        await self._put(org, Audit(by.name, "org.create", org.name, org=org.id))
        return org

    async def rename_org(self, ref: str, ask: Rename, by: Principal) -> Org:
        org = self.org(ref, by)
        if not by.may("admin"):
            raise refuse("an organisation's name stays with the cluster's admins")
        others = [o for o in self.directory.now.orgs.values() if o.id != org.id]
        self._unique(others, ask.name, "an organisation")
        renamed = replace(org, name=ask.name.strip())
        await self._put(renamed, Audit(by.name, "org.rename", renamed.name, org.name, org.id))
        return renamed

    async def remove_org(self, ref: str, by: Principal, keys_in: Callable[[str], int]) -> Org:
        org = self.org(ref, by)
        if not by.may("admin"):
            raise refuse("removing an organisation needs the cluster's admin role")
        if org.id == DEFAULT_ORG:
            raise Refusal(
                409,
                "conflict",
                "the default organisation holds the keys made before organisations; it stays",
            )
        if self.directory.teams_of(org.id) or keys_in(org.id):
            raise Refusal(409, "conflict", f"{org.name} still has teams or keys; remove them first")
        gone = self.directory.members("org", org.id)
        await self.store.directory.change(
            [], [org, *gone], Audit(by.name, "org.remove", org.name, org=org.id)
        )
        await self.directory.load()
        return org

    # ------------------------------------------------------------ teams, projects

    async def create_team(self, org_ref: str, ask: NewTeam, by: Principal) -> Team:
        org = self.org(org_ref, by)
        if not rights.changes_org(by, org.id):
            raise refuse(f"making a team needs the admin role in {org.name}")
        self._unique(self.directory.teams_of(org.id), ask.name, "a team")
        team = Team(secrets.token_hex(6), org.id, ask.name.strip(), created_at=self.clock())
        await self._put(team, Audit(by.name, "team.create", team.name, org=org.id))
        return team

    async def remove_team(self, org_ref: str, ref: str, by: Principal) -> Team:
        org = self.org(org_ref, by)
        team = self.team(org, ref)
        if not rights.changes_org(by, org.id):
            raise refuse(f"removing a team needs the admin role in {org.name}")
        if self.directory.projects_of(org.id, team.id):
            raise Refusal(
                409, "conflict", f"team {team.name} still has projects; remove them first"
            )
        gone = self.directory.members("team", team.id)
        audit = Audit(by.name, "team.remove", team.name, org=org.id)
        await self.store.directory.change([], [team, *gone], audit)
        await self.directory.load()
        return team

    async def create_project(self, org_ref: str, ask: NewProject, by: Principal) -> Project:
        org = self.org(org_ref, by)
        team = self.team(org, ask.team)
        if not rights.changes_team(by, team):
            raise refuse(f"making a project needs the admin role in {org.name} or team {team.name}")
        self._unique(self.directory.projects_of(org.id, team.id), ask.name, "a project")
        project = Project(
            secrets.token_hex(6), org.id, team.id, ask.name.strip(), created_at=self.clock()
        )
        audit = Audit(by.name, "project.create", f"{team.name}/{project.name}", org=org.id)
        await self._put(project, audit)
        return project

    async def remove_project(
        self, org_ref: str, ref: str, by: Principal, keys_in: Callable[[str], int]
    ) -> Project:
        org = self.org(org_ref, by)
        project = self.project(org, ref)
        team = self.directory.now.teams[project.team_id]
        if not rights.changes_team(by, team):
            raise refuse(
                f"removing a project needs the admin role in {org.name} or team {team.name}"
            )
        if keys_in(project.id):
            raise Refusal(
                409, "conflict", f"project {project.name} still has active keys; revoke them first"
            )
        audit = Audit(by.name, "project.remove", f"{team.name}/{project.name}", org=org.id)
        if await self.store.directory.delete(project, audit):
            await self.directory.load()
        return project

    # --------------------------------------------------------------- members

    def members(self, org_ref: str, by: Principal) -> list[Membership]:
        org = self.org(org_ref, by)
        teams = {t.id for t in self.directory.teams_of(org.id)}
        visible = rights.reads_org(by, org.id)
        out = []
        for m in self.directory.now.memberships:
            in_org = (m.kind == "org" and m.scope_id == org.id) or (
                m.kind == "team" and m.scope_id in teams
            )
            if not in_org:
                continue
            if visible or m.person_id == by.person or (m.kind == "team" and m.scope_id in by.teams):
                out.append(m)
        return out

    async def set_member(self, org_ref: str, ask: Member, by: Principal) -> Membership:
        org = self.org(org_ref, by)
        person = self.directory.find_person(ask.person)
        if person is None or not person.active:
            raise Refusal(
                404, "not_found", "no such person (or deactivated); see `llmgw ctl people list`"
            )
        team = self.team(org, ask.team) if ask.team else None
        kind: ScopeKind = "team" if team else "org"
        scope = team.id if team else org.id
        may = rights.changes_team(by, team) if team else rights.changes_org(by, org.id)
        if not may:
            where = f"team {team.name}" if team else org.name
            raise refuse(f"changing members needs the admin role in {where}")
        old = next(
            (
                m
                for m in self.directory.memberships_of(person.id)
                if (m.kind, m.scope_id) == (kind, scope)
            ),
            None,
        )
        if (
            old is not None
            and person.id == by.person
            and old.role == "admin"
            and ask.role != "admin"
        ):
            raise refuse("you cannot take your own admin role away; another admin can")
        member = Membership(
            person.id, kind, scope, ask.role, True, old.created_at if old else self.clock()
        )
        where = f"team {team.name}" if team else "organisation"
        audit = Audit(by.name, "member.set", person.login, f"{ask.role} of {where}", org.id)
        await self._put(member, audit)
        return member

    async def remove_member(
        self, org_ref: str, person_ref: str, team_ref: str | None, by: Principal
    ) -> Membership:
        org = self.org(org_ref, by)
        team = self.team(org, team_ref) if team_ref else None
        kind, scope = ("team", team.id) if team else ("org", org.id)
        person = self.directory.find_person(person_ref)
        found = (
            None
            if person is None
            else next(
                (
                    m
                    for m in self.directory.memberships_of(person.id)
                    if (m.kind, m.scope_id) == (kind, scope)
                ),
                None,
            )
        )
        if person is None or found is None:
            raise Refusal(
                404,
                "not_found",
                f"no such member of {org.name}" + (f" team {team.name}" if team else ""),
            )
        may = rights.changes_team(by, team) if team else rights.changes_org(by, org.id)
        if not may:
            raise refuse("removing members needs the admin role there")
        if person.id == by.person and found.role == "admin":
            raise refuse("you cannot take your own admin role away; another admin can")
        audit = Audit(by.name, "member.remove", person.login, f"{kind} {scope}", org.id)
        await self.store.directory.delete(found, audit)
        await self.directory.load()
        return found

    # ----------------------------------------------------------------- limits

    async def set_limits(
        self, level: str, org_ref: str, ref: str | None, ask: SetLimits, by: Principal
    ) -> LimitsSet:
        """An organisation's (``ref`` None), team's or project's limits, tools and guard
        policies: the cluster's staff's to set. With ``revoke_tools``, what reaches that
        MCP server goes from this level's tools and from every level and key beneath it,
        all in one transaction, one audit entry each; the records a revoke changed
        beneath it come back beside the level's limits."""
        org = self.org(org_ref, by)
        record: Org | Team | Project = org
        if level == "team" and ref is not None:
            record = self.team(org, ref)
        elif level == "project" and ref is not None:
            record = self.project(org, ref)
        if not rights.staff(by):
            raise refuse("limits stay with the cluster's staff (operator role)")
        limits = asked(record.limits, ask, await self.policies())
        below: list[Limited] = []
        if ask.revoke_tools is not None:
            limits = replace(limits, tools=without(limits.tools, ask.revoke_tools))
            keys = self.keys.records() if self.keys is not None else []
            below = revocations(record, ask.revoke_tools, self.directory.now, keys)
        changes: list[tuple[Limited, Audit]] = [
            (
                replace(record, limits=limits),
                Audit(by.name, f"{level}.limits", record.name, limits_detail(limits), org.id),
            )
        ]
        for changed in below:
            target = changed.id if isinstance(changed, ApiKeyRecord) else changed.name
            detail = f"revoked {ask.revoke_tools} tools: {limits_detail(limits_of(changed))}"
            audit = Audit(by.name, f"{level_of(changed)}.limits", target, detail, org.id)
            changes.append((changed, audit))
        await self.store.set_limits(changes)
        await self.directory.load()
        if self.keys is not None:
            self.keys.changed(*(c for c in below if isinstance(c, ApiKeyRecord)))
        self.changed()
        return LimitsSet(limits, tuple(below))

    # ---------------------------------------------------------------- helpers

    def _unique(self, siblings: Iterable[Org | Team | Project], name: str, what: str) -> None:
        if any(_same(s.name, name) for s in siblings):
            raise Refusal(
                409, "conflict", f"name: {what} named {name.strip()!r} exists already", "name"
            )

    async def _put(self, record: object, audit: Audit) -> None:
        await self.store.directory.put(record, audit)
        await self.directory.load()
        self.changed()
