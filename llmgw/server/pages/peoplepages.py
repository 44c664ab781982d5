"""The People pages: everyone a caller may see, one person (their cluster role,
memberships and personal tokens), and the forms that make, change and deactivate people
and make and revoke personal tokens.

Every page is open to anyone signed in (``member``): ``PeopleService`` says whom each
caller sees (the cluster's staff and organisations' admins everyone, anyone else
themselves) and refuses a change the caller may not make. A form is drawn only for a
caller ``rights`` says may send it; a form sent anyway is refused by the service.
"""

from __future__ import annotations

from typing import TypedDict

from starlette.responses import RedirectResponse, Response

from llmgw.server import schema
from llmgw.server.pages.frame import Frame, Page, PageCall, Services
from llmgw.server.people import rights
from llmgw.server.people.asks import ChangePerson, NewPerson, NewToken
from llmgw.server.people.views import membership_json, person_json, token_json
from llmgw.server.principal import ROLES, Principal
from llmgw.server.refusal import Refusal
from llmgw.wire.admin import MembershipJson, PersonJson, PersonTokenJson

# The role field of the forms: no cluster role, or one of ``ROLES``.
NO_ROLE = "none"


class PersonPage(TypedDict):
    """What the person page draws, and which of its forms the caller may send."""

    person: PersonJson
    memberships: list[MembershipJson]
    # None: the caller may not see them.
    tokens: list[PersonTokenJson] | None
    changes: bool
    makes_token: bool
    revokes_tokens: bool


def role_field(text: str) -> dict[str, object]:
    """A form's role as the API's body: ``none`` takes the role away; blank keeps it."""
    text = text.strip()
    if not text:
        return {}
    if text == NO_ROLE:
        return {"no_role": True}
    if text not in ROLES:
        raise Refusal(400, "bad_request", f"role: {text!r} is not none, {', '.join(ROLES)}", "role")
    return {"role": text}


def person_page(services: Services, ref: str, by: Principal) -> PersonPage:
    people = services.people
    person = people.show(ref, by)
    directory = people.directory
    sees = rights.sees_tokens(by, person.id)
    return {
        "person": person_json(person),
        "memberships": [membership_json(m, directory) for m in directory.memberships_of(person.id)],
        "tokens": [token_json(t) for t in people.tokens(person.id, by)] if sees else None,
        "changes": rights.manages_people(by),
        "makes_token": rights.makes_token(by, person.id) and person.active,
        "revokes_tokens": sees,
    }


def pages(frame: Frame, services: Services) -> list[Page]:
    people = services.people

    async def listing(call: PageCall) -> Response:
        by = call.principal
        return frame.render(
            call.request,
            "people.html",
            call.session,
            people=[person_json(p) for p in people.listing(by)],
            creates=rights.manages_people(by),
            roles=ROLES,
            me=by.person,
        )

    async def create(call: PageCall) -> Response:
        form = call.form
        body: dict[str, object] = {
            "login": form.get("login", "").strip(),
            "name": form.get("name", ""),
            "email": form.get("email", ""),
        }
        role = role_field(form.get("role", ""))
        body["role"] = role.get("role")
        person = await people.create(schema.read(NewPerson, body), call.principal)
        return RedirectResponse(f"/admin/people/{person.id}", status_code=303)

    async def show(call: PageCall, made: dict[str, str] | None = None) -> Response:
        shown = person_page(services, str(call.params["person"]), call.principal)
        return frame.render(
            call.request, "person.html", call.session, made=made, roles=ROLES, **shown
        )

    async def person(call: PageCall) -> Response:
        return await show(call)

    async def change(call: PageCall) -> Response:
        # As the API's route: the service finds them and decides.
        found = people.find(str(call.params["person"]))
        form = call.form
        body: dict[str, object] = {}
        for name in ("name", "email"):
            if name in form:
                body[name] = form[name]
        asked = role_field(form.get("role", ""))
        # The role as it is, sent back unchanged, is not a change of role (which an
        # admin's hand would then pin).
        if asked and asked.get("role") != found.role:
            body.update(asked)
        changed = await people.change(found.id, schema.read(ChangePerson, body), call.principal)
        return RedirectResponse(f"/admin/people/{changed.id}", status_code=303)

    async def active(call: PageCall) -> Response:
        # As the API's route: the service finds them and decides.
        found = people.find(str(call.params["person"]))
        wanted = call.form.get("active", "")
        if wanted not in ("true", "false"):
            raise Refusal(400, "bad_request", "active: send true or false", "active")
        ask = ChangePerson(active=wanted == "true")
        changed = await people.change(found.id, ask, call.principal)
        return RedirectResponse(f"/admin/people/{changed.id}", status_code=303)

    async def new_token(call: PageCall) -> Response:
        body: dict[str, object] = {"name": call.form.get("name", "").strip()}
        days = call.form.get("days", "").strip()
        if days:
            if not days.isdigit():
                raise Refusal(400, "bad_request", f"days: {days!r} is not a whole number", "days")
            body["days"] = int(days)
        ref = str(call.params["person"])
        record, token = await people.new_token(ref, schema.read(NewToken, body), call.principal)
        # The token is in this one answer and nowhere else: never in a redirect.
        return await show(call, made={"name": record.name, "token": token})

    async def revoke_token(call: PageCall) -> Response:
        ref = str(call.params["person"])
        await people.revoke_token(ref, str(call.params["token_id"]), call.principal)
        return RedirectResponse(f"/admin/people/{ref}", status_code=303)

    return [
        Page("GET", "/admin/people", listing, role="member"),
        Page("POST", "/admin/people", create, role="member"),
        Page("GET", "/admin/people/{person}", person, role="member"),
        Page("POST", "/admin/people/{person}", change, role="member"),
        Page("POST", "/admin/people/{person}/active", active, role="member"),
        Page("POST", "/admin/people/{person}/tokens", new_token, role="member"),
        Page(
            "POST",
            "/admin/people/{person}/tokens/{token_id}/revoke",
            revoke_token,
            role="member",
        ),
    ]
