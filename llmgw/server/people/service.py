"""People and their personal tokens, as a service: every change checked against the
caller once, written with its audit entry, and applied to the directory at once (the
other control planes take it from the store).

A cluster admin makes people, sets their cluster role (by hand: an identity provider's
groups never lower it), and deactivates them: a deactivated person's sessions and
tokens are refused at once, on every control plane, since each control plane asks the
directory at every request. A person makes and revokes their own personal tokens; an
admin may revoke anyone's. A token is shown once; the store keeps its SHA-256.

``sign_in`` is the one way an identity provider (OIDC, LDAP, SCIM) makes or updates a
person: found by the provider's subject, else by login; their group grants
(``Grant``) raise memberships and their cluster role, and a membership the groups no
longer give goes, unless an admin set it by hand. Nothing set by hand is ever lowered.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from llmgw.server.people import rights
from llmgw.server.people.asks import ChangePerson, NewPerson, NewToken
from llmgw.server.people.directory import TOKEN_PREFIX, Directory, token_hash
from llmgw.server.people.records import Membership, Person, PersonToken, ScopeKind, Source
from llmgw.server.principal import (
    ORG_ROLES,
    ROLES,
    OrgRole,
    Principal,
    Role,
    is_org_role,
    is_role,
)
from llmgw.server.refusal import Refusal
from llmgw.server.store import Audit

NO_SUCH_PERSON = "no such person; see `llmgw ctl people list`"


def refuse(why: str) -> Refusal:
    return Refusal(403, "forbidden", why)


@dataclass(frozen=True)
class Grant:
    """What one of a person's groups gives them: a cluster role, or a role in an
    organisation or team (``kind`` and ``scope_id``)."""

    role: OrgRole | Role
    kind: str = "cluster"
    scope_id: str = ""


@dataclass(frozen=True)
class Identity:
    """Who an identity provider says signed in."""

    source: Source
    subject: str
    login: str
    name: str = ""
    email: str = ""


def cluster_role(person: Person, grants: Sequence[Grant]) -> Role | None:
    """The cluster role the groups give, never below one an admin set by hand."""
    given = [r for g in grants if g.kind == "cluster" and is_role(r := str(g.role))]
    best: Role | None = max(given, key=ROLES.index) if given else None
    if not person.role_by_hand or person.role is None:
        return best
    if best is not None and ROLES.index(best) > ROLES.index(person.role):
        return best
    return person.role


class PeopleService:
    def __init__(self, directory: Directory, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.store = directory.store
        self.clock = clock

    def find(self, ref: str) -> Person:
        person = self.directory.find_person(ref)
        if person is None:
            raise Refusal(404, "not_found", NO_SUCH_PERSON)
        return person

    def listing(self, by: Principal) -> list[Person]:
        """Everyone, for the cluster's staff and organisations' admins (who add people
        to their teams); anyone else sees only themselves."""
        people = sorted(self.directory.now.people.values(), key=lambda p: p.login)
        if by.may("viewer") or "admin" in by.orgs.values() or "admin" in by.teams.values():
            return people
        return [p for p in people if p.id == by.person]

    def show(self, ref: str, by: Principal) -> Person:
        person = self.find(ref)
        if person.id != by.person and not by.may("viewer"):
            raise Refusal(404, "not_found", NO_SUCH_PERSON)
        return person

    async def _save(self, person: Person, audit: Audit, *more: object) -> None:
        await self.store.directory.change([person, *more], [], audit)
        await self.directory.load()

    async def create(self, ask: NewPerson, by: Principal) -> Person:
        if not rights.manages_people(by):
            raise refuse("making people needs the cluster's admin role")
        login = ask.login.strip().lower()
        if self.directory.by_login(login) is not None:
            raise Refusal(409, "conflict", f"login: {login!r} is someone's already", "login")
        now = self.clock()
        person = Person(
            id=secrets.token_hex(6),
            login=login,
            name=ask.name.strip(),
            email=ask.email.strip(),
            role=ask.role,
            role_by_hand=ask.role is not None,
            created_at=now,
            updated_at=now,
        )
        detail = f"role {ask.role or 'none'}"
        await self._save(person, Audit(by.name, "person.create", login, detail))
        return person

    async def change(self, ref: str, ask: ChangePerson, by: Principal) -> Person:
        if not rights.manages_people(by):
            raise refuse("changing people needs the cluster's admin role")
        person = self.find(ref)
        changed = replace(person, updated_at=self.clock())
        said: list[str] = []
        if ask.name is not None:
            changed = replace(changed, name=ask.name.strip())
        if ask.email is not None:
            changed = replace(changed, email=ask.email.strip())
        if ask.role is not None or ask.no_role:
            role = None if ask.no_role else ask.role
            if person.id == by.person and (
                role is None or ROLES.index(role) < ROLES.index("admin")
            ):
                raise refuse("you cannot take your own admin role away; another admin can")
            changed = replace(changed, role=role, role_by_hand=True)
            said.append(f"role {role or 'none'}")
        if ask.active is not None and ask.active != person.active:
            if person.id == by.person:
                raise refuse("you cannot deactivate yourself; another admin can")
            changed = replace(changed, active=ask.active)
            said.append("activated" if ask.active else "deactivated")
        more: list[object] = []
        if ask.active is False:
            now = self.clock()
            more = [
                replace(t, revoked_at=now)
                for t in self.directory.tokens_of(person.id)
                if t.revoked_at is None
            ]
        audit = Audit(by.name, "person.update", person.login, "; ".join(said) or "details")
        await self._save(changed, audit, *more)
        return changed

    # ------------------------------------------------------------------ tokens

    def tokens(self, ref: str, by: Principal) -> list[PersonToken]:
        person = self.find(ref)
        if not rights.sees_tokens(by, person.id):
            raise refuse("only the person themselves or a cluster admin sees their tokens")
        return self.directory.tokens_of(person.id)

    async def new_token(self, ref: str, ask: NewToken, by: Principal) -> tuple[PersonToken, str]:
        """A token acting as the person, shown once: only the person makes their own."""
        person = self.find(ref)
        if not rights.makes_token(by, person.id):
            raise refuse("a personal token is made by its person alone, signed in")
        if not person.active:
            raise refuse("this person is deactivated")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = self.clock()
        record = PersonToken(
            id=secrets.token_hex(6),
            person_id=person.id,
            name=ask.name.strip(),
            token_hash=token_hash(token),
            created_at=now,
            expires_at=None if ask.days is None else now + ask.days * 86400,
        )
        await self.store.directory.put(
            record, Audit(by.name, "token.create", person.login, record.name)
        )
        await self.directory.load()
        return record, token

    async def revoke_token(self, ref: str, token_id: str, by: Principal) -> PersonToken:
        person = self.find(ref)
        if not rights.sees_tokens(by, person.id):
            raise refuse("only the person themselves or a cluster admin revokes their tokens")
        found = next((t for t in self.directory.tokens_of(person.id) if t.id == token_id), None)
        if found is None:
            raise Refusal(404, "not_found", f"{person.login} has no token {token_id}")
        if found.revoked_at is not None:
            return found
        revoked = replace(found, revoked_at=self.clock())
        audit = Audit(by.name, "token.revoke", person.login, found.name)
        await self.store.directory.put(revoked, audit)
        await self.directory.load()
        return revoked

    # ----------------------------------------------------------------- sign-in

    async def sign_in(
        self, who: Identity, grants: Sequence[Grant], by: str, create: bool = True
    ) -> Person | None:
        """Make or update the person an identity provider vouches for, and apply their
        groups' grants; None when they are unknown and ``create`` is off, or deactivated."""
        person = self.directory.by_subject(who.subject)
        login = who.login.strip().lower()
        if person is None:
            person = self.directory.by_login(login)
            if person is not None and person.subject and person.subject != who.subject:
                raise refuse(f"the login {login!r} belongs to another identity")
        now = self.clock()
        if person is None:
            if not create:
                return None
            person = Person(
                id=secrets.token_hex(6),
                login=login,
                source=who.source,
                created_at=now,
                updated_at=now,
            )
        if not person.active:
            return None
        person = replace(
            person,
            name=who.name or person.name,
            email=who.email or person.email,
            subject=who.subject,
            updated_at=now,
        )
        person = replace(person, role=cluster_role(person, grants))
        puts, deletes = self._memberships(person, grants, now)
        audit = Audit(by, "person.sign_in", person.login, who.source)
        await self.store.directory.change([person, *puts], deletes, audit)
        await self.directory.load()
        return self.directory.person(person.id)

    def _memberships(
        self, person: Person, grants: Sequence[Grant], now: float
    ) -> tuple[list[Membership], list[Membership]]:
        """Memberships to write and to remove: the groups' grants raise, never lower a
        membership set by hand; one the groups no longer give goes unless set by hand."""
        wanted: dict[tuple[ScopeKind, str], OrgRole] = {}
        snap = self.directory.now
        for g in grants:
            role = str(g.role)
            # A group mapped to an organisation or team that is no more gives nothing.
            exists = g.scope_id in (snap.orgs if g.kind == "org" else snap.teams)
            if g.kind in ("org", "team") and is_org_role(role) and exists:
                key: tuple[ScopeKind, str] = ("org" if g.kind == "org" else "team", g.scope_id)
                old = wanted.get(key)
                if old is None or ORG_ROLES.index(role) > ORG_ROLES.index(old):
                    wanted[key] = role
        have = {(m.kind, m.scope_id): m for m in self.directory.memberships_of(person.id)}
        puts: list[Membership] = []
        for (kind, scope), role in wanted.items():
            m = have.get((kind, scope))
            if m is None:
                puts.append(Membership(person.id, kind, scope, role, False, now))
            elif ORG_ROLES.index(role) > ORG_ROLES.index(m.role) or (
                not m.by_hand and role != m.role
            ):
                puts.append(replace(m, role=role))
        deletes = [m for k, m in have.items() if k not in wanted and not m.by_hand]
        return puts, deletes

    # ------------------------------------------------------------- provisioning

    async def provision(
        self,
        changes: Sequence[tuple[Person, Sequence[Grant] | None]],
        audit: Audit,
        more: Sequence[object] = (),
        removed: Sequence[object] = (),
    ) -> None:
        """Write people as a provisioning identity provider (SCIM) says: each made,
        changed or deactivated (their personal tokens revoked with it, and their sessions
        refused from then on) and, where grants are given, with the cluster role and
        memberships their groups give (as ``sign_in`` applies them: nothing set by hand
        is lowered; a person whose grants change nothing is not written again). All in
        one transaction with ``audit``, ``more`` records of the provider's own written
        and ``removed`` ones deleted, so a group of thousands is one write and one
        load of the directory."""
        now = self.clock()
        puts: list[object] = []
        deletes: list[Membership] = []
        for person, grants in changes:
            if grants is not None:
                granted = replace(person, role=cluster_role(person, grants))
                memberships, gone = self._memberships(granted, grants, now)
                if granted == self.directory.person(person.id) and not memberships and not gone:
                    continue
                person = granted
                puts += memberships
                deletes += gone
            puts.append(person)
            if not person.active:
                puts += [
                    replace(t, revoked_at=now)
                    for t in self.directory.tokens_of(person.id)
                    if t.revoked_at is None
                ]
        if not puts and not deletes and not more and not removed:
            return
        await self.store.directory.change([*puts, *more], [*deletes, *removed], audit)
        await self.directory.load()
