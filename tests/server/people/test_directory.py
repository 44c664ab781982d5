"""The ``Directory``: what every control plane holds of people, loaded from the store;
whom a person acts as (a team's member is a member of its organisation), which
personal tokens are theirs, and a second directory over the same store (another
control plane) seeing a change once it loads."""

from __future__ import annotations

from dataclasses import replace

from llmgw.server.people.asks import ChangePerson, NewToken
from llmgw.server.people.directory import TOKEN_PREFIX, Directory, token_hash
from llmgw.server.store import Audit
from tests.server.people.conftest import NOW, ROOT, World


async def test_lookups_by_login_id_and_subject(world: World) -> None:
    d = world.directory
    member = world.a.member
    assert d.by_login("  ACME-Member ") == member and d.find_person(member.id) == member
    assert d.find_person("acme-member") == member and d.find_person("nobody") is None
    assert d.by_subject("https://idp|42") is None
    linked = replace(member, subject="https://idp|42")
    await world.store.directory.put(linked, Audit("test", "person.update", member.login))
    await d.load()
    assert d.by_subject("https://idp|42") == linked
    assert {t.name for t in d.teams_of(world.a.org.id)} == {"research"}
    assert d.projects_of(world.a.org.id, world.b.team.id) == []
    assert [m.scope_id for m in d.members("team", world.a.team.id)] == [world.a.team.id]


async def test_a_team_member_acts_as_a_member_of_its_organisation_and_no_other(
    world: World,
) -> None:
    who = world.who(world.a.member)
    assert who.name == "acme-member" and who.role is None and who.person == world.a.member.id
    assert dict(who.orgs) == {world.a.org.id: "member"}
    assert dict(who.teams) == {world.a.team.id: "member"}
    admin = world.who(world.a.admin)
    assert dict(admin.orgs) == {world.a.org.id: "admin"} and dict(admin.teams) == {}


async def test_a_personal_token_acts_as_its_person_until_revoked_or_expired(
    world: World,
) -> None:
    d, person = world.directory, world.a.manager
    record, token = await world.people.new_token(
        person.id, NewToken(name="laptop", days=1), world.who(person)
    )
    assert token.startswith(TOKEN_PREFIX) and record.token_hash == token_hash(token)
    found = d.by_token(token)
    assert found is not None and found.person == person.id and found.via == "token"
    assert d.by_token(token + "x") is None and d.by_token("sk-llmgw-" + token) is None
    # A day on, it is expired.
    d.clock = lambda: NOW + 86400
    assert d.by_token(token) is None
    d.clock = lambda: NOW
    await world.people.revoke_token(person.id, record.id, world.who(person))
    assert d.by_token(token) is None


async def test_another_control_plane_refuses_a_deactivated_person_once_it_loads(
    world: World,
) -> None:
    person = world.a.member
    _, token = await world.people.new_token(person.id, NewToken(name="ci"), world.who(person))
    standby = Directory(world.store, clock=lambda: NOW)
    await standby.load()
    assert standby.by_token(token) is not None
    assert standby.session_principal(person.id) is not None
    await world.people.change(person.id, ChangePerson(active=False), ROOT)
    await standby.load()
    assert standby.by_token(token) is None and standby.session_principal(person.id) is None
