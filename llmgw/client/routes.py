"""The admin API's routes as the client calls them: each a ``Route``, its method, its
path, and the shape of its answer (``llmgw.wire.admin``). ``Route.read`` is the one place
a decoded answer becomes that shape; the server's answers are held to the same shapes by
tests/server/api/test_answer_shapes.py, which reads every route declared here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar, cast
from urllib.parse import quote, urlencode

from llmgw.wire.admin import (
    AdapterJson,
    AuditEntryJson,
    Collected,
    DemandJson,
    DeviceCodeJson,
    DeviceTokenJson,
    EnergyJson,
    EngineChangeJson,
    EnginesJson,
    ExplainJson,
    FabricMapJson,
    FabricsJson,
    FabricTestJson,
    FirewallChangeJson,
    FirewallJson,
    HistoryJson,
    KeyJson,
    LimitsJson,
    LogBatch,
    MeJson,
    MembershipJson,
    ModelJson,
    ModelRemovedJson,
    NewKeyJson,
    NewPersonTokenJson,
    NodeJson,
    NodeSettingsJson,
    NvlinkJson,
    OrgJson,
    PersonJson,
    PersonTokenJson,
    PlanJson,
    ProjectJson,
    ReleaseJson,
    ReplicaJson,
    RestartJson,
    RotatedTokenJson,
    ServerJson,
    ServerRemovedJson,
    ServingJson,
    SettingsChangeJson,
    SettingsJson,
    SettingValueJson,
    ShardAskedJson,
    SlurmFilesJson,
    SlurmJson,
    StatusJson,
    TeamJson,
    TokenJson,
    UpgradeJson,
    UsageJson,
    UsageSumJson,
    VersionsJson,
    WeightsEntry,
)

T = TypeVar("T")
# A request's body: what ``json.dumps`` writes.
Body = Mapping[str, object]
# A query's parameters, as ``urlencode`` takes them.
Query = Mapping[str, str | int | float]


@dataclass(frozen=True)
class Route(Generic[T]):
    """A route of the admin API: its method, its path (``{}`` for each part the caller
    names, quoted) and ``T``, the shape of what it answers."""

    method: str
    path: str

    def at(self, *parts: str, query: Query | None = None) -> str:
        path = self.path.format(*(quote(part, safe="") for part in parts))
        return f"{path}?{urlencode(query)}" if query else path

    def read(self, answer: object) -> T:
        """A decoded answer as this route's shape. The one cast of the client: the
        server is held to the same shapes by tests/server/api/test_answer_shapes.py."""
        return cast(T, answer)


# --- the routes, by resource; each named for what it answers or does

STATUS: Route[StatusJson] = Route("GET", "/api/v1/status")
NODES: Route[list[NodeJson]] = Route("GET", "/api/v1/nodes")
NODE: Route[NodeJson] = Route("GET", "/api/v1/nodes/{}")
HISTORY: Route[HistoryJson] = Route("GET", "/api/v1/nodes/{}/history")
LOGS: Route[list[str]] = Route("GET", "/api/v1/nodes/{}/logs")
LOG_BATCH: Route[LogBatch] = Route("GET", "/api/v1/nodes/{}/logs")
MARK: Route[NodeJson] = Route("POST", "/api/v1/nodes/{}/{}")
START_SHARD: Route[ShardAskedJson] = Route("POST", "/api/v1/nodes/{}/shards")
STOP_SHARD: Route[ShardAskedJson] = Route("DELETE", "/api/v1/nodes/{}/shards/{}")
REPLICAS: Route[list[ReplicaJson]] = Route("GET", "/api/v1/replicas")
WEIGHTS: Route[list[WeightsEntry]] = Route("GET", "/api/v1/weights")
COLLECT: Route[list[Collected]] = Route("POST", "/api/v1/weights/collect")
TOKEN: Route[TokenJson] = Route("POST", "/api/v1/tokens")

MODELS: Route[list[ModelJson]] = Route("GET", "/api/v1/models")
MODEL: Route[ModelJson] = Route("GET", "/api/v1/models/{}")
SERVE: Route[ModelJson] = Route("POST", "/api/v1/models")
EXTERNAL: Route[ModelJson] = Route("POST", "/api/v1/models/external")
# stop, start, restart, context, gpus, replicas: each answers the model as it now is.
CHANGE_MODEL: Route[ModelJson] = Route("POST", "/api/v1/models/{}/{}")
REMOVE_MODEL: Route[ModelRemovedJson] = Route("DELETE", "/api/v1/models/{}")
DEMAND: Route[DemandJson] = Route("POST", "/api/v1/models/{}/demand")
EXPLAIN: Route[list[ExplainJson]] = Route("GET", "/api/v1/models/{}/explain")
ADAPTERS: Route[list[AdapterJson]] = Route("GET", "/api/v1/models/{}/adapters")
ADD_ADAPTER: Route[list[AdapterJson]] = Route("POST", "/api/v1/models/{}/adapters")
REMOVE_ADAPTER: Route[list[AdapterJson]] = Route("DELETE", "/api/v1/models/{}/adapters/{}")
PLAN: Route[PlanJson] = Route("GET", "/api/v1/plan")

KEYS: Route[list[KeyJson]] = Route("GET", "/api/v1/keys")
KEY: Route[KeyJson] = Route("GET", "/api/v1/keys/{}")
CREATE_KEY: Route[NewKeyJson] = Route("POST", "/api/v1/keys")
UPDATE_KEY: Route[KeyJson] = Route("POST", "/api/v1/keys/{}")
REVOKE_KEY: Route[KeyJson] = Route("DELETE", "/api/v1/keys/{}")
SERVING: Route[ServingJson] = Route("POST", "/api/v1/serving")
USAGE: Route[list[UsageJson]] = Route("GET", "/api/v1/usage")
USAGE_SUMS: Route[list[UsageSumJson]] = Route("GET", "/api/v1/usage")
ENERGY: Route[list[EnergyJson]] = Route("GET", "/api/v1/energy")
ROTATE_ADMIN_TOKEN: Route[RotatedTokenJson] = Route("POST", "/api/v1/admin-token/rotate")

SERVERS: Route[list[ServerJson]] = Route("GET", "/api/v1/servers")
VERSIONS: Route[VersionsJson] = Route("GET", "/api/v1/versions")
RELEASE: Route[ReleaseJson] = Route("GET", "/api/v1/release")
SERVER_TOKEN: Route[TokenJson] = Route("POST", "/api/v1/servers/tokens")
REMOVE_SERVER: Route[ServerRemovedJson] = Route("DELETE", "/api/v1/servers/{}")

SETTINGS: Route[SettingsJson] = Route("GET", "/api/v1/config")
NODE_SETTINGS: Route[NodeSettingsJson] = Route("GET", "/api/v1/config")
SETTING: Route[SettingValueJson] = Route("GET", "/api/v1/config")
SET_SETTING: Route[SettingsJson] = Route("POST", "/api/v1/config")
SETTINGS_HISTORY: Route[list[SettingsChangeJson]] = Route("GET", "/api/v1/config/history")
ENGINES: Route[EnginesJson] = Route("GET", "/api/v1/engines")
SET_ENGINE: Route[EnginesJson] = Route("POST", "/api/v1/engines")
ENGINE_BUILD: Route[EnginesJson] = Route("POST", "/api/v1/nodes/{}/engine-build")
ENGINES_HISTORY: Route[list[EngineChangeJson]] = Route("GET", "/api/v1/engines/history")
FIREWALL: Route[FirewallJson] = Route("GET", "/api/v1/firewall")
SET_FIREWALL: Route[FirewallJson] = Route("POST", "/api/v1/firewall")
FIREWALL_HISTORY: Route[list[FirewallChangeJson]] = Route("GET", "/api/v1/firewall/history")
SLURM: Route[SlurmJson] = Route("GET", "/api/v1/slurm")
SLURM_CONF: Route[SlurmFilesJson] = Route("GET", "/api/v1/slurm/conf")
SLURM_SETUP: Route[SlurmJson] = Route("POST", "/api/v1/slurm/setup")
SLURM_LEND: Route[SlurmJson] = Route("POST", "/api/v1/slurm/lend")
SLURM_RECLAIM: Route[SlurmJson] = Route("POST", "/api/v1/slurm/reclaim")
SLURM_OFF: Route[SlurmJson] = Route("POST", "/api/v1/slurm/off")
SLURM_POLICY: Route[SlurmJson] = Route("POST", "/api/v1/slurm/policy")

RESTART: Route[RestartJson] = Route("POST", "/api/v1/restart")
RESTART_STATUS: Route[RestartJson] = Route("GET", "/api/v1/restart")
UPGRADE: Route[UpgradeJson] = Route("POST", "/api/v1/upgrade")
UPGRADE_STATUS: Route[UpgradeJson] = Route("GET", "/api/v1/upgrade")

ME: Route[MeJson] = Route("GET", "/api/v1/me")
PEOPLE: Route[list[PersonJson]] = Route("GET", "/api/v1/people")
PERSON: Route[PersonJson] = Route("GET", "/api/v1/people/{}")
CREATE_PERSON: Route[PersonJson] = Route("POST", "/api/v1/people")
CHANGE_PERSON: Route[PersonJson] = Route("POST", "/api/v1/people/{}")
PERSON_TOKENS: Route[list[PersonTokenJson]] = Route("GET", "/api/v1/people/{}/tokens")
CREATE_PERSON_TOKEN: Route[NewPersonTokenJson] = Route("POST", "/api/v1/people/{}/tokens")
REVOKE_PERSON_TOKEN: Route[PersonTokenJson] = Route("DELETE", "/api/v1/people/{}/tokens/{}")
ORGS: Route[list[OrgJson]] = Route("GET", "/api/v1/orgs")
ORG: Route[OrgJson] = Route("GET", "/api/v1/orgs/{}")
CREATE_ORG: Route[OrgJson] = Route("POST", "/api/v1/orgs")
RENAME_ORG: Route[OrgJson] = Route("POST", "/api/v1/orgs/{}")
REMOVE_ORG: Route[OrgJson] = Route("DELETE", "/api/v1/orgs/{}")
TEAMS: Route[list[TeamJson]] = Route("GET", "/api/v1/orgs/{}/teams")
CREATE_TEAM: Route[TeamJson] = Route("POST", "/api/v1/orgs/{}/teams")
REMOVE_TEAM: Route[TeamJson] = Route("DELETE", "/api/v1/orgs/{}/teams/{}")
PROJECTS: Route[list[ProjectJson]] = Route("GET", "/api/v1/orgs/{}/projects")
CREATE_PROJECT: Route[ProjectJson] = Route("POST", "/api/v1/orgs/{}/projects")
REMOVE_PROJECT: Route[ProjectJson] = Route("DELETE", "/api/v1/orgs/{}/projects/{}")
MEMBERS: Route[list[MembershipJson]] = Route("GET", "/api/v1/orgs/{}/members")
SET_MEMBER: Route[MembershipJson] = Route("POST", "/api/v1/orgs/{}/members")
REMOVE_MEMBER: Route[MembershipJson] = Route("DELETE", "/api/v1/orgs/{}/members/{}")
ORG_LIMITS: Route[LimitsJson] = Route("POST", "/api/v1/orgs/{}/limits")
TEAM_LIMITS: Route[LimitsJson] = Route("POST", "/api/v1/orgs/{}/teams/{}/limits")
PROJECT_LIMITS: Route[LimitsJson] = Route("POST", "/api/v1/orgs/{}/projects/{}/limits")
AUDIT: Route[list[AuditEntryJson]] = Route("GET", "/api/v1/audit")
DEVICE_LOGIN: Route[DeviceCodeJson] = Route("POST", "/api/v1/login/device")
DEVICE_TOKEN: Route[DeviceTokenJson] = Route("POST", "/api/v1/login/device/token")

FABRICS: Route[FabricsJson] = Route("GET", "/api/v1/fabrics")
FABRIC_MAP: Route[FabricMapJson] = Route("GET", "/api/v1/fabrics/{}/topology")
FABRIC_TEST: Route[FabricTestJson] = Route("POST", "/api/v1/fabric-tests")
NVLINK: Route[NvlinkJson] = Route("GET", "/api/v1/nvlink")
