"""SCIM's User and Group documents as llmgw answers them, and the ``attributes`` and
``excludedAttributes`` a request may narrow them with (RFC 7644 3.4.2.5: ``id`` and
``schemas`` always come back)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from llmgw.server.people.records import Person
from llmgw.server.scim.discovery import Doc
from llmgw.server.scim.paths import GROUP, USER, bare
from llmgw.server.scim.records import ScimGroup

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
