"""LDAP / Active Directory sign-in as the admin API shows it: its settings (the service
account's password never: only whether it is set) and what ``ctl auth ldap test``
found, step by step."""

from typing import Literal, TypedDict

# The steps of one sign-in, in order (``ctl auth ldap test`` names the one that failed).
LdapStep = Literal["connect", "service_bind", "find", "person_bind", "groups"]


class LdapMapJson(TypedDict):
    # A group's cn or DN.
    group: str
    # ``cluster``, an organisation's name, or ORG/TEAM.
    target: str
    role: str


class LdapSettingsJson(TypedDict):
    enabled: bool
    url: str | None
    bind_dn: str | None
    # "set" when a password is kept (sealed); never the password.
    bind_password: Literal["set"] | None
    base_dn: str | None
    user_filter: str | None
    group_base: str | None
    group_filter: str | None
    ad: bool
    # "set" when a CA bundle is kept for ldaps://.
    ca: Literal["set"] | None
    maps: list[LdapMapJson]
    updated_at: float | None
    updated_by: str | None


class LdapStepJson(TypedDict):
    step: LdapStep
    ok: bool
    detail: str


class LdapPersonJson(TypedDict):
    dn: str
    name: str
    email: str


class LdapTestJson(TypedDict):
    ok: bool
    # The step that failed; None when every step passed.
    failed: LdapStep | None
    message: str
    steps: list[LdapStepJson]
    person: LdapPersonJson | None
    groups: list[str]
    grants: list[LdapMapJson]
