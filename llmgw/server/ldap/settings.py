"""LDAP / Active Directory sign-in settings: what ``ctl auth ldap set`` takes, how the
store keeps it, and what a person's groups give them.

The settings are one JSON document in the store's settings (``auth.ldap``), so every
control plane reads the same; the service account's password is in it sealed with the
cluster's key (``pki.seal``) and is opened only to bind. An empty document: LDAP is off.

A map (``GROUP=ORG[/TEAM]:ROLE``, or ``GROUP=cluster:ROLE``) gives the members of a
directory group a role in an organisation or team (member, manager, admin) or a cluster
role (viewer, operator, admin). GROUP is a group's cn or its whole DN, matched without
regard to case. Organisations and teams are named by name or id when the map is set,
and kept by id, so renaming one keeps its maps; a map whose organisation or team has
since gone gives nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from llmgw import pki
from llmgw.server.people.directory import Directory
from llmgw.server.people.service import Grant
from llmgw.server.principal import ORG_ROLES, ROLES, is_org_role, is_role
from llmgw.server.refusal import Refusal
from llmgw.server.schema import Spec, spec
from llmgw.wire.admin.ldap import LdapMapJson

SETTING = "auth.ldap"
# What a filter's placeholders stand for: the login typed, a person's or group's DN.
LOGIN, DN = "{login}", "{dn}"
USER_FILTER = "(uid={login})"
AD_USER_FILTER = "(&(objectClass=user)(sAMAccountName={login}))"
GROUP_FILTER = "(|(member={dn})(uniqueMember={dn}))"
# Active Directory walks nested groups itself: LDAP_MATCHING_RULE_IN_CHAIN.
AD_GROUP_FILTER = "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={dn}))"
MAP_WORDS = "GROUP=ORG[/TEAM]:ROLE or GROUP=cluster:ROLE"

MapKind = Literal["cluster", "org", "team"]


def _bad(field_name: str, message: str) -> Refusal:
    return Refusal(400, "bad_request", f"{field_name}: {message}", field_name)


@dataclass(frozen=True)
class GroupMap:
    """A directory group's grant: a cluster role, or a role in an org or team (by id)."""

    group: str
    kind: MapKind
    scope_id: str
    role: str

    def matches(self, group_dn: str) -> bool:
        wanted = self.group.strip().casefold()
        return wanted == group_name(group_dn).casefold() or (
            "=" in wanted and _dn_key(wanted) == _dn_key(group_dn)
        )

    def grant(self) -> Grant:
        role = self.role
        if is_role(role) or is_org_role(role):
            return Grant(role, self.kind, self.scope_id)
        raise ValueError(f"a map's role {role!r} is no role")


@dataclass(frozen=True)
class LdapSettings:
    url: str
    bind_dn: str
    # Open in memory only: sealed in the store, never shown, never logged.
    bind_password: str = field(repr=False)
    base_dn: str
    user_filter: str
    group_base: str
    group_filter: str
    ad: bool = False
    ca_pem: str | None = field(default=None, repr=False)
    maps: tuple[GroupMap, ...] = ()
    updated_at: float = 0.0
    updated_by: str = ""

    @property
    def host_port(self) -> tuple[str, int, bool]:
        """The server's host, its port and whether it speaks TLS from the start."""
        parts = urlsplit(self.url)
        tls = parts.scheme == "ldaps"
        return parts.hostname or "", parts.port or (636 if tls else 389), tls

    def to_store(self, cluster_secret: bytes) -> str:
        doc = {
            "url": self.url,
            "bind_dn": self.bind_dn,
            "bind_password": pki.seal(cluster_secret, self.bind_password.encode()),
            "base_dn": self.base_dn,
            "user_filter": self.user_filter,
            "group_base": self.group_base,
            "group_filter": self.group_filter,
            "ad": self.ad,
            "ca_pem": self.ca_pem,
            "maps": [
                {"group": m.group, "kind": m.kind, "scope_id": m.scope_id, "role": m.role}
                for m in self.maps
            ],
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
        }
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_store(cls, raw: str | None, cluster_secret: bytes) -> LdapSettings | None:
        """The settings the store keeps; None when LDAP is off. A document this cluster's
        key does not open raises ``pki.PKIError``."""
        if not raw or not raw.strip():
            return None
        doc = json.loads(raw)
        if not isinstance(doc, dict) or not doc.get("url"):
            return None
        maps = tuple(
            GroupMap(str(m["group"]), m["kind"], str(m["scope_id"]), str(m["role"]))
            for m in doc.get("maps") or []
            if m.get("kind") in ("cluster", "org", "team")
        )
        password = pki.unseal(cluster_secret, str(doc["bind_password"])).decode()
        ca = doc.get("ca_pem")
        return cls(
            url=str(doc["url"]),
            bind_dn=str(doc["bind_dn"]),
            bind_password=password,
            base_dn=str(doc["base_dn"]),
            user_filter=str(doc["user_filter"]),
            group_base=str(doc["group_base"]),
            group_filter=str(doc["group_filter"]),
            ad=bool(doc.get("ad")),
            ca_pem=str(ca) if ca else None,
            maps=maps,
            updated_at=float(doc.get("updated_at") or 0.0),
            updated_by=str(doc.get("updated_by") or ""),
        )


@dataclass(frozen=True)
class LdapSet:
    """LDAP or Active Directory sign-in: where the directory is, the service account the
    control plane searches it as, where people and groups are, and what groups give."""

    url: str = spec(doc="ldap://HOST[:PORT] or ldaps://HOST[:PORT]", max_length=512)
    bind_dn: str = spec(doc="the service account's DN", min_length=1, max_length=1024)
    base_dn: str = spec(doc="where people are searched", min_length=1, max_length=1024)
    bind_password: str | None = spec(
        None,
        doc="the service account's password, sealed in the store and never shown back; "
        "left out: the one kept",
        min_length=1,
        max_length=1024,
    )
    user_filter: str | None = spec(
        None,
        doc="finds a person by {login}; default (uid={login}), for AD "
        "(&(objectClass=user)(sAMAccountName={login}))",
        max_length=1024,
    )
    group_base: str | None = spec(None, doc="where groups are searched; default base_dn")
    group_filter: str | None = spec(
        None,
        doc="finds the groups holding {dn} (or {login}); default "
        "(|(member={dn})(uniqueMember={dn})), walked up nested groups",
        max_length=1024,
    )
    ad: bool = spec(False, doc="Active Directory: its defaults and its nested-group rule")
    ca_pem: str | None = spec(None, doc="CA certificates (PEM) for ldaps://", max_length=65536)
    maps: tuple[str, ...] = spec(
        (), doc=MAP_WORDS, max_items=200, items=Spec(min_length=3, max_length=1200)
    )


def checked_url(value: str) -> str:
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError as exc:
        raise _bad("url", f"{value!r} is not ldap[s]://HOST[:PORT] ({exc})") from None
    if parts.scheme not in ("ldap", "ldaps") or not parts.hostname:
        raise _bad("url", f"{value!r} is not ldap://HOST[:PORT] or ldaps://HOST[:PORT]")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise _bad("url", f"{value!r}: give only the scheme, host and port")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def checked_dn(field_name: str, value: str) -> str:
    # ldap3's parser: loaded when LDAP is set up, never by a control plane without it.
    from ldap3.core.exceptions import LDAPInvalidDnError
    from ldap3.utils.dn import parse_dn

    value = value.strip()
    try:
        if not value or not parse_dn(",".join(f"{a}={v}" for a, v in _dn_parts(value))):
            raise LDAPInvalidDnError("empty")
    except LDAPInvalidDnError as exc:
        raise _bad(field_name, f"{value!r} is not a DN like dc=example,dc=org ({exc})") from None
    return value


def checked_filter(field_name: str, value: str, needs: Sequence[str]) -> str:
    value = value.strip()
    depth = 0
    for ch in value:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            break
    if not value.startswith("(") or depth != 0:
        raise _bad(field_name, f"{value!r} is not an LDAP filter in parentheses")
    if not any(n in value for n in needs):
        raise _bad(field_name, f"{value!r} names none of {' or '.join(needs)}")
    return value


def _same(a: str, b: str) -> bool:
    return a.strip().casefold() == b.strip().casefold()


def parse_map(text: str, directory: Directory) -> GroupMap:
    """``GROUP=ORG[/TEAM]:ROLE`` or ``GROUP=cluster:ROLE``, its org and team found now."""
    group, eq, rest = text.strip().rpartition("=")
    target, colon, role = rest.rpartition(":")
    group, target, role = group.strip(), target.strip(), role.strip()
    if not eq or not colon or not group or not target:
        raise _bad("maps", f"{text!r} is not {MAP_WORDS}")
    if target.casefold() == "cluster":
        if not is_role(role):
            raise _bad("maps", f"{text!r}: a cluster role is one of {', '.join(ROLES)}")
        return GroupMap(group, "cluster", "", role)
    if not is_org_role(role):
        raise _bad("maps", f"{text!r}: a role in an org or team is one of {', '.join(ORG_ROLES)}")
    org_ref, slash, team_ref = target.partition("/")
    org = directory.find_org(org_ref)
    if org is None:
        raise _bad("maps", f"{text!r}: no organisation {org_ref!r}; see `llmgw ctl orgs list`")
    if not slash:
        return GroupMap(group, "org", org.id, role)
    teams = directory.teams_of(org.id)
    team = next((t for t in teams if t.id == team_ref or _same(t.name, team_ref)), None)
    if team is None:
        raise _bad("maps", f"{text!r}: {org.name} has no team {team_ref!r}")
    return GroupMap(group, "team", team.id, role)


def map_json(m: GroupMap, directory: Directory) -> LdapMapJson:
    """A map as shown, its organisation and team by their names now."""
    now = directory.now
    if m.kind == "cluster":
        target = "cluster"
    elif m.kind == "org":
        org = now.orgs.get(m.scope_id)
        target = org.name if org else f"(removed organisation {m.scope_id})"
    else:
        team = now.teams.get(m.scope_id)
        org = now.orgs.get(team.org_id) if team else None
        target = f"{org.name}/{team.name}" if team and org else f"(removed team {m.scope_id})"
    return {"group": m.group, "target": target, "role": m.role}


def _dn_parts(dn: str) -> list[tuple[str, str]]:
    """A DN's parts as (type, value), split at commas not escaped, spaces around each
    taken away (RFC 4514 writes none; people and some servers do)."""
    parts = re.split(r"(?<!\\),", dn.strip())
    return [(a.strip(), v.strip()) for a, _, v in (p.partition("=") for p in parts)]


def _dn_key(dn: str) -> str:
    """A DN as compared: its parts without spaces around them, case folded."""
    return ",".join(f"{a}={v}" for a, v in _dn_parts(dn)).casefold()


def group_name(dn: str) -> str:
    """A group's name: the value of its DN's first part (its cn), unescaped."""
    value = _dn_parts(dn)[0][1]

    def plain(m: re.Match[str]) -> str:
        code = m.group(1)
        return chr(int(code, 16)) if len(code) == 2 else code

    return re.sub(r"\\([0-9A-Fa-f]{2}|.)", plain, value) or dn


def matching(
    groups: Iterable[str], maps: Sequence[GroupMap], directory: Directory
) -> list[GroupMap]:
    """The maps a person's groups meet whose organisation or team still exists."""
    groups = list(groups)
    now = directory.now
    out: list[GroupMap] = []
    for m in maps:
        if m.kind == "org" and m.scope_id not in now.orgs:
            continue
        if m.kind == "team" and m.scope_id not in now.teams:
            continue
        if any(m.matches(g) for g in groups):
            out.append(m)
    return out


def grants_for(
    groups: Iterable[str], maps: Sequence[GroupMap], directory: Directory
) -> list[Grant]:
    return [m.grant() for m in matching(groups, maps, directory)]
