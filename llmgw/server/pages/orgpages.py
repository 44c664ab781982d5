"""The Organisations pages (``/admin/org``): the organisations a caller belongs to (every
one, for the cluster's staff), and one organisation's teams, projects, members and keys,
with the forms its admins and managers send.

Every page is open to anyone signed in (``member``); ``OrgService`` and ``KeyService``
say what each caller sees and refuse what they may not change. Which form a page draws
is asked of ``rights`` (and of ``KeyService.manages`` for a key), never decided here: a
member sees teams, projects and their own keys; a manager also every key of the
organisation (or team) and its usage; an admin also changes teams, projects and
members' roles and makes project keys.

``key_owners`` and ``key_body`` are the key form's owner field (a project the caller
manages the keys of, or a key of their own in one of their organisations), shared with
the Keys page.
"""

from __future__ import annotations

from typing import TypedDict

from starlette.responses import RedirectResponse, Response

from llmgw.server import schema
from llmgw.server.gateway.keyservice import key_json
from llmgw.server.pages.frame import Frame, Page, PageCall, Services, form_body
from llmgw.server.people import rights
from llmgw.server.people.asks import Member, NewOrg, NewProject, NewTeam
from llmgw.server.people.directory import Directory
from llmgw.server.people.records import Org
from llmgw.server.people.views import membership_json, org_json, project_json, team_json
from llmgw.server.principal import ORG_ROLES, Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import CreateKey
from llmgw.server.store import ApiKeyRecord
from llmgw.wire.admin import KeyJson, MembershipJson, OrgJson, ProjectJson, TeamJson


class KeyOwner(TypedDict):
    """One choice of the key form's owner field: ``project:ID`` or ``personal:ORG``."""

    value: str
    label: str


class KeyRow(KeyJson):
    owner: str
    month_tokens: int | None
    # Whether the caller may revoke it (``KeyService.manages``).
    revokes: bool


class TeamRow(TeamJson):
    changes: bool


class MemberRow(MembershipJson):
    removes: bool


class Scope(TypedDict):
    """Where a membership form may put someone: the organisation ("") or a team."""

    value: str
    label: str


class OrgPage(TypedDict):
    org: OrgJson
    teams: list[TeamRow]
    projects: list[ProjectJson]
    members: list[MemberRow]
    keys: list[KeyRow]
    # The forms the caller may send, each by what it offers.
    makes_team: bool
    project_teams: list[TeamJson]
    member_scopes: list[Scope]
    key_owners: list[KeyOwner]
    reads_usage: bool


def owner_label(record: ApiKeyRecord, directory: Directory) -> str:
    """``ORG / TEAM/PROJECT`` or ``ORG / login``, by names where they are known."""
    now = directory.now
    org = now.orgs.get(record.org_id or "")
    where = org.name if org else (record.org_id or "—")
    if record.person_id is not None:
        person = now.people.get(record.person_id)
        return f"{where} / {person.login if person else record.person_id}"
    project = now.projects.get(record.project_id or "")
    if project is None:
        return where
    team = now.teams.get(project.team_id)
    return f"{where} / {team.name if team else '?'}/{project.name}"


def key_rows(services: Services, by: Principal, org_id: str | None = None) -> list[KeyRow]:
    """The keys the caller sees (of one organisation, when named), newest first."""
    keys, directory = services.keys, services.people.directory
    out: list[KeyRow] = []
    for r in sorted(keys.records(by), key=lambda r: -r.created_at):
        if org_id is not None and r.org_id != org_id:
            continue
        row: KeyRow = {
            **key_json(r),
            "owner": owner_label(r, directory),
            "month_tokens": keys.month_tokens(r.id),
            "revokes": keys.manages(by, r),
        }
        out.append(row)
    return out


def key_owners(directory: Directory, by: Principal, org_id: str | None = None) -> list[KeyOwner]:
    """Whose a key the caller makes may be: each project whose keys they manage, and
    themselves in each organisation where they may have a key of their own."""
    now = directory.now
    orgs = [o for o in now.orgs.values() if org_id is None or o.id == org_id]
    out: list[KeyOwner] = []
    for org in sorted(orgs, key=lambda o: o.name):
        for p in sorted(directory.projects_of(org.id), key=lambda p: p.name):
            if rights.manages_keys(by, p):
                team = now.teams.get(p.team_id)
                label = f"{org.name} / {team.name if team else '?'}/{p.name}"
                out.append({"value": f"project:{p.id}", "label": label})
        if rights.makes_personal_key(by, org.id):
            out.append({"value": f"personal:{org.id}", "label": f"{org.name} / {by.name}"})
    return out


def key_body(form: dict[str, str]) -> dict[str, object]:
    """The API's body of a key from the key form, its owner read from ``owner``."""
    body = form_body(form, texts=("expires",), numbers=("rpm", "tpm", "budget"))
    body["name"] = form.get("name", "")
    body["models"] = [p.strip() for p in form.get("models", "").split(",") if p.strip()]
    owner = form.get("owner", "").strip()
    kind, _, ident = owner.partition(":")
    if kind == "project" and ident:
        body["project"] = ident
    elif kind == "personal" and ident:
        body["org"] = ident
        body["personal"] = True
    elif owner:
        raise Refusal(
            400, "bad_request", f"owner: {owner[:60]!r} is no project or personal key", "owner"
        )
    return body


def org_page(services: Services, org: Org, by: Principal) -> OrgPage:
    directory = services.people.directory
    orgs = services.orgs
    teams = sorted(directory.teams_of(org.id), key=lambda t: t.name)
    team_by_id = {t.id: t for t in teams}
    members: list[MemberRow] = []
    for m in orgs.members(org.id, by):
        team = team_by_id.get(m.scope_id) if m.kind == "team" else None
        removes = rights.changes_team(by, team) if team else rights.changes_org(by, org.id)
        members.append({**membership_json(m, directory), "removes": removes})
    members.sort(key=lambda m: (m["login"] or "", m["kind"], m["scope_name"] or ""))
    scopes: list[Scope] = []
    if rights.changes_org(by, org.id):
        scopes.append({"value": "", "label": org.name})
    scopes += [{"value": t.id, "label": t.name} for t in teams if rights.changes_team(by, t)]
    projects = sorted(
        directory.projects_of(org.id),
        key=lambda p: (team_by_id[p.team_id].name if p.team_id in team_by_id else "", p.name),
    )
    return {
        "org": org_json(org),
        "teams": [{**team_json(t), "changes": rights.changes_team(by, t)} for t in teams],
        "projects": [project_json(p, directory) for p in projects],
        "members": members,
        "keys": key_rows(services, by, org.id),
        "makes_team": rights.changes_org(by, org.id),
        "project_teams": [team_json(t) for t in teams if rights.changes_team(by, t)],
        "member_scopes": scopes,
        "key_owners": key_owners(directory, by, org.id),
        # The organisation's usage, or of a team they manage (the service shows which).
        "reads_usage": any(rights.reads_team(by, t) for t in teams) or rights.reads_org(by, org.id),
    }


def pages(frame: Frame, services: Services) -> list[Page]:
    orgs, keys, people = services.orgs, services.keys, services.people

    async def listing(call: PageCall) -> Response:
        by = call.principal
        return frame.render(
            call.request,
            "orgs.html",
            call.session,
            orgs=[org_json(o) for o in orgs.listing(by)],
            makes_org=rights.makes_orgs(by),
        )

    async def create_org(call: PageCall) -> Response:
        made = await orgs.create_org(
            schema.read(NewOrg, {"name": call.form.get("name", "")}), call.principal
        )
        return RedirectResponse(f"/admin/org/{made.id}", status_code=303)

    async def show(call: PageCall, made: dict[str, str] | None = None) -> Response:
        by = call.principal
        org = orgs.org(str(call.params["org"]), by)
        shown = org_page(services, org, by)
        # People to pick from for a membership: those the caller may list.
        logins = [p.login for p in people.listing(by) if p.active] if shown["member_scopes"] else []
        return frame.render(
            call.request,
            "org.html",
            call.session,
            made=made,
            logins=logins,
            org_roles=ORG_ROLES,
            **shown,
        )

    async def org_page_view(call: PageCall) -> Response:
        return await show(call)

    def back(call: PageCall) -> Response:
        return RedirectResponse(f"/admin/org/{call.params['org']}", status_code=303)

    async def create_team(call: PageCall) -> Response:
        ask = schema.read(NewTeam, {"name": call.form.get("name", "")})
        await orgs.create_team(str(call.params["org"]), ask, call.principal)
        return back(call)

    async def remove_team(call: PageCall) -> Response:
        p = call.params
        await orgs.remove_team(str(p["org"]), str(p["team"]), call.principal)
        return back(call)

    async def create_project(call: PageCall) -> Response:
        body = {"name": call.form.get("name", ""), "team": call.form.get("team", "")}
        await orgs.create_project(
            str(call.params["org"]), schema.read(NewProject, body), call.principal
        )
        return back(call)

    async def remove_project(call: PageCall) -> Response:
        p = call.params
        await orgs.remove_project(str(p["org"]), str(p["project"]), call.principal, keys.keys_in)
        return back(call)

    async def set_member(call: PageCall) -> Response:
        form = call.form
        body: dict[str, object] = {
            "person": form.get("person", "").strip(),
            "role": form.get("role", "member"),
        }
        if form.get("team", "").strip():
            body["team"] = form["team"].strip()
        await orgs.set_member(str(call.params["org"]), schema.read(Member, body), call.principal)
        return back(call)

    async def remove_member(call: PageCall) -> Response:
        p = call.params
        team = call.form.get("team", "").strip() or None
        await orgs.remove_member(str(p["org"]), str(p["person"]), team, call.principal)
        return back(call)

    async def create_key(call: PageCall) -> Response:
        org = orgs.org(str(call.params["org"]), call.principal)
        body = key_body(call.form)
        if body.get("personal"):
            # A personal key from this organisation's page is in this organisation.
            body["org"] = org.id
        elif "project" in body:
            # A project id of another organisation is not found here.
            orgs.project(org, str(body["project"]))
        record, key = await keys.create(schema.read(CreateKey, body), call.principal)
        return await show(call, made={"name": record.name, "id": record.id, "key": key})

    async def revoke_key(call: PageCall) -> Response:
        org = orgs.org(str(call.params["org"]), call.principal)
        record = keys.find(str(call.params["key_id"]), call.principal)
        if record.org_id != org.id:
            raise Refusal(404, "not_found", f"{org.name} has no key {record.id}")
        await keys.revoke(record.id, call.principal)
        return back(call)

    base = "/admin/org/{org}"
    return [
        Page("GET", "/admin/org", listing, role="member"),
        Page("POST", "/admin/org", create_org, role="member"),
        Page("GET", base, org_page_view, role="member"),
        Page("POST", f"{base}/teams", create_team, role="member"),
        Page("POST", f"{base}/teams/{{team}}/remove", remove_team, role="member"),
        Page("POST", f"{base}/projects", create_project, role="member"),
        Page("POST", f"{base}/projects/{{project}}/remove", remove_project, role="member"),
        Page("POST", f"{base}/members", set_member, role="member"),
        Page("POST", f"{base}/members/{{person}}/remove", remove_member, role="member"),
        Page("POST", f"{base}/keys", create_key, role="member"),
        Page("POST", f"{base}/keys/{{key_id}}/revoke", revoke_key, role="member"),
    ]
