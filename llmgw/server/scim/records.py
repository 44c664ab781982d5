"""What the store keeps of SCIM beyond the people table, and the sign-in settings of
SCIM (``auth.scim`` in the store's settings).

A ``ScimUser`` is what the provider said of a person that a ``Person`` does not hold:
its externalId, and whether it DELETEd them (the person stays, deactivated). A
``ScimGroup`` is one of the provider's groups with its members (person ids). A
``ScimMap`` gives a group's members a cluster role (``kind`` ``cluster``) or a role in
an organisation or team.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmgw.server.principal import OrgRole, Role

MapKind = Literal["cluster", "org", "team"]


@dataclass(frozen=True)
class ScimUser:
    person_id: str
    external_id: str | None = None
    # When the provider DELETEd them: they answer 404 and are listed no more.
    removed_at: float | None = None
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(frozen=True)
class ScimGroup:
    id: str
    name: str
    external_id: str | None = None
    # Person ids, in the order the provider added them.
    members: tuple[str, ...] = ()
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(frozen=True)
class ScimMap:
    """``GROUP=ORG[/TEAM]:ROLE`` (or ``GROUP=cluster:ROLE``), with ids for names."""

    group: str
    kind: MapKind
    scope_id: str
    role: OrgRole | Role


@dataclass(frozen=True)
class ScimSettings:
    """SCIM's own bearer token (its SHA-256 only) and the groups' map."""

    token_hash: str | None = None
    token_made_at: float | None = None
    maps: tuple[ScimMap, ...] = ()
