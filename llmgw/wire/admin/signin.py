"""The cluster's sign-in settings as the admin API shows them: never a secret, only
whether one is set (``"client_secret": "set"``, or null)."""

from typing import Literal, TypedDict

OidcKind = Literal["oidc", "entra"]


class GroupMapJson(TypedDict):
    """One group of the identity provider and what it gives: a cluster role
    (``target`` ``cluster``) or a role in an organisation or team (``ORG`` or
    ``ORG/TEAM``, by their names now)."""

    group: str
    target: str
    role: str


class OidcJson(TypedDict):
    """OpenID Connect sign-in (Microsoft Entra ID is OIDC from a tenant): off when
    ``enabled`` is false, and then every other key is null or empty."""

    enabled: bool
    kind: OidcKind | None
    issuer: str | None
    client_id: str | None
    client_secret: Literal["set"] | None
    groups_claim: str | None
    scopes: list[str]
    maps: list[GroupMapJson]
    # What the sign-in button says: "Sign in with <name>".
    name: str | None
    updated_at: float | None
