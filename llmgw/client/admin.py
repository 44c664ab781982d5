"""A small client of the admin API for ``ctl``, ``node token``, ``node add`` and the
console.

It finds the control plane the way an operator expects: ``--server/--token`` first, then
``LLMGW_SERVER``/``LLMGW_TOKEN``, then the personal token ``llmgw login`` kept
(``credentials.py``), then, on the control plane machine, the data dir's admin token.
Synchronous and stdlib-only on purpose: a command line makes one call and exits.

Each route it calls is a ``Route`` (``routes.py``): its method, its path, and the shape
of its answer (``llmgw.wire.admin``); ``Route.read`` is the one place a decoded answer
becomes that shape. The server's answers are held to the same shapes by a test
(tests/server/api/test_answer_shapes.py), so what the callers read is checked both ways.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from llmgw.client import credentials
from llmgw.client import routes as r
from llmgw.client.adminbase import AdminError
from llmgw.client.adminpeople import PeopleCalls
from llmgw.client.routes import Body, Query
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
    Collected,
    EnergyJson,
    EngineChangeJson,
    EnginesJson,
    ExplainJson,
    ExploreJson,
    ExploreRepoJson,
    FabricMapJson,
    FabricsJson,
    FabricTestJson,
    FinetuneJson,
    FirewallChangeJson,
    FirewallJson,
    GuardCheckJson,
    GuardDecisionJson,
    GuardPolicyJson,
    HistoryJson,
    JobJson,
    KeyJson,
    LimitsSetJson,
    LogBatch,
    McpGrantJson,
    McpServerJson,
    McpServerRemovedJson,
    McpTestJson,
    ModelJson,
    ModelRemovedJson,
    NewKeyJson,
    NodeJson,
    NodeSettingsJson,
    NvlinkJson,
    PlanJson,
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
    TokenJson,
    UpgradeJson,
    UsageJson,
    UsageSumJson,
    VersionsJson,
    WeightsEntry,
)

# How long ``guard judge check`` is waited for (its judgments are bounded by the control
# plane: three times the policy's wait, at least 10 s, each).
JUDGE_CHECK_WAIT = 900.0


class AdminClient(PeopleCalls):
    """Every call of the admin API that ``ctl``, ``node add`` and the console make."""

    # --- the cluster, its nodes and what runs on them

    def status(self) -> StatusJson:
        return self.call(r.STATUS)

    def nodes(self) -> list[NodeJson]:
        return self.call(r.NODES)

    def node(self, node_id: str) -> NodeJson:
        return self.call(r.NODE, node_id)

    def history(self, node_id: str, minutes: float = 60) -> HistoryJson:
        return self.call(r.HISTORY, node_id, query={"minutes": f"{minutes:g}"})

    def logs(self, node_id: str, source: str, n: int) -> list[str]:
        """The last ``n`` lines of the node's agent log (``source`` agent) or a shard's."""
        return self.call(r.LOGS, node_id, query={"source": source, "n": n})

    def follow_logs(self, node_id: str, source: str, n: int) -> Iterator[LogBatch]:
        """The last ``n`` lines, then each batch as it comes, until the node ends it."""
        query: Query = {"source": source, "n": n, "follow": "1"}
        for batch in self.stream(r.LOG_BATCH.at(node_id, query=query)):
            yield r.LOG_BATCH.read(batch)

    def mark(self, node_id: str, action: str, body: Body | None = None) -> NodeJson:
        """cordon, uncordon, drain, or labels (``{"set": {...}, "remove": [...]}``)."""
        return self.call(r.MARK, node_id, action, body=body)

    def start_shard(self, node_id: str, body: Body) -> ShardAskedJson:
        return self.call(r.START_SHARD, node_id, body=body)

    def stop_shard(self, node_id: str, replica_id: str) -> ShardAskedJson:
        return self.call(r.STOP_SHARD, node_id, replica_id)

    def replicas(self) -> list[ReplicaJson]:
        return self.call(r.REPLICAS)

    def weights(self, node: str | None = None) -> list[WeightsEntry]:
        return self.call(r.WEIGHTS, query={"node": node} if node else None)

    def collect(self, node: str | None = None) -> list[Collected]:
        return self.call(r.COLLECT, body={"node": node} if node else {})

    def node_token(self, ttl_seconds: int) -> TokenJson:
        return self.call(r.TOKEN, body={"ttl_seconds": ttl_seconds})

    # --- the catalog

    def models(self) -> list[ModelJson]:
        return self.call(r.MODELS)

    def model(self, name: str) -> ModelJson:
        return self.call(r.MODEL, name)

    def serve(self, body: Body) -> ModelJson:
        return self.call(r.SERVE, body=body)

    def add_external(self, body: Body) -> ModelJson:
        return self.call(r.EXTERNAL, body=body)

    def change_model(self, name: str, change: str, body: Body | None = None) -> ModelJson:
        """stop, start, restart, context, gpus or replicas: the model as it now is."""
        return self.call(r.CHANGE_MODEL, name, change, body=body)

    def remove_model(self, name: str, with_files: bool = False) -> ModelRemovedJson:
        return self.call(r.REMOVE_MODEL, name, query={"with_files": 1} if with_files else None)

    def explain(self, name: str) -> list[ExplainJson]:
        return self.call(r.EXPLAIN, name)

    def adapters(self, model: str) -> list[AdapterJson]:
        return self.call(r.ADAPTERS, model)

    def add_adapter(self, model: str, body: Body) -> list[AdapterJson]:
        return self.call(r.ADD_ADAPTER, model, body=body)

    def remove_adapter(self, model: str, adapter: str) -> list[AdapterJson]:
        return self.call(r.REMOVE_ADAPTER, model, adapter)

    def plan(self, query: Query) -> PlanJson:
        return self.call(r.PLAN, query=query)

    def jobs(self, model: str | None = None, limit: int = 50) -> list[JobJson]:
        query: Query = {"limit": limit, **({"model": model} if model else {})}
        return self.call(r.JOBS, query=query)

    def job(self, job_id: str) -> JobJson:
        return self.call(r.JOB, job_id)

    def explore(self, query: Query) -> ExploreJson:
        return self.call(r.EXPLORE, query=query)

    def explore_repo(self, repo: str) -> ExploreRepoJson:
        org, _, name = repo.partition("/")
        return self.call(r.EXPLORE_REPO, org, name)

    # --- the gateway's keys, usage and serving switch

    def keys(self) -> list[KeyJson]:
        return self.call(r.KEYS)

    def key(self, key_id: str) -> KeyJson:
        return self.call(r.KEY, key_id)

    def create_key(self, body: Body) -> NewKeyJson:
        return self.call(r.CREATE_KEY, body=body)

    def update_key(self, key_id: str, body: Body) -> KeyJson:
        return self.call(r.UPDATE_KEY, key_id, body=body)

    def set_key_limits(self, key_id: str, body: Body) -> LimitsSetJson:
        """A key's own limits, MCP tools and guard policies."""
        return self.call(r.KEY_LIMITS, key_id, body=body)

    def mcp_grants(self, server: str | None = None) -> list[McpGrantJson]:
        """Every level and key that names MCP tools; with ``server``, those reaching it."""
        return self.call(r.MCP_GRANTS, query={"server": server} if server else None)

    def revoke_key(self, key_id: str) -> KeyJson:
        return self.call(r.REVOKE_KEY, key_id)

    def set_serving(self, stopped: bool) -> ServingJson:
        return self.call(r.SERVING, body={"stopped": stopped})

    def usage(self, query: Query) -> list[UsageJson]:
        return self.call(r.USAGE, query=query)

    def usage_sums(self, query: Query) -> list[UsageSumJson]:
        """Usage summed per org, team, project, key or person (``by`` in the query)."""
        return self.call(r.USAGE_SUMS, query=query)

    def energy(self) -> list[EnergyJson]:
        return self.call(r.ENERGY)

    def rotate_admin_token(self) -> RotatedTokenJson:
        """A new admin token, answered this once; the old one ends everywhere."""
        return self.call(r.ROTATE_ADMIN_TOKEN)

    # --- control planes

    def servers(self) -> list[ServerJson]:
        return self.call(r.SERVERS)

    def server_token(self, ttl_seconds: int) -> TokenJson:
        return self.call(r.SERVER_TOKEN, body={"ttl_seconds": ttl_seconds})

    def remove_server(self, name: str) -> ServerRemovedJson:
        return self.call(r.REMOVE_SERVER, name)

    def versions(self) -> VersionsJson:
        """The llmgw every control plane and agent runs."""
        return self.call(r.VERSIONS)

    def release(self) -> ReleaseJson:
        """The release a new node or control plane gets, and its source."""
        return self.call(r.RELEASE)

    # --- the agents' settings and the fleet's engines

    def settings(self) -> SettingsJson:
        return self.call(r.SETTINGS)

    def node_settings(self, node: str) -> NodeSettingsJson:
        return self.call(r.NODE_SETTINGS, query={"node": node})

    def setting(self, key: str, node: str | None = None) -> SettingValueJson:
        return self.call(r.SETTING, query={"key": key, "node": node} if node else {"key": key})

    def set_setting(self, body: Body) -> SettingsJson:
        return self.call(r.SET_SETTING, body=body)

    def settings_history(self) -> list[SettingsChangeJson]:
        return self.call(r.SETTINGS_HISTORY)

    def engines(self) -> EnginesJson:
        return self.call(r.ENGINES)

    def set_engine(self, body: Body) -> EnginesJson:
        return self.call(r.SET_ENGINE, body=body)

    def engine_build(self, node_id: str, build: str) -> EnginesJson:
        return self.call(r.ENGINE_BUILD, node_id, body={"build": build})

    def engines_history(self) -> list[EngineChangeJson]:
        return self.call(r.ENGINES_HISTORY)

    def firewall(self) -> FirewallJson:
        return self.call(r.FIREWALL)

    def set_firewall(self, body: Body) -> FirewallJson:
        return self.call(r.SET_FIREWALL, body=body)

    def firewall_history(self) -> list[FirewallChangeJson]:
        return self.call(r.FIREWALL_HISTORY)

    # --- guard policies

    def guard_policies(self) -> list[GuardPolicyJson]:
        return self.call(r.GUARD_POLICIES)

    def guard_policy(self, name: str) -> GuardPolicyJson:
        return self.call(r.GUARD_POLICY, name)

    def add_guard_policy(self, body: Body) -> GuardPolicyJson:
        return self.call(r.ADD_GUARD_POLICY, body=body)

    def remove_guard_policy(self, name: str) -> GuardPolicyJson:
        return self.call(r.REMOVE_GUARD_POLICY, name)

    def guard_decisions(self, policy: str | None = None) -> list[GuardDecisionJson]:
        return self.call(r.GUARD_DECISIONS, query={"policy": policy} if policy else None)

    def guard_judge_check(self, policy: str | None = None) -> list[GuardCheckJson]:
        # Eleven timed judgments a policy, each bounded by the control plane: longer
        # than any other call's 10 s, so waited for as long as a slow judge takes.
        body = {"policy": policy} if policy else {}
        return self.call(r.GUARD_JUDGE_CHECK, body=body, timeout=JUDGE_CHECK_WAIT)

    # --- Slurm beside llmgw

    def slurm(self) -> SlurmJson:
        return self.call(r.SLURM)

    def slurm_conf(self) -> SlurmFilesJson:
        return self.call(r.SLURM_CONF)

    def slurm_setup(self, body: Body) -> SlurmJson:
        return self.call(r.SLURM_SETUP, body=body)

    def slurm_lend(self, nodes: list[str]) -> SlurmJson:
        return self.call(r.SLURM_LEND, body={"nodes": nodes})

    def slurm_reclaim(self, nodes: list[str]) -> SlurmJson:
        return self.call(r.SLURM_RECLAIM, body={"nodes": nodes})

    def slurm_off(self, now: bool) -> SlurmJson:
        return self.call(r.SLURM_OFF, body={"now": now})

    def slurm_policy(self, body: Body) -> SlurmJson:
        return self.call(r.SLURM_POLICY, body=body)

    # --- MCP tool servers (ctl mcp)

    def mcp_servers(self) -> list[McpServerJson]:
        return self.call(r.MCP_SERVERS)

    def mcp_server(self, name: str) -> McpServerJson:
        return self.call(r.MCP_SERVER, name)

    def add_mcp(self, body: Body) -> McpServerJson:
        return self.call(r.ADD_MCP, body=body)

    def change_mcp(self, name: str, body: Body) -> McpServerJson:
        return self.call(r.CHANGE_MCP, name, body=body)

    def remove_mcp(self, name: str) -> McpServerRemovedJson:
        return self.call(r.REMOVE_MCP, name)

    def test_mcp(self, name: str) -> McpTestJson:
        return self.call(r.TEST_MCP, name)

    def switch_mcp(self, name: str, on: bool) -> McpServerJson:
        return self.call(r.SWITCH_MCP, name, "on" if on else "off")

    # --- fine-tune jobs (ctl finetune)

    def finetunes(self) -> list[FinetuneJson]:
        return self.call(r.FINETUNES)

    def finetune(self, job_id: str) -> FinetuneJson:
        return self.call(r.FINETUNE, job_id)

    def create_finetune(self, body: Body) -> FinetuneJson:
        return self.call(r.CREATE_FINETUNE, body=body)

    def cancel_finetune(self, job_id: str) -> FinetuneJson:
        return self.call(r.CANCEL_FINETUNE, job_id)

    # --- llmgw restart

    def restart(self) -> RestartJson:
        return self.call(r.RESTART)

    def restart_status(self) -> RestartJson:
        return self.call(r.RESTART_STATUS)

    # --- llmgw ctl upgrade

    def upgrade(self, body: Body) -> UpgradeJson:
        return self.call(r.UPGRADE, body=body)

    def upgrade_status(self) -> UpgradeJson:
        return self.call(r.UPGRADE_STATUS)

    # --- fabrics and NVLink

    def fabrics(self) -> FabricsJson:
        return self.call(r.FABRICS)

    def fabric_map(self, fabric_id: str) -> FabricMapJson:
        return self.call(r.FABRIC_MAP, fabric_id)

    def fabric_test(self, body: Body) -> FabricTestJson:
        return self.call(r.FABRIC_TEST, body=body)

    def nvlink(self) -> NvlinkJson:
        return self.call(r.NVLINK)


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
                "no control plane to talk to: pass --server HOST:PORT and --token r.TOKEN, set "
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
