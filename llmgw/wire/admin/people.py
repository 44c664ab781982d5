"""People, organisations, teams, projects, memberships and personal tokens as the admin
API shows them (never a token or its hash)."""

from typing import Literal, TypedDict

RoleName = Literal["viewer", "operator", "admin"]
OrgRoleName = Literal["member", "manager", "admin"]


class LimitsJson(TypedDict):
    rpm: int | None
    tpm: int | None
    budget: int | None
    models: list[str]
    # MCP tools granted (SERVER.TOOL patterns); None: says nothing; []: closed.
    tools: list[str] | None
    # The guard policies that read what its keys send and get.
    guard: list[str]


GrantLevel = Literal["org", "team", "project", "key"]


class McpGrantJson(TypedDict):
    """``GET /api/v1/mcp/grants``: a level or key that names MCP tools."""

    level: GrantLevel
    id: str
    # "organisation acme", "team vision", "project vision/demo", "key ci"
    label: str
    org: str | None
    patterns: list[str]
    # An empty list: no tool for it or beneath it until `--clear tools` opens it.
    closed: bool


class LimitsSetJson(LimitsJson):
    """The answer to setting limits: the level's or key's limits now, and what a
    ``revoke_tools`` took from it and from everything beneath it (each as it is now)."""

    revoked: list[McpGrantJson]


class PersonJson(TypedDict):
    id: str
    login: str
    name: str
    email: str
    role: RoleName | None
    role_by_hand: bool
    source: str
    active: bool
    created_at: float
    updated_at: float


class MembershipJson(TypedDict):
    person_id: str
    login: str | None
    kind: Literal["org", "team"]
    scope_id: str
    scope_name: str | None
    role: OrgRoleName
    by_hand: bool


class MeJson(TypedDict):
    """``GET /api/v1/me``: who the caller is, and where they belong."""

    name: str
    person: PersonJson | None
    role: RoleName | None
    via: str
    memberships: list[MembershipJson]


class OrgJson(TypedDict):
    id: str
    name: str
    limits: LimitsJson
    created_at: float


class TeamJson(TypedDict):
    id: str
    org_id: str
    name: str
    limits: LimitsJson
    created_at: float


class ProjectJson(TypedDict):
    id: str
    org_id: str
    team_id: str
    team: str | None
    name: str
    limits: LimitsJson
    created_at: float


class PersonTokenJson(TypedDict):
    id: str
    name: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None


class NewPersonTokenJson(PersonTokenJson):
    """A personal token, this once."""

    token: str


class AuditEntryJson(TypedDict):
    """One entry of ``GET /api/v1/audit``: who (a person's login, ``admin@HOST``, or the
    control plane's own work) did what to what, when, and in which organisation."""

    id: int
    at: float
    actor: str
    action: str
    target: str
    detail: str
    org_id: str | None


class DeviceCodeJson(TypedDict):
    """``POST /api/v1/login/device``: a sign-in for ctl, waiting for its person to approve
    it on the pages at ``verify_url``."""

    device_code: str
    user_code: str
    verify_url: str
    interval: int
    expires_in: int


class DeviceTokenJson(NewPersonTokenJson):
    """``POST /api/v1/login/device/token`` once its code is approved: a personal token
    for the person who approved it (``login``), shown this once."""

    login: str
