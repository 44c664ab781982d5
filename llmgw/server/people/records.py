"""What the store keeps of people and the organisations they belong to.

A person has a login (what they sign in as), an optional cluster role (``viewer``,
``operator``, ``admin``: ``principal.Role``) and memberships. An organisation holds
teams, a team holds projects; a membership makes a person ``member``, ``manager`` or
``admin`` of an organisation or of a team. A membership or cluster role set by an
admin by hand is marked so: a group from an identity provider never lowers it.

Limits are the same at every level (organisation, team, project and key): requests and
tokens a minute, tokens a month, and the models it may use, the tightest winning; and the
MCP tools it grants and the guard policies that read its keys' traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from llmgw.server.principal import OrgRole, Role

# What a membership is of.
ScopeKind = Literal["org", "team"]
# Where a person came from: made here, or by an identity provider.
Source = Literal["local", "oidc", "ldap", "scim"]
SOURCES: tuple[Source, ...] = get_args(Source)

# The organisation, team and project every key made before people existed went into.
DEFAULT_ORG = "default"
DEFAULT_TEAM = "default"
DEFAULT_PROJECT = "default"


@dataclass(frozen=True)
class Limits:
    """Requests and tokens a minute, tokens a month, and model name patterns (all when
    empty); None: no limit of that kind at this level.

    ``tools``: the MCP tools granted here, as ``SERVER.TOOL`` patterns; None: this level
    says nothing of tools, ``()``: closed (no tool, whatever another level grants).
    ``guard``: the names of the guard policies that read what its keys send and get."""

    rpm: int | None = None
    tpm: int | None = None
    budget: int | None = None
    models: tuple[str, ...] = ()
    tools: tuple[str, ...] | None = None
    guard: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.budget is not None


@dataclass(frozen=True)
class Person:
    id: str
    login: str
    name: str = ""
    email: str = ""
    # The cluster role; None: only what their memberships give.
    role: Role | None = None
    # Set by an admin by hand: an identity provider's groups never lower it.
    role_by_hand: bool = False
    source: Source = "local"
    # The identity provider's id for them (``issuer|sub``, a DN, SCIM's externalId).
    subject: str | None = None
    active: bool = True
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(frozen=True)
class Org:
    id: str
    name: str
    limits: Limits = Limits()
    created_at: float = 0.0


@dataclass(frozen=True)
class Team:
    id: str
    org_id: str
    name: str
    limits: Limits = Limits()
    created_at: float = 0.0


@dataclass(frozen=True)
class Project:
    id: str
    org_id: str
    team_id: str
    name: str
    limits: Limits = Limits()
    created_at: float = 0.0


@dataclass(frozen=True)
class Membership:
    person_id: str
    kind: ScopeKind
    scope_id: str
    role: OrgRole
    # Set by an admin by hand: an identity provider's groups never lower it.
    by_hand: bool = False
    created_at: float = 0.0


@dataclass(frozen=True)
class PersonToken:
    """A personal token for ctl and the API: its hash only, never the token."""

    id: str
    person_id: str
    name: str
    token_hash: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
