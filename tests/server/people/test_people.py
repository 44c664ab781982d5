"""``PeopleService``: only a cluster admin makes and changes people, and nobody takes
their own admin role away; a deactivated person's personal tokens and sessions end at
once; ``sign_in`` never lowers what an admin set by hand, and a group removed at the
provider removes a membership the groups gave."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from llmgw.server.access import Denied, Gate
from llmgw.server.people.asks import ChangePerson, Member, NewPerson, NewToken
from llmgw.server.people.records import Membership
from llmgw.server.people.service import Grant, Identity
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.sessions import COOKIE, Sessions
from tests.server.people.conftest import ROOT, World

IDP = "https://idp.example"


def request(headers: dict[str, str]) -> Request:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "headers": raw, "client": ("10.0.0.5", 1)})


async def test_only_a_cluster_admin_makes_and_changes_people(world: World) -> None:
    for caller in (world.who(world.a.admin), Principal("op", "operator", "token")):
        with pytest.raises(Refusal) as refused:
            await world.people.create(NewPerson(login="eve"), caller)
        assert refused.value.status == 403
        with pytest.raises(Refusal) as refused:
            await world.people.change(world.a.member.id, ChangePerson(role="admin"), caller)
        assert refused.value.status == 403
    with pytest.raises(Refusal) as taken:
        await world.people.create(NewPerson(login="ACME-admin"), ROOT)
    assert taken.value.status == 409 and taken.value.field == "login"
    made = await world.people.create(NewPerson(login="Eve@Example.com", role="viewer"), ROOT)
    assert made.login == "eve@example.com" and made.role_by_hand


async def test_a_person_sees_themselves_the_staff_and_organisation_admins_see_all(
    world: World,
) -> None:
    member = world.who(world.a.member)
    assert [p.login for p in world.people.listing(member)] == ["acme-member"]
    with pytest.raises(Refusal) as hidden:
        world.people.show(world.b.member.id, member)
    assert hidden.value.status == 404
    assert world.people.show(world.a.member.id, member) == world.a.member
    everyone = {p.login for p in world.people.listing(world.who(world.a.admin))}
    assert {"acme-member", "globex-member"} <= everyone
    assert everyone == {p.login for p in world.people.listing(Principal("v", "viewer", "token"))}


async def test_nobody_takes_their_own_admin_role_away(world: World) -> None:
    boss = await world.people.create(NewPerson(login="boss", role="admin"), ROOT)
    me = world.who(boss)
    for ask in (ChangePerson(role="operator"), ChangePerson(no_role=True)):
        with pytest.raises(Refusal) as refused:
            await world.people.change(boss.id, ask, me)
        assert refused.value.status == 403 and "own admin role" in refused.value.message
    with pytest.raises(Refusal):
        await world.people.change(boss.id, ChangePerson(active=False), me)
    assert world.directory.person(boss.id) == boss
    # Another admin can.
    changed = await world.people.change(boss.id, ChangePerson(role="viewer"), ROOT)
    assert changed.role == "viewer" and changed.role_by_hand


async def test_deactivating_a_person_ends_their_tokens_and_sessions_at_once(
    world: World,
) -> None:
    person = world.a.manager
    _, token = await world.people.new_token(person.id, NewToken(name="ci"), world.who(person))
    sessions = Sessions(b"s" * 32, list)
    gate = Gate(lambda t: False, lambda: None, sessions, world.directory)
    cookie = {"cookie": f"{COOKIE}={sessions.open_person(person.login, person.id)}"}
    bearer = {"authorization": f"Bearer {token}"}
    session = gate.session(request(cookie))
    assert session is not None and session.principal.person == person.id
    assert gate.principal(request(bearer), "member").person == person.id

    await world.people.change(person.id, ChangePerson(active=False), ROOT)
    assert gate.session(request(cookie)) is None
    with pytest.raises(Denied) as denied:
        gate.principal(request(bearer), "member")
    assert denied.value.status == 401
    # Its tokens are revoked in the store too: activated again, the old one stays dead.
    assert all(t.revoked_at is not None for t in world.directory.tokens_of(person.id))
    await world.people.change(person.id, ChangePerson(active=True), ROOT)
    assert world.directory.by_token(token) is None
    assert gate.session(request(cookie)) is not None
    # A deactivated person makes no new token, whatever principal claims to be them.
    await world.people.change(person.id, ChangePerson(active=False), ROOT)
    stale = Principal(person.login, None, "session", person.id)
    with pytest.raises(Refusal) as refused:
        await world.people.new_token(person.id, NewToken(name="x"), stale)
    assert refused.value.status == 403 and "deactivated" in refused.value.message


async def test_a_personal_token_is_made_by_its_person_alone(world: World) -> None:
    person = world.a.member
    for caller in (ROOT, world.who(world.a.admin)):
        with pytest.raises(Refusal) as refused:
            await world.people.new_token(person.id, NewToken(name="x"), caller)
        assert refused.value.status == 403
    record, _ = await world.people.new_token(person.id, NewToken(name="x"), world.who(person))
    with pytest.raises(Refusal):
        world.people.tokens(person.id, world.who(world.a.admin))
    with pytest.raises(Refusal):
        await world.people.revoke_token(person.id, record.id, world.who(world.a.admin))
    # A cluster admin may revoke anyone's.
    revoked = await world.people.revoke_token(person.id, record.id, ROOT)
    assert revoked.revoked_at is not None


def ids(world: World, person_id: str) -> dict[tuple[str, str], tuple[str, bool]]:
    return {
        (m.kind, m.scope_id): (m.role, m.by_hand) for m in world.directory.memberships_of(person_id)
    }


async def test_sign_in_never_lowers_what_an_admin_set_by_hand(world: World) -> None:
    a = world.a
    # A manager of acme by hand, and a cluster operator by hand.
    person = a.manager
    await world.people.change(person.id, ChangePerson(role="operator"), ROOT)
    who = Identity("oidc", f"{IDP}|m", person.login)
    groups = [
        Grant("viewer"),
        Grant("member", "org", a.org.id),
        Grant("member", "team", a.team.id),
    ]
    signed = await world.people.sign_in(who, groups, "oidc")
    assert signed is not None and signed.role == "operator" and signed.subject == f"{IDP}|m"
    assert ids(world, person.id) == {
        ("org", a.org.id): ("manager", True),
        ("team", a.team.id): ("member", False),
    }
    # The groups gone: the hand-set ones stay as they were, the group's one goes.
    signed = await world.people.sign_in(who, [], "oidc")
    assert signed is not None and signed.role == "operator"
    assert ids(world, person.id) == {("org", a.org.id): ("manager", True)}


async def test_sign_in_follows_the_groups_for_what_they_gave(world: World) -> None:
    a, b = world.a, world.b
    who = Identity("oidc", f"{IDP}|new", "Newcomer", name="New Comer")
    groups = [Grant("manager", "team", a.team.id), Grant("viewer")]
    made = await world.people.sign_in(who, groups, "oidc")
    assert made is not None and made.login == "newcomer" and made.source == "oidc"
    assert made.role == "viewer" and not made.role_by_hand
    assert ids(world, made.id) == {("team", a.team.id): ("manager", False)}
    # Moved at the provider to another team, a member there; no cluster role.
    again = await world.people.sign_in(who, [Grant("member", "team", b.team.id)], "oidc")
    assert again is not None and again.id == made.id and again.role is None
    assert ids(world, made.id) == {("team", b.team.id): ("member", False)}
    # A group naming a team that is no more gives nothing.
    await world.orgs.remove_member(b.org.id, made.id, b.team.id, ROOT)
    gone = [Grant("admin", "team", "no-such-team"), Grant("admin", "org", "no-such-org")]
    await world.people.sign_in(who, gone, "oidc")
    assert ids(world, made.id) == {}


async def test_sign_in_raises_a_hand_set_membership_and_an_admin_may_lower_it_again(
    world: World,
) -> None:
    a = world.a
    person = a.member  # a member of acme's team by hand
    who = Identity("ldap", "uid=m,dc=acme", person.login)
    await world.people.sign_in(who, [Grant("admin", "team", a.team.id)], "ldap")
    assert ids(world, person.id)[("team", a.team.id)][0] == "admin"
    await world.orgs.set_member(a.org.id, Member(person.id, "member", a.team.id), ROOT)
    assert ids(world, person.id)[("team", a.team.id)] == ("member", True)


async def test_sign_in_refuses_a_login_of_another_identity_and_a_deactivated_person(
    world: World,
) -> None:
    first = Identity("oidc", f"{IDP}|1", "shared")
    assert await world.people.sign_in(first, [], "oidc") is not None
    with pytest.raises(Refusal) as taken:
        await world.people.sign_in(Identity("oidc", f"{IDP}|2", "shared"), [], "oidc")
    assert taken.value.status == 403
    person = world.directory.by_login("shared")
    assert person is not None
    await world.people.change(person.id, ChangePerson(active=False), ROOT)
    assert await world.people.sign_in(first, [Grant("admin")], "oidc") is None
    unknown = Identity("ldap", "uid=x", "stranger")
    assert await world.people.sign_in(unknown, [], "ldap", create=False) is None
    assert world.directory.by_login("stranger") is None


def test_membership_records_are_plain_values() -> None:
    m = Membership("p", "org", "o", "member")
    assert not m.by_hand and m.created_at == 0.0
