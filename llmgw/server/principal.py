"""Who asks: the caller every service of the control plane is handed.

The one gate (``access.py``) makes a ``Principal`` from a request (the admin token, a
page's signed session, or nobody for the public routes); the control plane's own work
(the reconciler parking a model, the fleet following an engine's version) calls the
same services as a system principal. Services write ``principal.name`` into the audit
log and will check ``principal.may(role)`` where a right is theirs to decide; they know
nothing of headers or cookies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeGuard, get_args

# Roles in rising order: each may do all that the one before it may.
Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
# How the caller proved who they are.
Via = Literal["token", "session", "anonymous", "system"]


def is_role(value: str) -> TypeGuard[Role]:
    return value in ROLES


@dataclass(frozen=True)
class Principal:
    """A caller: the name the audit log keeps (``admin@10.0.0.5``), their role (None
    for an anonymous caller) and how they proved it."""

    name: str
    role: Role | None
    via: Via

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
