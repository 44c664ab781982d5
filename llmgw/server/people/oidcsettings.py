"""The cluster's OpenID Connect sign-in settings, as a service: one JSON document in the
store's settings (``auth.oidc``), its client secret sealed with the cluster's key, read
by every control plane (again whenever a standby's store changes) and set only by a
cluster admin (``ctl auth oidc set|show|off``, ``ctl auth entra set``).

Microsoft Entra ID is OIDC from a tenant: its issuer is
``https://login.microsoftonline.com/<tenant>/v2.0``.

A group map says what one of the provider's groups gives at sign-in: ``GROUP=cluster:ROLE``
a cluster role (viewer, operator, admin), ``GROUP=ORG:ROLE`` or ``GROUP=ORG/TEAM:ROLE`` a
role in an organisation or team (member, manager, admin). The organisation and team are
named by name when set, checked to exist, and kept by id, so renaming one keeps its map.

The client secret is never shown back and never logged: ``show`` says ``"set"``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmgw import pki
from llmgw.server.people.directory import Directory
from llmgw.server.people.service import Grant
from llmgw.server.principal import (
    ORG_ROLES,
    ROLES,
    OrgRole,
    Principal,
    Role,
    is_org_role,
    is_role,
)
from llmgw.server.refusal import Refusal
from llmgw.server.schema import Spec, spec
from llmgw.server.store import Store
from llmgw.wire.admin import GroupMapJson, OidcJson, OidcKind

log = logging.getLogger("llmgw.signin")

SETTING = "auth.oidc"
ENTRA_ISSUER = "https://login.microsoftonline.com/{tenant}/v2.0"
DEFAULT_SCOPES = ("openid", "profile", "email")
MAP_FORM = "GROUP=cluster:ROLE, GROUP=ORG:ROLE or GROUP=ORG/TEAM:ROLE"
TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,99}")
CLAIM = re.compile(r"[A-Za-z0-9_:/.-]{1,100}")
SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,100}")


@dataclass(frozen=True)
class OidcSet:
    """Sign in with an OpenID Connect provider (``kind`` oidc: its ``issuer``), or with
    Microsoft Entra ID (``kind`` entra: its ``tenant``)."""

    client_id: str = spec(doc="the client (application) id at the provider", max_length=256)
    client_secret: str = spec(
        doc="the client's secret: sealed in the store, never shown back", max_length=4096
    )
    kind: OidcKind = spec("oidc", doc="oidc, or entra (Microsoft Entra ID)")
    issuer: str = spec("", doc="the provider's issuer URL (kind oidc)", max_length=512)
    tenant: str = spec(
        "",
        doc="the Entra tenant's id or domain (kind entra)",
        pattern=TENANT,
        pattern_doc="letters, digits, '.' or '-'",
        max_length=100,
    )
    groups_claim: str = spec(
        "groups",
        doc="the ID token's claim that lists the person's groups",
        pattern=CLAIM,
        pattern_doc="letters, digits, '_', ':', '/', '.' or '-'",
    )
    scopes: tuple[str, ...] = spec(
        DEFAULT_SCOPES,
        doc="the scopes asked for (openid is always asked)",
        max_items=20,
        items=Spec(pattern=SCOPE, pattern_doc="a scope's characters", max_length=100),
    )
    maps: tuple[str, ...] = spec(
        (),
        doc=f"what each group gives: {MAP_FORM}",
        max_items=500,
        items=Spec(min_length=3, max_length=300),
    )
    name: str = spec("", doc="what the sign-in button names (default: from the issuer)")


@dataclass(frozen=True)
class GroupMap:
    """One group and what it gives: ``kind`` cluster (``scope_id`` empty), org or team."""

    group: str
    kind: str
    scope_id: str
    role: OrgRole | Role


@dataclass(frozen=True)
class Oidc:
    """The settings in force (the secret still sealed)."""

    kind: OidcKind
    issuer: str
    client_id: str
    sealed_secret: str
    groups_claim: str
    scopes: tuple[str, ...]
    maps: tuple[GroupMap, ...]
    name: str
    updated_at: float


def refuse(field: str, why: str) -> Refusal:
    return Refusal(400, "bad_request", f"{field}: {why}", field)


def checked_issuer(issuer: str) -> str:
    issuer = issuer.strip().rstrip("/")
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", issuer):
        raise refuse("issuer", f"{issuer!r} is not a URL like https://idp.example.com/realm")
    if issuer.startswith("http://") and not re.match(
        r"http://(127\.|localhost[:/]|\[::1\])", issuer
    ):
        raise refuse("issuer", "use https (plain http only to a provider on this machine)")
    return issuer


def default_name(kind: OidcKind, issuer: str) -> str:
    if kind == "entra":
        return "Microsoft"
    return issuer.split("://", 1)[1].split("/", 1)[0]


class OidcSettings:
    """Reads, sets and turns off OIDC sign-in; hands the sign-in flow what it needs."""

    def __init__(
        self,
        store: Store,
        directory: Directory,
        cluster_secret: bytes,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.directory = directory
        self._secret = cluster_secret
        self.clock = clock
        # None: OIDC sign-in is off.
        self.current: Oidc | None = None

    async def load(self) -> None:
        raw = await self.store.get_setting(SETTING)
        try:
            self.current = _read(json.loads(raw)) if raw else None
        except (ValueError, KeyError, TypeError) as exc:
            log.error(
                "the store's %s setting is unreadable (%s): OIDC sign-in is off", SETTING, exc
            )
            self.current = None

    # --------------------------------------------------------------- reading

    def show(self, by: Principal) -> OidcJson:
        """The settings without their secret, for a cluster admin: what ``ctl auth oidc
        show`` prints and the pages' sign-in settings screen draws."""
        if not by.may("admin"):
            raise Refusal(403, "forbidden", "sign-in settings need the cluster's admin role")
        return self.view()

    def view(self) -> OidcJson:
        now = self.current
        if now is None:
            return {
                "enabled": False,
                "kind": None,
                "issuer": None,
                "client_id": None,
                "client_secret": None,
                "groups_claim": None,
                "scopes": [],
                "maps": [],
                "name": None,
                "updated_at": None,
            }
        return {
            "enabled": True,
            "kind": now.kind,
            "issuer": now.issuer,
            "client_id": now.client_id,
            "client_secret": "set" if now.sealed_secret else None,
            "groups_claim": now.groups_claim,
            "scopes": list(now.scopes),
            "maps": [self._map_json(m) for m in now.maps],
            "name": now.name,
            "updated_at": now.updated_at,
        }

    def _map_json(self, m: GroupMap) -> GroupMapJson:
        snap = self.directory.now
        if m.kind == "org":
            org = snap.orgs.get(m.scope_id)
            target = org.name if org else f"(gone: {m.scope_id})"
        elif m.kind == "team":
            team = snap.teams.get(m.scope_id)
            org = snap.orgs.get(team.org_id) if team else None
            target = f"{org.name}/{team.name}" if team and org else f"(gone: {m.scope_id})"
        else:
            target = "cluster"
        return {"group": m.group, "target": target, "role": m.role}

    def client_secret(self) -> str:
        """The client secret, opened for the token request alone."""
        if self.current is None:
            raise RuntimeError("OIDC sign-in is off")
        return pki.unseal(self._secret, self.current.sealed_secret).decode()

    def grants(self, groups: Sequence[str]) -> list[Grant]:
        """What a person's groups give, through the maps (a group not mapped: nothing)."""
        if self.current is None:
            return []
        have = set(groups)
        return [Grant(m.role, m.kind, m.scope_id) for m in self.current.maps if m.group in have]

    # --------------------------------------------------------------- changing

    async def set(self, ask: OidcSet, by: Principal) -> OidcJson:
        if not by.may("admin"):
            raise Refusal(403, "forbidden", "sign-in settings need the cluster's admin role")
        if ask.kind == "entra":
            if not ask.tenant:
                raise refuse("tenant", "Entra ID needs its tenant's id or domain")
            issuer = ENTRA_ISSUER.format(tenant=ask.tenant)
        else:
            if ask.tenant:
                raise refuse("tenant", "a tenant is for kind entra; give the issuer")
            if not ask.issuer:
                raise refuse("issuer", "give the provider's issuer URL")
            issuer = checked_issuer(ask.issuer)
        if not ask.client_id.strip():
            raise refuse("client_id", "give the client id the provider gave this cluster")
        if not ask.client_secret.strip():
            raise refuse("client_secret", "give the client's secret (ctl reads it from a file)")
        maps = tuple(self.parse_map(m) for m in ask.maps)
        scopes = ("openid", *(s for s in dict.fromkeys(ask.scopes) if s != "openid"))
        oidc = Oidc(
            kind=ask.kind,
            issuer=issuer,
            client_id=ask.client_id.strip(),
            sealed_secret=pki.seal(self._secret, ask.client_secret.strip().encode()),
            groups_claim=ask.groups_claim,
            scopes=scopes,
            maps=maps,
            name=ask.name.strip() or default_name(ask.kind, issuer),
            updated_at=self.clock(),
        )
        await self.store.put_setting(SETTING, json.dumps(_write(oidc), sort_keys=True))
        detail = f"{ask.kind} {issuer} client {oidc.client_id}, {len(maps)} group maps"
        await self.store.audit(by.name, "auth.oidc.set", SETTING, detail)
        self.current = oidc
        return self.view()

    async def off(self, by: Principal) -> OidcJson:
        if not by.may("admin"):
            raise Refusal(403, "forbidden", "sign-in settings need the cluster's admin role")
        await self.store.put_setting(SETTING, "")
        await self.store.audit(by.name, "auth.oidc.off", SETTING, "")
        self.current = None
        return self.view()

    def parse_map(self, text: str) -> GroupMap:
        """``GROUP=TARGET:ROLE``, its organisation and team found by name; else a
        Refusal naming what was wrong."""
        group, eq, rest = text.rpartition("=")
        target, colon, role = rest.rpartition(":")
        group, target, role = group.strip(), target.strip(), role.strip().lower()
        if not eq or not colon or not group or not target:
            raise refuse("maps", f"{text!r} is not {MAP_FORM}")
        if target.lower() == "cluster":
            if not is_role(role):
                raise refuse("maps", f"{text!r}: a cluster role is one of {', '.join(ROLES)}")
            return GroupMap(group, "cluster", "", role)
        if not is_org_role(role):
            raise refuse(
                "maps",
                f"{text!r}: a role in an organisation or team is one of {', '.join(ORG_ROLES)}",
            )
        org_name, slash, team_name = target.partition("/")
        snap = self.directory.now
        org = next((o for o in snap.orgs.values() if o.name.lower() == org_name.lower()), None)
        if org is None:
            raise refuse(
                "maps", f"{text!r}: no organisation {org_name!r}; see `llmgw ctl orgs list`"
            )
        if not slash:
            return GroupMap(group, "org", org.id, role)
        teams = self.directory.teams_of(org.id)
        team = next((t for t in teams if t.name.lower() == team_name.lower()), None)
        if team is None:
            raise refuse("maps", f"{text!r}: {org.name} has no team {team_name!r}")
        return GroupMap(group, "team", team.id, role)


def _write(oidc: Oidc) -> dict[str, object]:
    return {
        "kind": oidc.kind,
        "issuer": oidc.issuer,
        "client_id": oidc.client_id,
        "client_secret": oidc.sealed_secret,
        "groups_claim": oidc.groups_claim,
        "scopes": list(oidc.scopes),
        "maps": [[m.group, m.kind, m.scope_id, m.role] for m in oidc.maps],
        "name": oidc.name,
        "updated_at": oidc.updated_at,
    }


def _read(doc: dict[str, object]) -> Oidc | None:
    if not doc:
        return None
    kind = str(doc["kind"])
    if kind not in ("oidc", "entra"):
        raise ValueError(f"unknown kind {kind!r}")
    maps = doc.get("maps") or []
    scopes = doc.get("scopes") or list(DEFAULT_SCOPES)
    if not isinstance(maps, list) or not isinstance(scopes, list):
        raise TypeError("maps and scopes are lists")
    return Oidc(
        kind="entra" if kind == "entra" else "oidc",
        issuer=str(doc["issuer"]),
        client_id=str(doc["client_id"]),
        sealed_secret=str(doc["client_secret"]),
        groups_claim=str(doc.get("groups_claim") or "groups"),
        scopes=tuple(str(s) for s in scopes),
        maps=tuple(_read_map(m) for m in maps),
        name=str(doc.get("name") or ""),
        updated_at=float(str(doc.get("updated_at") or 0.0)),
    )


def _read_map(row: object) -> GroupMap:
    if not isinstance(row, list) or len(row) != 4:
        raise ValueError(f"a group map is [group, kind, scope, role], not {row!r}")
    group, kind, scope_id, role = (str(part) for part in row)
    if kind not in ("cluster", "org", "team"):
        raise ValueError(f"a group map's kind is cluster, org or team, not {kind!r}")
    if (kind == "cluster" and is_role(role)) or (kind != "cluster" and is_org_role(role)):
        return GroupMap(group, kind, scope_id, role)
    raise ValueError(f"{role!r} is no role of a {kind}")
