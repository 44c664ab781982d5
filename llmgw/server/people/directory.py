"""Who is who, held in memory on every control plane: people, their personal tokens,
organisations, teams, projects and memberships, loaded from the store and again when a
standby's store changes (so a person deactivated on the leader is refused on every
control plane within the store's round trip).

``principal`` makes the ``Principal`` a person acts as: their login, their cluster role
as it is now (not as when a session opened), and their role in each organisation and
team. A team membership makes a person at least a member of the team's organisation.
A deactivated person acts as nobody: their tokens and sessions are refused.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from llmgw.server.people.records import (
    Membership,
    Org,
    Person,
    PersonToken,
    Project,
    Team,
)
from llmgw.server.principal import ORG_ROLES, OrgRole, Principal, Via
from llmgw.server.store import Store

# What a personal token starts with, so a leaked one is recognised (and told from a
# gateway key, sk-llmgw-, and the admin token, llmgw-admin-).
TOKEN_PREFIX = "llmgw-pat-"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _higher(a: OrgRole | None, b: OrgRole) -> OrgRole:
    return b if a is None or ORG_ROLES.index(b) > ORG_ROLES.index(a) else a


@dataclass
class Snapshot:
    """Every record, as the store had them at the last load."""

    people: dict[str, Person] = field(default_factory=dict)
    orgs: dict[str, Org] = field(default_factory=dict)
    teams: dict[str, Team] = field(default_factory=dict)
    projects: dict[str, Project] = field(default_factory=dict)
    memberships: list[Membership] = field(default_factory=list)
    tokens: dict[str, PersonToken] = field(default_factory=dict)  # by hash


class Directory:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.now = Snapshot()
        self._by_login: dict[str, Person] = {}
        self._by_subject: dict[str, Person] = {}
        self._member_of: dict[str, list[Membership]] = {}

    async def load(self) -> None:
        rows = self.store.directory
        snap = Snapshot(
            people={p.id: p for p in await rows.all(Person)},
            orgs={o.id: o for o in await rows.all(Org)},
            teams={t.id: t for t in await rows.all(Team)},
            projects={p.id: p for p in await rows.all(Project)},
            memberships=await rows.all(Membership),
            tokens={t.token_hash: t for t in await rows.all(PersonToken)},
        )
        self.apply(snap)

    def apply(self, snap: Snapshot) -> None:
        self.now = snap
        self._by_login = {p.login: p for p in snap.people.values()}
        self._by_subject = {p.subject: p for p in snap.people.values() if p.subject}
        member_of: dict[str, list[Membership]] = {}
        for m in snap.memberships:
            member_of.setdefault(m.person_id, []).append(m)
        self._member_of = member_of

    # ------------------------------------------------------------------ lookups

    def person(self, person_id: str) -> Person | None:
        return self.now.people.get(person_id)

    def by_login(self, login: str) -> Person | None:
        return self._by_login.get(login.strip().lower())

    def by_subject(self, subject: str) -> Person | None:
        return self._by_subject.get(subject)

    def find_org(self, ref: str) -> Org | None:
        """An organisation by id or name (names are unique, whatever their case)."""
        found = self.now.orgs.get(ref)
        if found is not None:
            return found
        name = ref.strip().casefold()
        return next((o for o in self.now.orgs.values() if o.name.strip().casefold() == name), None)

    def find_person(self, ref: str) -> Person | None:
        """A person by id or login."""
        return self.person(ref) or self.by_login(ref)

    def memberships_of(self, person_id: str) -> list[Membership]:
        return list(self._member_of.get(person_id, ()))

    def members(self, kind: str, scope_id: str) -> list[Membership]:
        return [m for m in self.now.memberships if m.kind == kind and m.scope_id == scope_id]

    def teams_of(self, org_id: str) -> list[Team]:
        return [t for t in self.now.teams.values() if t.org_id == org_id]

    def projects_of(self, org_id: str, team_id: str | None = None) -> list[Project]:
        return [
            p
            for p in self.now.projects.values()
            if p.org_id == org_id and (team_id is None or p.team_id == team_id)
        ]

    def tokens_of(self, person_id: str) -> list[PersonToken]:
        return sorted(
            (t for t in self.now.tokens.values() if t.person_id == person_id),
            key=lambda t: t.created_at,
        )

    # ---------------------------------------------------------------- principals

    def principal(self, person: Person, via: Via) -> Principal | None:
        """Whom a person acts as now; None for a deactivated person."""
        if not person.active:
            return None
        orgs: dict[str, OrgRole] = {}
        teams: dict[str, OrgRole] = {}
        for m in self._member_of.get(person.id, ()):
            if m.kind == "org" and m.scope_id in self.now.orgs:
                orgs[m.scope_id] = _higher(orgs.get(m.scope_id), m.role)
            elif m.kind == "team":
                team = self.now.teams.get(m.scope_id)
                if team is None:
                    continue
                teams[team.id] = _higher(teams.get(team.id), m.role)
                orgs[team.org_id] = _higher(orgs.get(team.org_id), "member")
        return Principal(person.login, person.role, via, person.id, orgs, teams)

    def by_token(self, token: str) -> Principal | None:
        """The person a personal token is theirs, acting as them; None for a token that
        is not one, is revoked or expired, or whose person is deactivated."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        record = self.now.tokens.get(token_hash(token))
        if record is None or record.revoked_at is not None:
            return None
        if record.expires_at is not None and self.clock() >= record.expires_at:
            return None
        person = self.person(record.person_id)
        return None if person is None else self.principal(person, "token")

    def session_principal(self, person_id: str) -> Principal | None:
        """A session's person as they are now (None: gone or deactivated)."""
        person = self.person(person_id)
        return None if person is None else self.principal(person, "session")

    def logins(self, ids: Iterable[str]) -> dict[str, str]:
        return {i: p.login for i in ids if (p := self.person(i)) is not None}
