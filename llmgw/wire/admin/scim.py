"""SCIM provisioning's settings as the admin API shows them (never the token or its
hash: ``token`` says "set" or null)."""

from typing import Literal, TypedDict


class ScimJson(TypedDict):
    # "set" while SCIM's token opens /scim/v2; null: SCIM is off.
    token: Literal["set"] | None
    token_made_at: float | None
    # The path a provider is given, under this control plane's address.
    endpoint: str
    # As `ctl auth scim map` takes them: GROUP=ORG[/TEAM]:ROLE or GROUP=cluster:ROLE.
    maps: list[str]
    # As GET /scim/v2/Users counts them: every person but those the provider DELETEd.
    users: int
    groups: int


class ScimTokenJson(TypedDict):
    # Shown once: the identity provider's bearer token for /scim/v2.
    token: str
    endpoint: str
