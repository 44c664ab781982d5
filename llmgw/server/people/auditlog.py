"""The audit log as a service: who may read which entries, checked once.

Every change the control plane makes is written with an entry naming its actor (a
person's login, ``admin@HOST`` for the admin token, or the control plane's own work such
as ``reconciler``) and, for a change made in an organisation, that organisation's id.
The cluster's staff (``viewer`` and up) read every entry; an organisation's managers and
admins read that organisation's alone, so they must name it; anyone else reads none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmgw.server.people import rights
from llmgw.server.people.directory import Directory
from llmgw.server.people.orgs import OrgService
from llmgw.server.people.service import NO_SUCH_PERSON, refuse
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.store import Store
from llmgw.wire.admin import AuditEntryJson

# The admin token's holder is written as admin@HOST (its client's address).
ADMIN_ACTOR = "admin@"


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: float
    actor: str
    action: str
    target: str
    detail: str
    org_id: str | None


def _entry(row: dict[str, Any]) -> AuditEntry:
    org = row.get("org_id")
    return AuditEntry(
        id=int(row["id"]),
        at=float(row["at"]),
        actor=str(row["actor"]),
        action=str(row["action"]),
        target=str(row["target"]),
        detail=str(row["detail"] or ""),
        org_id=None if org is None else str(org),
    )


def entry_json(e: AuditEntry) -> AuditEntryJson:
    return {
        "id": e.id,
        "at": e.at,
        "actor": e.actor,
        "action": e.action,
        "target": e.target,
        "detail": e.detail,
        "org_id": e.org_id,
    }


class AuditLog:
    def __init__(self, store: Store, directory: Directory, orgs: OrgService) -> None:
        self.store = store
        self.directory = directory
        self.orgs = orgs

    def actor(self, ref: str) -> str:
        """The actor a ``person`` filter names: a person (id or login) as their login, or
        ``admin@HOST`` as it is."""
        person = self.directory.find_person(ref)
        if person is not None:
            return person.login
        if ref.startswith(ADMIN_ACTOR):
            return ref
        raise Refusal(404, "not_found", NO_SUCH_PERSON)

    async def entries(
        self,
        by: Principal,
        org: str | None = None,
        person: str | None = None,
        since: float | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """The newest ``limit`` entries the caller may read, filtered as asked."""
        org_id: str | None = None
        if org is not None:
            found = self.orgs.org(org, by)  # 404 for one the caller may not see
            if not rights.reads_org(by, found.id):
                raise refuse(f"reading {found.name}'s audit needs its manager or admin role")
            org_id = found.id
        elif not by.may("viewer"):
            raise Refusal(
                400,
                "bad_request",
                "org: name the organisation whose audit to read (`--org`); the whole "
                "cluster's needs the cluster's viewer role",
                "org",
            )
        actor = None if person is None else self.actor(person)
        rows = await self.store.audit_log(limit, org_id=org_id, actor=actor, since=since)
        return [_entry(r) for r in rows]
