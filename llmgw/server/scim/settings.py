"""SCIM's sign-in settings: its own bearer token and the map of the provider's groups to
memberships, one JSON document in the store's settings (``auth.scim``), read by every
control plane (again when a standby's store changes).

The token is the provider's alone (not the admin token, not a person's): made by
``ctl auth scim token``, shown once, kept as its SHA-256; a new one replaces it at once,
``ctl auth scim off`` ends it. A map is ``GROUP=ORG[/TEAM]:ROLE`` (a role in an
organisation or team: member, manager, admin) or ``GROUP=cluster:ROLE`` (a cluster
role: viewer, operator, admin), organisations and teams named by name and kept by id,
so renaming one keeps its maps. Every change is an admin's, audited without the token.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from llmgw.server.people.directory import Directory
from llmgw.server.principal import Principal, is_org_role, is_role
from llmgw.server.refusal import Refusal
from llmgw.server.schema import Spec, spec
from llmgw.server.scim.records import ScimMap, ScimSettings
from llmgw.server.store import Store

SETTING = "auth.scim"
# What SCIM's token starts with, so a leaked one is recognised.
TOKEN_PREFIX = "llmgw-scim-"
MAP_WORDS = (
    "GROUP=ORG[/TEAM]:ROLE (member, manager, admin) or GROUP=cluster:ROLE (viewer, operator, admin)"
)


@dataclass(frozen=True)
class ScimMaps:
    """Every map of SCIM's groups, all at once (none: groups give nothing)."""

    maps: tuple[str, ...] = spec(
        (),
        doc="GROUP=ORG[/TEAM]:ROLE (member, manager, admin) or GROUP=cluster:ROLE "
        "(viewer, operator, admin)",
        max_items=256,
        items=Spec(min_length=3, max_length=300),
    )


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _same(a: str, b: str) -> bool:
    return a.strip().casefold() == b.strip().casefold()


def _refuse(why: str) -> Refusal:
    return Refusal(403, "forbidden", why)


def decode(raw: str | None) -> ScimSettings:
    doc = json.loads(raw) if raw else {}
    maps = tuple(
        ScimMap(str(m["group"]), m["kind"], str(m["scope_id"]), m["role"])
        for m in doc.get("maps", [])
        if m.get("kind") in ("cluster", "org", "team")
        and (is_role(str(m.get("role"))) or is_org_role(str(m.get("role"))))
    )
    made = doc.get("token_made_at")
    return ScimSettings(
        token_hash=doc.get("token_hash") or None,
        token_made_at=float(made) if isinstance(made, int | float) else None,
        maps=maps,
    )


def encode(settings: ScimSettings) -> str:
    return json.dumps(
        {
            "token_hash": settings.token_hash,
            "token_made_at": settings.token_made_at,
            "maps": [
                {"group": m.group, "kind": m.kind, "scope_id": m.scope_id, "role": m.role}
                for m in settings.maps
            ],
        },
        sort_keys=True,
    )


class ScimAuth:
    def __init__(
        self,
        store: Store,
        directory: Directory,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.directory = directory
        self.clock = clock
        self.now = ScimSettings()

    async def load(self) -> None:
        self.now = decode(await self.store.get_setting(SETTING))

    def token_ok(self, token: str) -> bool:
        """Whether ``token`` is SCIM's token (never when SCIM is off)."""
        kept = self.now.token_hash
        return kept is not None and hmac.compare_digest(_hash(token), kept)

    async def _save(self, settings: ScimSettings, by: Principal, action: str, detail: str) -> None:
        await self.store.put_setting(SETTING, encode(settings))
        await self.store.audit(by.name, action, SETTING, detail)
        self.now = settings

    async def new_token(self, by: Principal) -> str:
        """A new token, shown once; the one before ends at once."""
        if not by.may("admin"):
            raise _refuse("SCIM's token is made by a cluster admin")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        settings = replace(self.now, token_hash=_hash(token), token_made_at=self.clock())
        await self._save(settings, by, "scim.token", "a new token; the one before ends")
        return token

    async def off(self, by: Principal) -> None:
        """SCIM refused from now on (the maps are kept for a new token)."""
        if not by.may("admin"):
            raise _refuse("SCIM is turned off by a cluster admin")
        await self._save(
            replace(self.now, token_hash=None, token_made_at=None), by, "scim.off", "token ended"
        )

    async def set_maps(self, maps: Sequence[str], by: Principal) -> tuple[ScimMap, ...]:
        """The groups' map, all of it (none: no group gives anything)."""
        if not by.may("admin"):
            raise _refuse("SCIM's group map is set by a cluster admin")
        parsed = tuple(self.parse_map(m) for m in maps)
        await self._save(
            replace(self.now, maps=parsed), by, "scim.map", "; ".join(maps) or "no maps"
        )
        return parsed

    def parse_map(self, text: str) -> ScimMap:
        """``GROUP=ORG[/TEAM]:ROLE`` or ``GROUP=cluster:ROLE``, names checked to exist."""
        group, eq, rest = text.partition("=")
        target, colon, role = rest.rpartition(":")
        group, target, role = group.strip(), target.strip(), role.strip()
        if not eq or not colon or not group or not target:
            raise Refusal(400, "bad_request", f"maps: {text!r} is not {MAP_WORDS}", "maps")
        if target == "cluster":
            if not is_role(role):
                raise Refusal(
                    400,
                    "bad_request",
                    f"maps: {text!r}: a cluster role is viewer, operator or admin",
                    "maps",
                )
            return ScimMap(group, "cluster", "", role)
        if not is_org_role(role):
            raise Refusal(
                400,
                "bad_request",
                f"maps: {text!r}: a role in an organisation or team is member, manager or admin",
                "maps",
            )
        org_name, _, team_name = target.partition("/")
        now = self.directory.now
        org = next((o for o in now.orgs.values() if _same(o.name, org_name)), None)
        if org is None:
            raise Refusal(
                400,
                "bad_request",
                f"maps: {text!r}: no organisation {org_name!r}; see `llmgw ctl orgs list`",
                "maps",
            )
        if not team_name:
            return ScimMap(group, "org", org.id, role)
        team = next((t for t in self.directory.teams_of(org.id) if _same(t.name, team_name)), None)
        if team is None:
            raise Refusal(
                400, "bad_request", f"maps: {text!r}: {org_name} has no team {team_name!r}", "maps"
            )
        return ScimMap(group, "team", team.id, role)

    def shown(self, m: ScimMap) -> str:
        """A map as ``ctl auth scim map`` takes it, by today's names."""
        now = self.directory.now
        if m.kind == "cluster":
            target = "cluster"
        elif m.kind == "org":
            org = now.orgs.get(m.scope_id)
            target = org.name if org else f"(gone: {m.scope_id})"
        else:
            team = now.teams.get(m.scope_id)
            org = now.orgs.get(team.org_id) if team else None
            target = f"{org.name}/{team.name}" if team and org else f"(gone: {m.scope_id})"
        return f"{m.group}={target}:{m.role}"
