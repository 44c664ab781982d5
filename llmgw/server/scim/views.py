"""SCIM's User and Group documents as llmgw answers them, and the ``attributes`` and
``excludedAttributes`` a request may narrow them with (RFC 7644 3.4.2.5: ``id`` and
``schemas`` always come back); SCIM's settings as the admin API and pages show them
(never the token or its hash)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from llmgw.server.people.records import Person
from llmgw.server.scim.discovery import Doc
from llmgw.server.scim.paths import GROUP, USER, bare
from llmgw.server.scim.records import ScimGroup
from llmgw.server.scim.service import Page, ScimService
from llmgw.wire.admin.scim import ScimJson

ALWAYS = ("id", "schemas")


def stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _meta(kind: str, location: str, created: float, modified: float) -> Doc:
    return {
        "resourceType": kind,
        "created": stamp(created),
        "lastModified": stamp(max(created, modified)),
        "location": location,
    }


def user_json(
    person: Person, external_id: str | None, groups: Sequence[ScimGroup], base: str
) -> Doc:
    doc: Doc = {"schemas": [USER], "id": person.id}
    if external_id is not None:
        doc["externalId"] = external_id
    doc["userName"] = person.login
    if person.name:
        doc["displayName"] = person.name
    if person.email:
        doc["emails"] = [{"value": person.email}]
    doc["active"] = person.active
    if groups:
        doc["groups"] = [
            {"value": g.id, "$ref": f"{base}/Groups/{g.id}", "display": g.name} for g in groups
        ]
    location = f"{base}/Users/{person.id}"
    doc["meta"] = _meta("User", location, person.created_at, person.updated_at)
    return doc


def group_json(group: ScimGroup, base: str) -> Doc:
    doc: Doc = {"schemas": [GROUP], "id": group.id}
    if group.external_id is not None:
        doc["externalId"] = group.external_id
    doc["displayName"] = group.name
    if group.members:
        doc["members"] = [{"value": m, "$ref": f"{base}/Users/{m}"} for m in group.members]
    location = f"{base}/Groups/{group.id}"
    doc["meta"] = _meta("Group", location, group.created_at, group.updated_at)
    return doc


def names(text: str | None) -> set[str]:
    """``attributes=a,b.c`` as the top-level attributes it names, lower-cased."""
    if not text:
        return set()
    return {bare(part.strip()).split(".")[0] for part in text.split(",") if part.strip()}


def narrowed(doc: Doc, attributes: set[str], excluded: set[str]) -> Doc:
    if attributes:
        return {k: v for k, v in doc.items() if k in ALWAYS or k.lower() in attributes}
    if excluded:
        return {k: v for k, v in doc.items() if k in ALWAYS or k.lower() not in excluded}
    return doc


def settings_json(scim: ScimService) -> ScimJson:
    """On or off, the endpoint, the maps by today's names, how many users and groups."""
    auth = scim.auth.now
    return {
        "token": "set" if auth.token_hash else None,
        "token_made_at": auth.token_made_at,
        "endpoint": "/scim/v2",
        "maps": [scim.auth.shown(m) for m in auth.maps],
        # As /Users counts them: every person but those the provider DELETEd.
        "users": scim.users_listed((), Page(1, 0))[1],
        "groups": len(scim.groups),
    }
