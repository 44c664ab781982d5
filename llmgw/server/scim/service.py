"""SCIM provisioning as a service: the identity provider's users are people, its groups
give their members what ``ctl auth scim map`` maps them to.

Users are every person of the directory (so a provider matching by ``userName`` finds
the people made before it), less those it DELETEd. A user's id is the person's id;
its externalId is kept in ``scim_users``, never as the person's sign-in subject, so the
same person still signs in through OIDC or LDAP. ``active`` false deactivates the
person: their personal tokens are revoked in the same write and every control plane
refuses their tokens and sessions as soon as its directory has the change. DELETE
deactivates too and hides the user (404 from then on); it never erases a person, whose
audit trail and usage stay. A POST of a hidden user's ``userName`` brings them back.

Groups are kept whole with their members (``scim_groups``). When a group's members or
name change, or the maps do, each person concerned gets again the grants of every group
they are in (``PeopleService.provision``: a role or membership set by an admin by hand
is never lowered; one the groups gave and no longer give goes), in the same transaction
as the group. While no map is set, SCIM's groups give nothing and take nothing away.

Every write is the SCIM token's holder's, audited as ``scim``; reads and writes both
answer ``Refusal``s whose codes are SCIM's ``scimType``s.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from llmgw.server.people.asks import LOGIN, LOGIN_WORDS
from llmgw.server.people.directory import Directory
from llmgw.server.people.records import Person
from llmgw.server.people.service import Grant, PeopleService
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.scim.discovery import MAX_RESULTS
from llmgw.server.scim.documents import (
    GroupFields,
    Operation,
    UserFields,
    invalid,
    patch_group,
    patch_user,
)
from llmgw.server.scim.paths import Term
from llmgw.server.scim.records import ScimGroup, ScimMap, ScimUser
from llmgw.server.scim.settings import SETTING, ScimAuth
from llmgw.server.store import Audit

# The store's tables a standby loads SCIM again for (and its settings').
TABLES = {"scim_users", "scim_groups", "settings"}
# The provider, as the audit log names it.
SCIM = Principal.system("scim")
MAX_NAME = 200
MAX_EMAIL = 254
MAX_EXTERNAL_ID = 256
T = TypeVar("T")


@dataclass(frozen=True)
class Page:
    """One page of a list: ``start`` 1-based, as SCIM counts."""

    start: int = 1
    count: int | None = None


def no_user(user_id: str) -> Refusal:
    return Refusal(404, "not_found", f"no user {user_id}")


def no_group(group_id: str) -> Refusal:
    return Refusal(404, "not_found", f"no group {group_id}")


def _matches(values: dict[str, object], terms: Sequence[Term]) -> bool:
    for term in terms:
        have = values.get(term.attr)
        if isinstance(have, list | tuple | set):
            if term.value not in have:
                return False
        elif isinstance(have, str) and isinstance(term.value, str):
            # The attributes filtered here are all case-insensitive but ids and
            # externalIds, which are compared as they are.
            exact = term.attr in ("id", "externalid", "members.value")
            if (have if exact else have.lower()) != (term.value if exact else term.value.lower()):
                return False
        elif have != term.value:
            return False
    return True


def _paged(found: list[T], page: Page, most: int) -> tuple[list[T], int]:
    start = max(page.start, 1)
    count = most if page.count is None else max(0, min(page.count, most))
    return found[start - 1 : start - 1 + count], len(found)


class ScimService:
    def __init__(
        self,
        directory: Directory,
        people: PeopleService,
        auth: ScimAuth,
        most: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.people = people
        self.auth = auth
        self.store = directory.store
        # The most resources one page answers.
        self.most = most
        self.clock = clock
        self.users: dict[str, ScimUser] = {}
        self.groups: dict[str, ScimGroup] = {}

    @classmethod
    def over(cls, directory: Directory, people: PeopleService) -> ScimService:
        """The control plane's: its settings in the store, pages of at most 1,000."""
        return cls(directory, people, ScimAuth(directory.store, directory), MAX_RESULTS)

    async def load(self) -> None:
        """Its settings, users and groups, from the store (again when it changes)."""
        await self.auth.load()
        rows = self.store.directory
        self.users = {u.person_id: u for u in await rows.all(ScimUser)}
        self.groups = {g.id: g for g in await rows.all(ScimGroup)}

    # ------------------------------------------------------------------- users

    def _shown(self, person: Person) -> bool:
        kept = self.users.get(person.id)
        return kept is None or kept.removed_at is None

    def user(self, user_id: str) -> Person:
        person = self.directory.person(user_id)
        if person is None or not self._shown(person):
            raise no_user(user_id)
        return person

    def external_id(self, person_id: str) -> str | None:
        kept = self.users.get(person_id)
        return kept.external_id if kept else None

    def fields(self, person: Person) -> UserFields:
        return UserFields(
            person.login, person.name, person.email, person.active, self.external_id(person.id)
        )

    def groups_of(self, person_id: str) -> list[ScimGroup]:
        return [g for g in self._groups_in_order() if person_id in g.members]

    def users_listed(self, terms: Sequence[Term], page: Page) -> tuple[list[Person], int]:
        people = sorted(
            (p for p in self.directory.now.people.values() if self._shown(p)),
            key=lambda p: (p.created_at, p.id),
        )
        found = [
            p
            for p in people
            if _matches(
                {
                    "id": p.id,
                    "username": p.login,
                    "externalid": self.external_id(p.id),
                    "displayname": p.name,
                    "emails.value": p.email,
                    "emails": p.email,
                    "active": p.active,
                },
                terms,
            )
        ]
        return _paged(found, page, self.most)

    def _checked(self, fields: UserFields, person_id: str | None) -> UserFields:
        if not LOGIN.fullmatch(fields.user_name):
            raise invalid(f"userName: {fields.user_name!r} is not a login: {LOGIN_WORDS}")
        if len(fields.display_name) > MAX_NAME:
            raise invalid(f"displayName: at most {MAX_NAME} characters")
        if len(fields.email) > MAX_EMAIL:
            raise invalid(f"emails.value: at most {MAX_EMAIL} characters")
        if fields.external_id is not None and len(fields.external_id) > MAX_EXTERNAL_ID:
            raise invalid(f"externalId: at most {MAX_EXTERNAL_ID} characters")
        other = self.directory.by_login(fields.user_name)
        if other is not None and other.id != person_id and self._shown(other):
            raise Refusal(
                409, "uniqueness", f"userName: {fields.user_name!r} is another user's already"
            )
        return fields

    async def create_user(self, fields: UserFields) -> Person:
        """A new person (or one DELETEd before, by their userName, back again)."""
        fields = self._checked(fields, None)
        now = self.clock()
        person = self.directory.by_login(fields.user_name)
        if person is None:
            person = Person(
                id=secrets.token_hex(6), login=fields.user_name, source="scim", created_at=now
            )
        return await self._write(person, fields, "scim.user.create", revive=True)

    async def replace_user(self, user_id: str, fields: UserFields) -> Person:
        person = self.user(user_id)
        return await self._write(person, self._checked(fields, person.id), "scim.user.update")

    async def patch_user(self, user_id: str, operations: list[Operation]) -> Person:
        person = self.user(user_id)
        fields = self._checked(patch_user(self.fields(person), operations), person.id)
        return await self._write(person, fields, "scim.user.update")

    async def remove_user(self, user_id: str) -> None:
        """Deactivated, out of every group, and hidden; never erased."""
        person = self.user(user_id)
        now = self.clock()
        kept = self.users.get(person.id) or ScimUser(person.id, created_at=now)
        hidden = replace(kept, removed_at=now, updated_at=now)
        left = [
            replace(g, members=tuple(m for m in g.members if m != person.id), updated_at=now)
            for g in self.groups.values()
            if person.id in g.members
        ]
        # In no group now: the groups' grants go (when maps are set).
        grants: list[Grant] | None = [] if self.auth.now.maps else None
        audit = Audit(SCIM.name, "scim.user.remove", person.login, "deactivated, not erased")
        gone = replace(person, active=False, updated_at=now)
        await self.people.provision([(gone, grants)], audit, [hidden, *left])
        self.users[person.id] = hidden
        self.groups.update((g.id, g) for g in left)

    async def _write(
        self, person: Person, fields: UserFields, action: str, revive: bool = False
    ) -> Person:
        now = self.clock()
        kept = self.users.get(person.id) or ScimUser(person.id, created_at=now)
        record = replace(kept, external_id=fields.external_id, updated_at=now)
        if revive:
            record = replace(record, removed_at=None)
        changed = replace(
            person,
            login=fields.user_name,
            name=fields.display_name,
            email=fields.email,
            active=fields.active,
            updated_at=now,
        )
        said = "active" if fields.active else "deactivated"
        audit = Audit(SCIM.name, action, changed.login, said)
        await self.people.provision([(changed, None)], audit, [record])
        self.users[person.id] = record
        return self.directory.person(person.id) or changed

    # ------------------------------------------------------------------ groups

    def _groups_in_order(self) -> list[ScimGroup]:
        return sorted(self.groups.values(), key=lambda g: (g.created_at, g.id))

    def group(self, group_id: str) -> ScimGroup:
        found = self.groups.get(group_id)
        if found is None:
            raise no_group(group_id)
        return found

    def groups_listed(self, terms: Sequence[Term], page: Page) -> tuple[list[ScimGroup], int]:
        found = [
            g
            for g in self._groups_in_order()
            if _matches(
                {
                    "id": g.id,
                    "displayname": g.name,
                    "externalid": g.external_id,
                    "members.value": g.members,
                    "members": g.members,
                },
                terms,
            )
        ]
        return _paged(found, page, self.most)

    def group_fields(self, group: ScimGroup) -> GroupFields:
        return GroupFields(group.name, group.external_id, group.members)

    async def create_group(self, fields: GroupFields) -> ScimGroup:
        now = self.clock()
        group = ScimGroup(secrets.token_hex(8), fields.name, created_at=now, updated_at=now)
        return await self._write_group(group, fields, "scim.group.create", (), new=True)

    async def replace_group(self, group_id: str, fields: GroupFields) -> ScimGroup:
        old = self.group(group_id)
        return await self._write_group(old, fields, "scim.group.update", old.members)

    async def patch_group(self, group_id: str, operations: list[Operation]) -> ScimGroup:
        old = self.group(group_id)
        fields = patch_group(self.group_fields(old), operations)
        return await self._write_group(old, fields, "scim.group.update", old.members)

    async def remove_group(self, group_id: str) -> None:
        old = self.group(group_id)
        others = {g.id: g for g in self.groups.values() if g.id != old.id}
        changes = self._regranted(old.members, others)
        audit = Audit(SCIM.name, "scim.group.remove", old.name, f"{len(old.members)} members")
        # The group gone and what its members are given then, in one transaction.
        await self.people.provision(changes or [], audit, removed=[old])
        self.groups = others

    async def _write_group(
        self,
        group: ScimGroup,
        fields: GroupFields,
        action: str,
        before: Iterable[str],
        new: bool = False,
    ) -> ScimGroup:
        if len(fields.name) > MAX_NAME:
            raise invalid(f"displayName: at most {MAX_NAME} characters")
        if fields.external_id is not None and len(fields.external_id) > MAX_EXTERNAL_ID:
            raise invalid(f"externalId: at most {MAX_EXTERNAL_ID} characters")
        for member in fields.members:
            person = self.directory.person(member)
            if person is None or not self._shown(person):
                raise invalid(f"members: no user {member}; provision the user first")
        written = replace(
            group,
            name=fields.name,
            external_id=fields.external_id,
            members=fields.members,
            updated_at=self.clock(),
        )
        before = set(before)
        after = set(written.members)
        concerned = after | before if new or group.name != written.name else after ^ before
        groups = {**self.groups, written.id: written}
        changes = self._regranted(sorted(concerned), groups) or []
        audit = Audit(SCIM.name, action, written.name, f"{len(after)} members")
        # The group and what its members are given, in one transaction.
        await self.people.provision(changes, audit, [written])
        self.groups = groups
        return written

    # ------------------------------------------------------------------ grants

    def grants_of(self, person_id: str, groups: dict[str, ScimGroup] | None = None) -> list[Grant]:
        """What the maps give a person for the groups they are in."""
        kept = self.groups if groups is None else groups
        names = {g.name.casefold() for g in kept.values() if person_id in g.members}
        return [
            Grant(m.role, m.kind, m.scope_id)
            for m in self.auth.now.maps
            if m.group.casefold() in names
        ]

    def _regranted(
        self, person_ids: Iterable[str], groups: dict[str, ScimGroup], force: bool = False
    ) -> list[tuple[Person, Sequence[Grant] | None]] | None:
        """Each person concerned with the grants of their groups (``groups`` as they
        will be); None while no map is set (and not ``force``d): groups give nothing."""
        if not self.auth.now.maps and not force:
            return None
        found = (self.directory.person(p) for p in person_ids)
        return [(p, self.grants_of(p.id, groups)) for p in found if p is not None]

    async def set_maps(self, maps: Sequence[str], by: Principal) -> tuple[ScimMap, ...]:
        """The groups' map, and every member of a group given again what it now gives."""
        had = bool(self.auth.now.maps)
        parsed = await self.auth.set_maps(maps, by)
        members = sorted({m for g in self.groups.values() for m in g.members})
        changes = self._regranted(members, self.groups, force=had)
        if changes:
            audit = Audit(by.name, "scim.grants", SETTING, f"{len(changes)} members' grants")
            await self.people.provision(changes, audit)
        return parsed
