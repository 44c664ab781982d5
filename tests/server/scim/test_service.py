"""SCIM provisioning over a real SQLite store: users are people, groups give their
members what the maps say, and nothing set by hand is lowered; a deactivated or
DELETEd user's tokens and sessions end at once, and no one is ever erased."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.server.people.asks import ChangePerson, Member, NewPerson, NewTeam, NewToken
from llmgw.server.people.directory import Directory
from llmgw.server.people.orgs import OrgService
from llmgw.server.people.records import DEFAULT_ORG, Person
from llmgw.server.people.service import PeopleService
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.scim.documents import PATCH_OP, GroupFields, Operation, UserFields, read_patch
from llmgw.server.scim.paths import parse_filter
from llmgw.server.scim.service import Page, ScimService
from llmgw.server.store import StoreUnavailable
from llmgw.server.store.sqlite import SQLiteStore

ADMIN = Principal.system("test-admin")


@dataclass
class World:
    store: SQLiteStore
    directory: Directory
    people: PeopleService
    orgs: OrgService
    scim: ScimService

    async def again(self) -> ScimService:
        """Another control plane's SCIM service over the same store, freshly loaded."""
        directory = Directory(self.store)
        await directory.load()
        other = ScimService.over(directory, PeopleService(directory))
        await other.load()
        return other


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    directory = Directory(store)
    await directory.load()
    people = PeopleService(directory)
    scim = ScimService.over(directory, people)
    await scim.load()
    try:
        yield World(store, directory, people, OrgService(directory), scim)
    finally:
        await store.close()


def patch(*operations: dict[str, object]) -> list[Operation]:
    return read_patch({"schemas": [PATCH_OP], "Operations": list(operations)})


def roles(world: World, person: Person) -> dict[tuple[str, str], tuple[str, bool]]:
    return {
        (m.kind, m.scope_id): (m.role, m.by_hand) for m in world.directory.memberships_of(person.id)
    }


async def test_a_user_is_a_person_made_by_scim_with_its_external_id_kept_apart(
    world: World,
) -> None:
    person = await world.scim.create_user(UserFields("alice", "Alice", "a@x.org", True, "ext-7"))
    assert person.source == "scim" and person.login == "alice" and person.email == "a@x.org"
    # Not the person's sign-in subject: the same person signs in through OIDC or LDAP.
    assert person.subject is None
    other = await world.again()
    assert other.external_id(person.id) == "ext-7"
    found, total = other.users_listed(parse_filter('externalId eq "ext-7"'), Page())
    assert [p.id for p in found] == [person.id] and total == 1
    found, _ = other.users_listed(parse_filter('userName eq "ALICE"'), Page())
    assert [p.id for p in found] == [person.id]
    with pytest.raises(Refusal) as refused:
        await world.scim.create_user(UserFields("alice"))
    assert refused.value.status == 409 and refused.value.code == "uniqueness"
    with pytest.raises(Refusal) as refused:
        await world.scim.create_user(UserFields("has space"))
    assert refused.value.code == "invalidValue" and "userName" in refused.value.message


async def test_people_made_before_are_users_a_provider_finds_by_user_name(world: World) -> None:
    made = await world.people.create(NewPerson(login="bob", name="Bob"), ADMIN)
    found, _ = world.scim.users_listed(parse_filter('userName eq "bob"'), Page())
    assert [p.id for p in found] == [made.id]
    changed = await world.scim.patch_user(
        made.id, patch({"op": "replace", "path": "displayName", "value": "Robert"})
    )
    assert changed.name == "Robert" and changed.source == "local"


async def test_deactivated_a_persons_tokens_and_sessions_end_at_once_everywhere(
    world: World,
) -> None:
    person = await world.scim.create_user(UserFields("carol"))
    me = world.directory.principal(person, "session")
    assert me is not None
    _, token = await world.people.new_token(person.id, NewToken(name="ctl"), me)
    assert world.directory.by_token(token) is not None

    await world.scim.patch_user(person.id, patch({"op": "Replace", "value": {"active": "False"}}))
    assert world.directory.by_token(token) is None
    assert world.directory.session_principal(person.id) is None
    # Another control plane's directory, loaded from the store, refuses them too, and
    # the token stays revoked when the person comes back.
    other = await world.again()
    assert other.directory.by_token(token) is None
    await world.scim.patch_user(
        person.id, patch({"op": "replace", "path": "active", "value": True})
    )
    assert world.directory.session_principal(person.id) is not None
    assert world.directory.by_token(token) is None


async def test_delete_deactivates_and_hides_never_erases_and_a_new_post_brings_them_back(
    world: World,
) -> None:
    person = await world.scim.create_user(UserFields("dave", external_id="d1"))
    group = await world.scim.create_group(GroupFields("eng", None, (person.id,)))
    await world.scim.remove_user(person.id)

    with pytest.raises(Refusal) as refused:
        world.scim.user(person.id)
    assert refused.value.status == 404
    kept = world.directory.person(person.id)
    assert kept is not None and not kept.active
    assert world.scim.group(group.id).members == ()
    assert world.scim.users_listed((), Page())[1] == 0
    other = await world.again()
    assert other.users_listed((), Page())[1] == 0 and other.group(group.id).members == ()

    back = await world.scim.create_user(UserFields("dave", external_id="d2"))
    assert back.id == person.id and back.active and world.scim.external_id(back.id) == "d2"


async def test_a_groups_members_get_its_maps_and_lose_them_when_they_leave(world: World) -> None:
    team = await world.orgs.create_team(DEFAULT_ORG, NewTeam(name="ml"), ADMIN)
    erin = await world.scim.create_user(UserFields("erin"))
    group = await world.scim.create_group(GroupFields("ML-Engineers", None, (erin.id,)))
    # No map yet: the group gives nothing.
    assert roles(world, erin) == {} and world.directory.person(erin.id).role is None  # type: ignore[union-attr]

    await world.scim.set_maps(
        ["ml-engineers=default/ml:manager", "ML-Engineers=cluster:viewer"], ADMIN
    )
    assert roles(world, erin) == {("team", team.id): ("manager", False)}
    assert world.directory.person(erin.id).role == "viewer"  # type: ignore[union-attr]

    frank = await world.scim.create_user(UserFields("frank"))
    await world.scim.patch_group(
        group.id, patch({"op": "add", "path": "members", "value": [{"value": frank.id}]})
    )
    assert roles(world, frank) == {("team", team.id): ("manager", False)}
    await world.scim.patch_group(
        group.id, patch({"op": "remove", "path": f'members[value eq "{erin.id}"]'})
    )
    assert roles(world, erin) == {} and world.directory.person(erin.id).role is None  # type: ignore[union-attr]
    assert roles(world, frank) == {("team", team.id): ("manager", False)}

    await world.scim.remove_group(group.id)
    assert roles(world, frank) == {}


async def test_a_group_never_lowers_what_an_admin_set_by_hand(world: World) -> None:
    await world.orgs.create_team(DEFAULT_ORG, NewTeam(name="ml"), ADMIN)
    grace = await world.scim.create_user(UserFields("grace"))
    await world.orgs.set_member(
        DEFAULT_ORG, Member(person=grace.id, role="admin", team="ml"), ADMIN
    )
    await world.people.change(grace.id, ChangePerson(role="operator"), ADMIN)
    await world.scim.set_maps(["eng=default/ml:member", "eng=cluster:viewer"], ADMIN)

    group = await world.scim.create_group(GroupFields("eng", None, (grace.id,)))
    person = world.directory.person(grace.id)
    assert person is not None and person.role == "operator" and person.role_by_hand
    (kept,) = world.directory.memberships_of(grace.id)
    assert (kept.role, kept.by_hand) == ("admin", True)

    # Out of the group, what the admin set stays too.
    await world.scim.replace_group(group.id, GroupFields("eng"))
    assert world.directory.memberships_of(grace.id) == [kept]
    assert world.directory.person(grace.id).role == "operator"  # type: ignore[union-attr]


async def test_changing_the_maps_gives_every_member_again_what_they_now_give(
    world: World,
) -> None:
    henry = await world.scim.create_user(UserFields("henry"))
    await world.scim.create_group(GroupFields("ops", None, (henry.id,)))
    await world.scim.set_maps(["ops=default:manager"], ADMIN)
    assert roles(world, henry) == {("org", DEFAULT_ORG): ("manager", False)}
    await world.scim.set_maps(["ops=default:member"], ADMIN)
    assert roles(world, henry) == {("org", DEFAULT_ORG): ("member", False)}
    # No map at all: what the maps gave goes.
    await world.scim.set_maps([], ADMIN)
    assert roles(world, henry) == {}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("eng", "is not GROUP=ORG[/TEAM]:ROLE"),
        ("eng=cluster:manager", "a cluster role is viewer, operator or admin"),
        ("eng=default:operator", "member, manager or admin"),
        ("eng=nowhere:member", "no organisation 'nowhere'"),
        ("eng=default/nope:member", "has no team 'nope'"),
    ],
)
async def test_a_map_that_cannot_be_is_refused_naming_it(
    world: World, given: str, said: str
) -> None:
    with pytest.raises(Refusal) as refused:
        await world.scim.set_maps([given], ADMIN)
    assert refused.value.status == 400 and said in refused.value.message
    assert world.scim.auth.now.maps == ()


async def test_only_a_cluster_admin_changes_scims_settings(world: World) -> None:
    operator = Principal("olga", "operator", "token", "p1")
    for attempt in (
        world.scim.auth.new_token(operator),
        world.scim.auth.off(operator),
        world.scim.set_maps([], operator),
    ):
        with pytest.raises(Refusal) as refused:
            await attempt
        assert refused.value.status == 403
    token = await world.scim.auth.new_token(ADMIN)
    assert world.scim.auth.token_ok(token) and not world.scim.auth.token_ok(token + "x")
    newer = await world.scim.auth.new_token(ADMIN)
    assert world.scim.auth.token_ok(newer) and not world.scim.auth.token_ok(token)
    # The store keeps its hash, never the token; another control plane reads it.
    assert token not in (await world.store.get_setting("auth.scim") or "")
    other = await world.again()
    assert other.auth.token_ok(newer)
    await world.scim.auth.off(ADMIN)
    assert not world.scim.auth.token_ok(newer)


async def test_members_must_be_users(world: World) -> None:
    with pytest.raises(Refusal) as refused:
        await world.scim.create_group(GroupFields("eng", None, ("nobody",)))
    assert refused.value.code == "invalidValue" and "no user nobody" in refused.value.message
    assert world.scim.groups_listed((), Page())[1] == 0


async def test_a_large_group_is_one_write_with_its_members_grants(world: World) -> None:
    await world.scim.set_maps(["all=default:member"], ADMIN)
    made = [await world.scim.create_user(UserFields(f"u{n:03}")) for n in range(150)]
    before = len(await world.store.audit_log(limit=10_000))
    group = await world.scim.create_group(GroupFields("all", None, tuple(p.id for p in made)))
    log = await world.store.audit_log(limit=10_000)
    assert len(log) == before + 1 and log[0]["action"] == "scim.group.create"
    assert all(roles(world, p) == {("org", DEFAULT_ORG): ("member", False)} for p in made)
    # Renamed to a name no map names: every member's grant goes, in one write again.
    await world.scim.patch_group(
        group.id, patch({"op": "replace", "path": "displayName", "value": "everyone"})
    )
    assert len(await world.store.audit_log(limit=10_000)) == before + 2
    assert all(roles(world, p) == {} for p in made)


async def test_a_store_that_cannot_be_written_changes_nothing_here_either(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.scim.set_maps(["eng=default:manager"], ADMIN)
    ana = await world.scim.create_user(UserFields("ana"))
    group = await world.scim.create_group(GroupFields("eng", None, (ana.id,)))

    async def unwritable(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("the store is read-only (disk full)")

    monkeypatch.setattr(world.store.directory, "change", unwritable)
    for attempt in (
        world.scim.replace_group(group.id, GroupFields("eng")),
        world.scim.remove_group(group.id),
        world.scim.remove_user(ana.id),
        world.scim.patch_user(ana.id, patch({"op": "replace", "path": "active", "value": False})),
    ):
        with pytest.raises(StoreUnavailable):
            await attempt
    # The group, its members' grants and the user are as they were, in memory as stored.
    assert world.scim.group(group.id).members == (ana.id,)
    assert world.scim.user(ana.id).active
    assert roles(world, ana) == {("org", DEFAULT_ORG): ("manager", False)}
    monkeypatch.undo()
    other = await world.again()
    assert other.group(group.id).members == (ana.id,) and other.user(ana.id).active
