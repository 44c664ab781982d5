"""People made on a real control plane, as the services make them, each with a
personal token for calling its admin API as them."""

from __future__ import annotations

from llmgw.server.app import ControlPlane
from llmgw.server.people.asks import Member, NewPerson, NewToken
from llmgw.server.people.records import Person
from llmgw.server.principal import OrgRole, Principal, Role

SETUP = Principal.system("tests")


async def person_with_token(
    cp: ControlPlane,
    login: str,
    role: Role | None = None,
    member_of: tuple[tuple[str, OrgRole, str | None], ...] = (),
) -> tuple[Person, str]:
    """A person with a cluster ``role`` (or none) and memberships (organisation, role,
    team or None), and a personal token they made themselves."""
    person = await cp.people.create(NewPerson(login=login, role=role), SETUP)
    for org, org_role, team in member_of:
        await cp.orgs.set_member(org, Member(person.id, org_role, team), SETUP)
    who = cp.directory.session_principal(person.id)
    assert who is not None
    _, token = await cp.people.new_token(person.id, NewToken(name="tests"), who)
    return person, token
