"""Who asks: the caller every service of the control plane is handed.

The one gate (``access.py``) makes a ``Principal`` from a request (the admin token, a
page's signed session, or nobody for the public routes); the control plane's own work
(the reconciler parking a model, the fleet following an engine's version) calls the
same services as a system principal. Services write ``principal.name`` into the audit
log and will check ``principal.may(role)`` where a right is theirs to decide; they know
nothing of headers or cookies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeGuard, get_args

# Roles in rising order: each may do all that the one before it may.
Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
# A membership's role in an organisation or team, rising likewise.
OrgRole = Literal["member", "manager", "admin"]
ORG_ROLES: tuple[OrgRole, ...] = get_args(OrgRole)
# How the caller proved who they are.
# "metrics": the cluster's metrics token, which reads metrics and nothing else.
Via = Literal["token", "session", "anonymous", "system", "metrics"]


def is_role(value: str) -> TypeGuard[Role]:
    return value in ROLES


def is_org_role(value: str) -> TypeGuard[OrgRole]:
    return value in ORG_ROLES


def reaches(role: OrgRole | None, wanted: OrgRole) -> bool:
    """Whether a membership's role (None: no membership) reaches ``wanted``."""
    return role is not None and ORG_ROLES.index(role) >= ORG_ROLES.index(wanted)


@dataclass(frozen=True)
class Principal:
    """A caller: the name the audit log keeps (``admin@10.0.0.5``, a person's login),
    their cluster role (None for an anonymous caller, or a person whose memberships give
    all they may do) and how they proved it; for a person, their id and their role in
    each organisation and team they belong to."""

    name: str
    role: Role | None
    via: Via
    person: str | None = None
    # Not hashed (a principal's hash is its name, role and how it proved it).
    orgs: Mapping[str, OrgRole] = field(default_factory=dict, hash=False)
    teams: Mapping[str, OrgRole] = field(default_factory=dict, hash=False)

    @property
    def known(self) -> bool:
        """Signed in: the admin token, a person, or the control plane itself."""
        return self.via not in ("anonymous", "metrics")

    def may(self, role: Role) -> bool:
        """Whether this caller's role reaches ``role``."""
        return self.role is not None and ROLES.index(self.role) >= ROLES.index(role)

    @classmethod
    def system(cls, name: str) -> Principal:
        """The control plane itself (``reconciler``, ``engines``): every right."""
        return cls(name, "admin", "system")

    @classmethod
    def anonymous(cls, host: str) -> Principal:
        return cls(f"anonymous@{host}", None, "anonymous")
