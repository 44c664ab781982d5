"""A cluster of people over a real SQLite store: the directory, the people, organisation
and key services as the control plane builds them, and two organisations, each with a
team, a project and people in every role (``World``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.server.gateway.keyservice import KeyService
from llmgw.server.gateway.limits import KeyBook, Usage
from llmgw.server.people.asks import Member, NewOrg, NewPerson, NewProject, NewTeam
from llmgw.server.people.directory import Directory
from llmgw.server.people.orgs import OrgService
from llmgw.server.people.records import Org, Person, Project, Team
from llmgw.server.people.service import PeopleService
from llmgw.server.principal import OrgRole, Principal, Role
from llmgw.server.store import SQLiteStore

NOW = 1_781_000_000.0
ROOT = Principal.system("test")


@dataclass
class Side:
    """One organisation with a team and a project, and a person in each of its roles."""

    org: Org
    team: Team
    project: Project
    admin: Person
    manager: Person
    member: Person


@dataclass
class World:
    store: SQLiteStore
    directory: Directory
    people: PeopleService
    orgs: OrgService
    keys: KeyService
    usage: Usage
    a: Side
    b: Side

    def who(self, person: Person) -> Principal:
        """The person as they act now (a session's principal)."""
        found = self.directory.session_principal(person.id)
        assert found is not None, f"{person.login} acts as nobody"
        return found

    async def person(self, login: str, role: Role | None = None) -> Person:
        return await self.people.create(NewPerson(login=login, role=role), ROOT)

    async def join(self, person: Person, org: Org, role: OrgRole, team: Team | None = None) -> None:
        ask = Member(person=person.id, role=role, team=team.id if team else None)
        await self.orgs.set_member(org.id, ask, ROOT)


async def side(w: World, name: str) -> Side:
    org = await w.orgs.create_org(NewOrg(name=name), ROOT)
    team = await w.orgs.create_team(org.id, NewTeam(name="research"), ROOT)
    project = await w.orgs.create_project(org.id, NewProject(name="chat", team=team.id), ROOT)
    admin = await w.person(f"{name}-admin")
    manager = await w.person(f"{name}-manager")
    member = await w.person(f"{name}-member")
    await w.join(admin, org, "admin")
    await w.join(manager, org, "manager")
    await w.join(member, org, "member", team)
    return Side(org, team, project, admin, manager, member)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    clock = lambda: NOW  # noqa: E731
    usage = Usage(store, clock=clock)
    book = KeyBook(usage, clock=clock)
    directory = Directory(store, clock=clock)
    await directory.load()
    keys = KeyService(store, book, usage.flush, {}, lambda r: 0.0, directory, clock=clock)
    w = World(
        store,
        directory,
        PeopleService(directory, clock=clock),
        OrgService(directory, clock=clock),
        keys,
        usage,
        a=None,  # type: ignore[arg-type]
        b=None,  # type: ignore[arg-type]
    )
    w.a = await side(w, "acme")
    w.b = await side(w, "globex")
    try:
        yield w
    finally:
        await store.close()
