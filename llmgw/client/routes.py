"""The admin API's routes as the client calls them: each a ``Route``, its method, its
path, and the shape of its answer (``llmgw.wire.admin``). ``Route.read`` is the one place
a decoded answer becomes that shape; the server's answers are held to the same shapes by
tests/server/api/test_answer_shapes.py, which reads every route declared here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar, cast
from urllib.parse import quote, urlencode

from llmgw.wire import admin as w

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

STATUS: Route[w.StatusJson] = Route("GET", "/api/v1/status")
NODES: Route[list[w.NodeJson]] = Route("GET", "/api/v1/nodes")
NODE: Route[w.NodeJson] = Route("GET", "/api/v1/nodes/{}")
HISTORY: Route[w.HistoryJson] = Route("GET", "/api/v1/nodes/{}/history")
LOGS: Route[list[str]] = Route("GET", "/api/v1/nodes/{}/logs")
LOG_BATCH: Route[w.LogBatch] = Route("GET", "/api/v1/nodes/{}/logs")
MARK: Route[w.NodeJson] = Route("POST", "/api/v1/nodes/{}/{}")
START_SHARD: Route[w.ShardAskedJson] = Route("POST", "/api/v1/nodes/{}/shards")
STOP_SHARD: Route[w.ShardAskedJson] = Route("DELETE", "/api/v1/nodes/{}/shards/{}")
REPLICAS: Route[list[w.ReplicaJson]] = Route("GET", "/api/v1/replicas")
WEIGHTS: Route[list[w.WeightsEntry]] = Route("GET", "/api/v1/weights")
COLLECT: Route[list[w.Collected]] = Route("POST", "/api/v1/weights/collect")
TOKEN: Route[w.TokenJson] = Route("POST", "/api/v1/tokens")

MODELS: Route[list[w.ModelJson]] = Route("GET", "/api/v1/models")
MODEL: Route[w.ModelJson] = Route("GET", "/api/v1/models/{}")
SERVE: Route[w.ModelJson] = Route("POST", "/api/v1/models")
EXTERNAL: Route[w.ModelJson] = Route("POST", "/api/v1/models/external")
# stop, start, restart, context, gpus, replicas: each answers the model as it now is.
CHANGE_MODEL: Route[w.ModelJson] = Route("POST", "/api/v1/models/{}/{}")
REMOVE_MODEL: Route[w.ModelRemovedJson] = Route("DELETE", "/api/v1/models/{}")
DEMAND: Route[w.DemandJson] = Route("POST", "/api/v1/models/{}/demand")
EXPLAIN: Route[list[w.ExplainJson]] = Route("GET", "/api/v1/models/{}/explain")
ADAPTERS: Route[list[w.AdapterJson]] = Route("GET", "/api/v1/models/{}/adapters")
ADD_ADAPTER: Route[list[w.AdapterJson]] = Route("POST", "/api/v1/models/{}/adapters")
REMOVE_ADAPTER: Route[list[w.AdapterJson]] = Route("DELETE", "/api/v1/models/{}/adapters/{}")
PLAN: Route[w.PlanJson] = Route("GET", "/api/v1/plan")
JOBS: Route[list[w.JobJson]] = Route("GET", "/api/v1/jobs")
JOB: Route[w.JobJson] = Route("GET", "/api/v1/jobs/{}")
EXPLORE: Route[w.ExploreJson] = Route("GET", "/api/v1/explore")
EXPLORE_REPO: Route[w.ExploreRepoJson] = Route("GET", "/api/v1/explore/{}/{}")

KEYS: Route[list[w.KeyJson]] = Route("GET", "/api/v1/keys")
KEY: Route[w.KeyJson] = Route("GET", "/api/v1/keys/{}")
CREATE_KEY: Route[w.NewKeyJson] = Route("POST", "/api/v1/keys")
UPDATE_KEY: Route[w.KeyJson] = Route("POST", "/api/v1/keys/{}")
REVOKE_KEY: Route[w.KeyJson] = Route("DELETE", "/api/v1/keys/{}")
KEY_LIMITS: Route[w.LimitsSetJson] = Route("POST", "/api/v1/keys/{}/limits")
SERVING: Route[w.ServingJson] = Route("POST", "/api/v1/serving")
USAGE: Route[list[w.UsageJson]] = Route("GET", "/api/v1/usage")
USAGE_SUMS: Route[list[w.UsageSumJson]] = Route("GET", "/api/v1/usage")
ENERGY: Route[list[w.EnergyJson]] = Route("GET", "/api/v1/energy")
ROTATE_ADMIN_TOKEN: Route[w.RotatedTokenJson] = Route("POST", "/api/v1/admin-token/rotate")

SERVERS: Route[list[w.ServerJson]] = Route("GET", "/api/v1/servers")
VERSIONS: Route[w.VersionsJson] = Route("GET", "/api/v1/versions")
RELEASE: Route[w.ReleaseJson] = Route("GET", "/api/v1/release")
SERVER_TOKEN: Route[w.TokenJson] = Route("POST", "/api/v1/servers/tokens")
REMOVE_SERVER: Route[w.ServerRemovedJson] = Route("DELETE", "/api/v1/servers/{}")

SETTINGS: Route[w.SettingsJson] = Route("GET", "/api/v1/config")
NODE_SETTINGS: Route[w.NodeSettingsJson] = Route("GET", "/api/v1/config")
SETTING: Route[w.SettingValueJson] = Route("GET", "/api/v1/config")
SET_SETTING: Route[w.SettingsJson] = Route("POST", "/api/v1/config")
SETTINGS_HISTORY: Route[list[w.SettingsChangeJson]] = Route("GET", "/api/v1/config/history")
ENGINES: Route[w.EnginesJson] = Route("GET", "/api/v1/engines")
SET_ENGINE: Route[w.EnginesJson] = Route("POST", "/api/v1/engines")
ENGINE_BUILD: Route[w.EnginesJson] = Route("POST", "/api/v1/nodes/{}/engine-build")
ENGINES_HISTORY: Route[list[w.EngineChangeJson]] = Route("GET", "/api/v1/engines/history")
FIREWALL: Route[w.FirewallJson] = Route("GET", "/api/v1/firewall")
SET_FIREWALL: Route[w.FirewallJson] = Route("POST", "/api/v1/firewall")
FIREWALL_HISTORY: Route[list[w.FirewallChangeJson]] = Route("GET", "/api/v1/firewall/history")
SLURM: Route[w.SlurmJson] = Route("GET", "/api/v1/slurm")
SLURM_CONF: Route[w.SlurmFilesJson] = Route("GET", "/api/v1/slurm/conf")
SLURM_SETUP: Route[w.SlurmJson] = Route("POST", "/api/v1/slurm/setup")
SLURM_LEND: Route[w.SlurmJson] = Route("POST", "/api/v1/slurm/lend")
SLURM_RECLAIM: Route[w.SlurmJson] = Route("POST", "/api/v1/slurm/reclaim")
SLURM_OFF: Route[w.SlurmJson] = Route("POST", "/api/v1/slurm/off")
SLURM_POLICY: Route[w.SlurmJson] = Route("POST", "/api/v1/slurm/policy")
MCP_SERVERS: Route[list[w.McpServerJson]] = Route("GET", "/api/v1/mcp/servers")
MCP_SERVER: Route[w.McpServerJson] = Route("GET", "/api/v1/mcp/servers/{}")
ADD_MCP: Route[w.McpServerJson] = Route("POST", "/api/v1/mcp/servers")
CHANGE_MCP: Route[w.McpServerJson] = Route("PATCH", "/api/v1/mcp/servers/{}")
REMOVE_MCP: Route[w.McpServerRemovedJson] = Route("DELETE", "/api/v1/mcp/servers/{}")
TEST_MCP: Route[w.McpTestJson] = Route("POST", "/api/v1/mcp/servers/{}/test")
# off, on: each answers the server as it now is.
SWITCH_MCP: Route[w.McpServerJson] = Route("POST", "/api/v1/mcp/servers/{}/{}")
FINETUNES: Route[list[w.FinetuneJson]] = Route("GET", "/api/v1/finetunes")
FINETUNE: Route[w.FinetuneJson] = Route("GET", "/api/v1/finetunes/{}")
CREATE_FINETUNE: Route[w.FinetuneJson] = Route("POST", "/api/v1/finetunes")
CANCEL_FINETUNE: Route[w.FinetuneJson] = Route("POST", "/api/v1/finetunes/{}/cancel")

RESTART: Route[w.RestartJson] = Route("POST", "/api/v1/restart")
RESTART_STATUS: Route[w.RestartJson] = Route("GET", "/api/v1/restart")
UPGRADE: Route[w.UpgradeJson] = Route("POST", "/api/v1/upgrade")
UPGRADE_STATUS: Route[w.UpgradeJson] = Route("GET", "/api/v1/upgrade")

ME: Route[w.MeJson] = Route("GET", "/api/v1/me")
PEOPLE: Route[list[w.PersonJson]] = Route("GET", "/api/v1/people")
PERSON: Route[w.PersonJson] = Route("GET", "/api/v1/people/{}")
CREATE_PERSON: Route[w.PersonJson] = Route("POST", "/api/v1/people")
CHANGE_PERSON: Route[w.PersonJson] = Route("POST", "/api/v1/people/{}")
PERSON_TOKENS: Route[list[w.PersonTokenJson]] = Route("GET", "/api/v1/people/{}/tokens")
CREATE_PERSON_TOKEN: Route[w.NewPersonTokenJson] = Route("POST", "/api/v1/people/{}/tokens")
REVOKE_PERSON_TOKEN: Route[w.PersonTokenJson] = Route("DELETE", "/api/v1/people/{}/tokens/{}")
ORGS: Route[list[w.OrgJson]] = Route("GET", "/api/v1/orgs")
ORG: Route[w.OrgJson] = Route("GET", "/api/v1/orgs/{}")
CREATE_ORG: Route[w.OrgJson] = Route("POST", "/api/v1/orgs")
RENAME_ORG: Route[w.OrgJson] = Route("POST", "/api/v1/orgs/{}")
REMOVE_ORG: Route[w.OrgJson] = Route("DELETE", "/api/v1/orgs/{}")
TEAMS: Route[list[w.TeamJson]] = Route("GET", "/api/v1/orgs/{}/teams")
CREATE_TEAM: Route[w.TeamJson] = Route("POST", "/api/v1/orgs/{}/teams")
REMOVE_TEAM: Route[w.TeamJson] = Route("DELETE", "/api/v1/orgs/{}/teams/{}")
PROJECTS: Route[list[w.ProjectJson]] = Route("GET", "/api/v1/orgs/{}/projects")
CREATE_PROJECT: Route[w.ProjectJson] = Route("POST", "/api/v1/orgs/{}/projects")
REMOVE_PROJECT: Route[w.ProjectJson] = Route("DELETE", "/api/v1/orgs/{}/projects/{}")
MEMBERS: Route[list[w.MembershipJson]] = Route("GET", "/api/v1/orgs/{}/members")
SET_MEMBER: Route[w.MembershipJson] = Route("POST", "/api/v1/orgs/{}/members")
REMOVE_MEMBER: Route[w.MembershipJson] = Route("DELETE", "/api/v1/orgs/{}/members/{}")
ORG_LIMITS: Route[w.LimitsSetJson] = Route("POST", "/api/v1/orgs/{}/limits")
TEAM_LIMITS: Route[w.LimitsSetJson] = Route("POST", "/api/v1/orgs/{}/teams/{}/limits")
PROJECT_LIMITS: Route[w.LimitsSetJson] = Route("POST", "/api/v1/orgs/{}/projects/{}/limits")
MCP_GRANTS: Route[list[w.McpGrantJson]] = Route("GET", "/api/v1/mcp/grants")
AUDIT: Route[list[w.AuditEntryJson]] = Route("GET", "/api/v1/audit")
DEVICE_LOGIN: Route[w.DeviceCodeJson] = Route("POST", "/api/v1/login/device")
DEVICE_TOKEN: Route[w.DeviceTokenJson] = Route("POST", "/api/v1/login/device/token")

FABRICS: Route[w.FabricsJson] = Route("GET", "/api/v1/fabrics")
FABRIC_MAP: Route[w.FabricMapJson] = Route("GET", "/api/v1/fabrics/{}/topology")
FABRIC_TEST: Route[w.FabricTestJson] = Route("POST", "/api/v1/fabric-tests")
NVLINK: Route[w.NvlinkJson] = Route("GET", "/api/v1/nvlink")

GUARD_POLICIES: Route[list[w.GuardPolicyJson]] = Route("GET", "/api/v1/guard/policies")
GUARD_POLICY: Route[w.GuardPolicyJson] = Route("GET", "/api/v1/guard/policies/{}")
ADD_GUARD_POLICY: Route[w.GuardPolicyJson] = Route("POST", "/api/v1/guard/policies")
REMOVE_GUARD_POLICY: Route[w.GuardPolicyJson] = Route("DELETE", "/api/v1/guard/policies/{}")
GUARD_DECISIONS: Route[list[w.GuardDecisionJson]] = Route("GET", "/api/v1/guard/decisions")
GUARD_JUDGE_CHECK: Route[list[w.GuardCheckJson]] = Route("POST", "/api/v1/guard/judges/check")
