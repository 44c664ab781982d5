"""A small client of the admin API for ``ctl``, ``node token``, ``node add`` and the
console.

It finds the control plane the way an operator expects: ``--server/--token`` first, then
``LLMGW_SERVER``/``LLMGW_TOKEN``, then the personal token ``llmgw login`` kept
(``credentials.py``), then, on the control plane machine, the data dir's admin token.
Synchronous and stdlib-only on purpose: a command line makes one call and exits.

Each route it calls is a ``Route``: its method, its path, and the shape of its answer
(``llmgw.wire.admin``); ``Route.read`` is the one place a decoded answer becomes that
shape. The server's answers are held to the same shapes by a test
(tests/server/api/test_answer_shapes.py), so what the callers read is checked both ways.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar, cast
from urllib.parse import quote, urlencode

from llmgw.client import credentials
from llmgw.config import (
    ConfigError,
    ServerConfig,
    default_data_dir,
    format_hostport,
    load,
    parse_hostport,
)
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


class AdminError(RuntimeError):
    """The admin API could not be reached or refused; the message says why. A refusal
    also carries its HTTP status and its error's ``type`` (``not_found``,
    ``authorization_pending``, ...)."""

    def __init__(self, message: str, kind: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass(frozen=True)
class AdminClient:
    base_url: str
    token: str
    timeout: float = 10.0

    def request(self, method: str, path: str, body: Body | None = None) -> object:
        """The decoded JSON answer of one call (null for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"authorization": f"Bearer {self.token}", "content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            kind = None
            try:
                said = json.loads(exc.read())["error"]
                message = said["message"]
                kind = str(said.get("type")) if said.get("type") else None
            except (ValueError, KeyError, TypeError, AttributeError):
                message = f"HTTP {exc.code}"
            raise AdminError(f"{self.base_url}{path}: {message}", kind, exc.code) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(
                f"cannot reach the control plane at {self.base_url}: {reason}; is "
                "`llmgw server run` running there?"
            ) from exc

    def stream(self, path: str) -> Iterator[object]:
        """Newline-delimited JSON from a GET, one value at a time, as it arrives."""
        req = urllib.request.Request(
            self.base_url + path, headers={"authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=None) as resp:
                for line in resp:
                    if line.strip():
                        yield json.loads(line)
        except urllib.error.HTTPError as exc:
            raise AdminError(f"{self.base_url}{path}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(f"lost the control plane at {self.base_url}: {exc}") from exc

    def get(self, path: str) -> object:
        return self.request("GET", path)

    def post(self, path: str, body: Body) -> object:
        return self.request("POST", path, body)

    def call(
        self,
        route: Route[T],
        *parts: str,
        body: Body | None = None,
        query: Query | None = None,
    ) -> T:
        """``route``'s answer, as its shape. A POST without a body sends ``{}``."""
        if route.method == "POST" and body is None:
            body = {}
        return route.read(self.request(route.method, route.at(*parts, query=query), body))

    # --- the cluster, its nodes and what runs on them

    def status(self) -> StatusJson:
        return self.call(STATUS)

    def nodes(self) -> list[NodeJson]:
        return self.call(NODES)

    def node(self, node_id: str) -> NodeJson:
        return self.call(NODE, node_id)

    def history(self, node_id: str, minutes: float = 60) -> HistoryJson:
        return self.call(HISTORY, node_id, query={"minutes": f"{minutes:g}"})

    def logs(self, node_id: str, source: str, n: int) -> list[str]:
        """The last ``n`` lines of the node's agent log (``source`` agent) or a shard's."""
        return self.call(LOGS, node_id, query={"source": source, "n": n})

    def follow_logs(self, node_id: str, source: str, n: int) -> Iterator[LogBatch]:
        """The last ``n`` lines, then each batch as it comes, until the node ends it."""
        query: Query = {"source": source, "n": n, "follow": "1"}
        for batch in self.stream(LOG_BATCH.at(node_id, query=query)):
            yield LOG_BATCH.read(batch)

    def mark(self, node_id: str, action: str, body: Body | None = None) -> NodeJson:
        """cordon, uncordon, drain, or labels (``{"set": {...}, "remove": [...]}``)."""
        return self.call(MARK, node_id, action, body=body)

    def start_shard(self, node_id: str, body: Body) -> ShardAskedJson:
        return self.call(START_SHARD, node_id, body=body)

    def stop_shard(self, node_id: str, replica_id: str) -> ShardAskedJson:
        return self.call(STOP_SHARD, node_id, replica_id)

    def replicas(self) -> list[ReplicaJson]:
        return self.call(REPLICAS)

    def weights(self, node: str | None = None) -> list[WeightsEntry]:
        return self.call(WEIGHTS, query={"node": node} if node else None)

    def collect(self, node: str | None = None) -> list[Collected]:
        return self.call(COLLECT, body={"node": node} if node else {})

    def node_token(self, ttl_seconds: int) -> TokenJson:
        return self.call(TOKEN, body={"ttl_seconds": ttl_seconds})

    # --- the catalog

    def models(self) -> list[ModelJson]:
        return self.call(MODELS)

    def model(self, name: str) -> ModelJson:
        return self.call(MODEL, name)

    def serve(self, body: Body) -> ModelJson:
        return self.call(SERVE, body=body)

    def add_external(self, body: Body) -> ModelJson:
        return self.call(EXTERNAL, body=body)

    def change_model(self, name: str, change: str, body: Body | None = None) -> ModelJson:
        """stop, start, restart, context, gpus or replicas: the model as it now is."""
        return self.call(CHANGE_MODEL, name, change, body=body)

    def remove_model(self, name: str, with_files: bool = False) -> ModelRemovedJson:
        return self.call(REMOVE_MODEL, name, query={"with_files": 1} if with_files else None)

    def explain(self, name: str) -> list[ExplainJson]:
        return self.call(EXPLAIN, name)

    def adapters(self, model: str) -> list[AdapterJson]:
        return self.call(ADAPTERS, model)

    def add_adapter(self, model: str, body: Body) -> list[AdapterJson]:
        return self.call(ADD_ADAPTER, model, body=body)

    def remove_adapter(self, model: str, adapter: str) -> list[AdapterJson]:
        return self.call(REMOVE_ADAPTER, model, adapter)

    def plan(self, query: Query) -> PlanJson:
        return self.call(PLAN, query=query)

    # --- the gateway's keys, usage and serving switch

    def keys(self) -> list[KeyJson]:
        return self.call(KEYS)

    def key(self, key_id: str) -> KeyJson:
        return self.call(KEY, key_id)

    def create_key(self, body: Body) -> NewKeyJson:
        return self.call(CREATE_KEY, body=body)

    def update_key(self, key_id: str, body: Body) -> KeyJson:
        return self.call(UPDATE_KEY, key_id, body=body)

    def revoke_key(self, key_id: str) -> KeyJson:
        return self.call(REVOKE_KEY, key_id)

    def set_serving(self, stopped: bool) -> ServingJson:
        return self.call(SERVING, body={"stopped": stopped})

    def usage(self, query: Query) -> list[UsageJson]:
        return self.call(USAGE, query=query)

    def usage_sums(self, query: Query) -> list[UsageSumJson]:
        """Usage summed per org, team, project, key or person (``by`` in the query)."""
        return self.call(USAGE_SUMS, query=query)

    def energy(self) -> list[EnergyJson]:
        return self.call(ENERGY)

    def rotate_admin_token(self) -> RotatedTokenJson:
        """A new admin token, answered this once; the old one ends everywhere."""
        return self.call(ROTATE_ADMIN_TOKEN)

    # --- control planes

    def servers(self) -> list[ServerJson]:
        return self.call(SERVERS)

    def server_token(self, ttl_seconds: int) -> TokenJson:
        return self.call(SERVER_TOKEN, body={"ttl_seconds": ttl_seconds})

    def remove_server(self, name: str) -> ServerRemovedJson:
        return self.call(REMOVE_SERVER, name)

    def versions(self) -> VersionsJson:
        """The llmgw every control plane and agent runs."""
        return self.call(VERSIONS)

    def release(self) -> ReleaseJson:
        """The release a new node or control plane gets, and its source."""
        return self.call(RELEASE)

    # --- the agents' settings and the fleet's engines

    def settings(self) -> SettingsJson:
        return self.call(SETTINGS)

    def node_settings(self, node: str) -> NodeSettingsJson:
        return self.call(NODE_SETTINGS, query={"node": node})

    def setting(self, key: str, node: str | None = None) -> SettingValueJson:
        return self.call(SETTING, query={"key": key, "node": node} if node else {"key": key})

    def set_setting(self, body: Body) -> SettingsJson:
        return self.call(SET_SETTING, body=body)

    def settings_history(self) -> list[SettingsChangeJson]:
        return self.call(SETTINGS_HISTORY)

    def engines(self) -> EnginesJson:
        return self.call(ENGINES)

    def set_engine(self, body: Body) -> EnginesJson:
        return self.call(SET_ENGINE, body=body)

    def engine_build(self, node_id: str, build: str) -> EnginesJson:
        return self.call(ENGINE_BUILD, node_id, body={"build": build})

    def engines_history(self) -> list[EngineChangeJson]:
        return self.call(ENGINES_HISTORY)

    def firewall(self) -> FirewallJson:
        return self.call(FIREWALL)

    def set_firewall(self, body: Body) -> FirewallJson:
        return self.call(SET_FIREWALL, body=body)

    def firewall_history(self) -> list[FirewallChangeJson]:
        return self.call(FIREWALL_HISTORY)

    # --- Slurm beside llmgw

    def slurm(self) -> SlurmJson:
        return self.call(SLURM)

    def slurm_conf(self) -> SlurmFilesJson:
        return self.call(SLURM_CONF)

    def slurm_setup(self, body: Body) -> SlurmJson:
        return self.call(SLURM_SETUP, body=body)

    def slurm_lend(self, nodes: list[str]) -> SlurmJson:
        return self.call(SLURM_LEND, body={"nodes": nodes})

    def slurm_reclaim(self, nodes: list[str]) -> SlurmJson:
        return self.call(SLURM_RECLAIM, body={"nodes": nodes})

    def slurm_off(self, now: bool) -> SlurmJson:
        return self.call(SLURM_OFF, body={"now": now})

    def slurm_policy(self, body: Body) -> SlurmJson:
        return self.call(SLURM_POLICY, body=body)

    # --- llmgw restart

    def restart(self) -> RestartJson:
        return self.call(RESTART)

    def restart_status(self) -> RestartJson:
        return self.call(RESTART_STATUS)

    # --- people, their tokens, organisations and the audit log

    def me(self) -> MeJson:
        return self.call(ME)

    def people(self) -> list[PersonJson]:
        return self.call(PEOPLE)

    def person(self, ref: str) -> PersonJson:
        return self.call(PERSON, ref)

    def create_person(self, body: Body) -> PersonJson:
        return self.call(CREATE_PERSON, body=body)

    def change_person(self, ref: str, body: Body) -> PersonJson:
        return self.call(CHANGE_PERSON, ref, body=body)

    def person_tokens(self, ref: str) -> list[PersonTokenJson]:
        return self.call(PERSON_TOKENS, ref)

    def create_person_token(self, ref: str, body: Body) -> NewPersonTokenJson:
        return self.call(CREATE_PERSON_TOKEN, ref, body=body)

    def revoke_person_token(self, ref: str, token_id: str) -> PersonTokenJson:
        return self.call(REVOKE_PERSON_TOKEN, ref, token_id)

    def orgs(self) -> list[OrgJson]:
        return self.call(ORGS)

    def org(self, ref: str) -> OrgJson:
        return self.call(ORG, ref)

    def create_org(self, name: str) -> OrgJson:
        return self.call(CREATE_ORG, body={"name": name})

    def rename_org(self, ref: str, name: str) -> OrgJson:
        return self.call(RENAME_ORG, ref, body={"name": name})

    def remove_org(self, ref: str) -> OrgJson:
        return self.call(REMOVE_ORG, ref)

    def org_teams(self, org: str) -> list[TeamJson]:
        return self.call(TEAMS, org)

    def create_team(self, org: str, name: str) -> TeamJson:
        return self.call(CREATE_TEAM, org, body={"name": name})

    def remove_team(self, org: str, team: str) -> TeamJson:
        return self.call(REMOVE_TEAM, org, team)

    def org_projects(self, org: str) -> list[ProjectJson]:
        return self.call(PROJECTS, org)

    def create_project(self, org: str, team: str, name: str) -> ProjectJson:
        return self.call(CREATE_PROJECT, org, body={"name": name, "team": team})

    def remove_project(self, org: str, project: str) -> ProjectJson:
        return self.call(REMOVE_PROJECT, org, project)

    def org_members(self, org: str) -> list[MembershipJson]:
        return self.call(MEMBERS, org)

    def set_member(self, org: str, body: Body) -> MembershipJson:
        return self.call(SET_MEMBER, org, body=body)

    def remove_member(self, org: str, person: str, team: str | None = None) -> MembershipJson:
        return self.call(REMOVE_MEMBER, org, person, query={"team": team} if team else None)

    def set_limits(
        self, body: Body, org: str, team: str | None = None, project: str | None = None
    ) -> LimitsJson:
        """An organisation's limits, or with ``team`` or ``project`` one of its own."""
        if team is not None:
            return self.call(TEAM_LIMITS, org, team, body=body)
        if project is not None:
            return self.call(PROJECT_LIMITS, org, project, body=body)
        return self.call(ORG_LIMITS, org, body=body)

    def audit(self, query: Query) -> list[AuditEntryJson]:
        return self.call(AUDIT, query=query)

    def device_login(self, client: str) -> DeviceCodeJson:
        """Start ``llmgw login``: a code for its person to approve (needs no token)."""
        return self.call(DEVICE_LOGIN, body={"client": client})

    def device_token(self, device_code: str) -> DeviceTokenJson:
        """The approved code's personal token, once; else an ``AdminError`` whose
        ``kind`` is ``authorization_pending`` while its person has not answered."""
        return self.call(DEVICE_TOKEN, body={"device_code": device_code})

    # --- fabrics and NVLink

    def fabrics(self) -> FabricsJson:
        return self.call(FABRICS)

    def fabric_map(self, fabric_id: str) -> FabricMapJson:
        return self.call(FABRIC_MAP, fabric_id)

    def fabric_test(self, body: Body) -> FabricTestJson:
        return self.call(FABRIC_TEST, body=body)

    def nvlink(self) -> NvlinkJson:
        return self.call(NVLINK)


def local_url(listen: str) -> str:
    """The URL a client on this machine uses for a listener bound to ``listen``."""
    host, port = parse_hostport(listen)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{format_hostport(host, port)}"


def resolve(server: str | None, token: str | None, data_dir: Path | None) -> AdminClient:
    """The client ctl uses: ``--server/--token``, then ``LLMGW_SERVER/LLMGW_TOKEN``,
    then what ``llmgw login`` kept (for its own server), then the data dir's."""
    server = server or os.environ.get("LLMGW_SERVER")
    token = token or os.environ.get("LLMGW_TOKEN")
    saved = credentials.read() if not (server and token) else None
    if saved is not None:
        # The server signed in to, with its token unless another was given.
        server = server or saved.server
        if not token and credentials.base_url(server) == saved.server:
            token = saved.token
    root = data_dir or default_data_dir()
    if not server or not token:
        config_path = root / "server.yaml"
        token_path = root / "admin.token"
        if not config_path.exists() or not token_path.exists():
            raise AdminError(
                "no control plane to talk to: pass --server HOST:PORT and --token TOKEN, set "
                f"LLMGW_SERVER and LLMGW_TOKEN, or run on the control plane machine "
                f"(looked in data dir {root}; --data-dir or LLMGW_DATA_DIR to change it)"
            )
        try:
            config = load(ServerConfig, config_path)
        except ConfigError as exc:
            raise AdminError(str(exc)) from exc
        server = server or local_url(config.admin_listen or config.listen)
        try:
            token = token or token_path.read_text().strip()
        except PermissionError as exc:
            raise AdminError(f"cannot read {token_path}: run as its owner (or root)") from exc
    return AdminClient(credentials.base_url(server), token)
