"""The control plane put together: every service, each handed its collaborators (``process.py``
runs it to a signal)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from llmgw import __version__, pki
from llmgw.config import ServerConfig, format_hostport, parse_hostport
from llmgw.modelkit.sizing import ModelShape
from llmgw.offline.mirrorfiles import MirrorFiles
from llmgw.server.admintokens import AdminTokens
from llmgw.server.admission import JoinTokens
from llmgw.server.api import (
    AdminApp,
    Gate,
    Ops,
    adapters,
    admintoken,
    build_app,
    cluster,
    engines,
    explore,
    fabrics,
    finetunes,
    firewall,
    grants,
    guard,
    jobs,
    keys,
    ldap,
    login,
    mcp,
    models,
    nvlink,
    openapi,
    people,
    plan,
    releases,
    replicas,
    restart,
    scim,
    servers,
    settings,
    signin,
    slurm,
    upgrade,
)
from llmgw.server.audittrail import AuditTrail
from llmgw.server.catalog.adapters import request_names
from llmgw.server.catalog.explore import explore_service
from llmgw.server.catalog.inspector import make_inspector
from llmgw.server.catalog.planner import Planner
from llmgw.server.catalog.reconciler import Reconciler
from llmgw.server.catalog.service import CatalogHooks, ModelService
from llmgw.server.catalog.views import ModelViews
from llmgw.server.datadir import DataDir
from llmgw.server.finetune.service import FinetuneService
from llmgw.server.fleet.agentport import AgentPort
from llmgw.server.fleet.agentsettings import AgentSettings
from llmgw.server.fleet.engines import FleetEngines
from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.fabrics import FabricWatch
from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.fleet.firewall import FleetFirewall
from llmgw.server.fleet.registry import NodeRegistry, RegistryHooks
from llmgw.server.fleet.service import FleetService
from llmgw.server.front import (
    Listener,
)
from llmgw.server.gateway import Gateway, KeyService, ServingSwitch
from llmgw.server.gateway.kvroute import KvIndex
from llmgw.server.gateway.service import bounds_of
from llmgw.server.guard.judge import Judge
from llmgw.server.guard.service import GuardService
from llmgw.server.ha.demand import DemandRelay
from llmgw.server.ha.joining import Admission
from llmgw.server.ha.leadership import Hooks, Leadership
from llmgw.server.ha.membership import Membership
from llmgw.server.ha.peerlink import PeerListener
from llmgw.server.ha.seat import peer_client, seat_of
from llmgw.server.ha.toleader import ToLeader
from llmgw.server.ldap.service import LdapService
from llmgw.server.leader import Duty, LeaderWork
from llmgw.server.mcp.admintools import AdminTools, plane_of
from llmgw.server.mcp.parts import mcp_parts
from llmgw.server.mirror import MirrorWatch, release_source, self_url
from llmgw.server.pages import site
from llmgw.server.pages.frame import Services
from llmgw.server.people.devicelogin import DeviceLogins
from llmgw.server.people.directory import Directory
from llmgw.server.people.oidcflow import OidcFlow
from llmgw.server.people.oidcsettings import OidcSettings
from llmgw.server.people.orgs import OrgService
from llmgw.server.people.service import PeopleService
from llmgw.server.people.signins import SignIns
from llmgw.server.principal import Principal
from llmgw.server.pushed import Pushed
from llmgw.server.restart import cluster_restart
from llmgw.server.scim.service import TABLES as SCIM_TABLES
from llmgw.server.scim.service import ScimService
from llmgw.server.scrape import Scrape
from llmgw.server.sessions import Revocations, Sessions, SignOut
from llmgw.server.slurm.keeper import slurm_parts
from llmgw.server.store import Store
from llmgw.server.upgrade.keeper import upgrade_parts
from llmgw.tracing import start as start_tracing

log = logging.getLogger("llmgw.server")

# The tables of people and organisations: a standby reloads its directory when they change.
PEOPLE_TABLES = {"people", "orgs", "teams", "projects", "memberships", "person_tokens"}
# The control plane following the fleet's engine versions (ctl engines).
ENGINES = Principal.system("engines")


class ControlPlane:
    """Every service of the control plane, each handed its collaborators as it is built.

    The order follows who needs whom: the registry first (its reports wake the
    reconcile loop and feed the router's KV index, both made before it), then the
    fleet's engines and fabrics, which the reconciler reads, the catalog over them,
    the gateway over the catalog, and the services the API and pages call. Callbacks
    into this object (``_write_usage``, ``_settings_changed``...) read what they need
    when they are called, so no service is finished off after it is built."""

    def __init__(self, data: DataDir, config: ServerConfig, store: Store) -> None:
        self.data = data
        self.config = config
        self.store = store
        self.cluster_secret = data.cluster_secret()
        self.metrics_token = data.metrics_token()
        self.ca = data.ca()
        self.ca_fingerprint = pki.fingerprint(self.ca.cert_pem)
        _, http_port = parse_hostport(config.listen)
        self.api_addresses = [format_hostport(a, http_port) for a in config.advertise]
        self.agent_addresses = [format_hostport(a, config.agent_port) for a in config.advertise]
        # The admin token: which open the admin API and pages; rotating it.
        self.admin_tokens = AdminTokens(store, lambda: self.ha.leading, data.admin_token)
        self.started = time.time()
        self.tracing = start_tracing(config.tracing, "llmgw-server")
        self.stopping = asyncio.Event()
        # Why this control plane stops to start again in place (``relaunch``), or None.
        self.relaunch_reason: str | None = None
        self.agent_port: AgentPort | None = None
        self.listeners: list[Listener] = []
        # offline.mirror: DATA_DIR/mirror at /mirror/; mirror.api and mirror.peers (15 s).
        self.mirror = MirrorFiles(data.root / "mirror") if config.offline.mirror else None
        self.mirror_watch = MirrorWatch(config.mirror, self.mirror)
        self._background: set[asyncio.Task[None]] = set()
        # The reconcile loop's wake-up: each change of the catalog or a node that matters.
        wake = asyncio.Event()
        # vLLM replicas' KV-cache blocks, as their agents report them, for routing.
        kv = KvIndex()
        self.registry = NodeRegistry(
            store,
            config.heartbeat_interval,
            config.missed_heartbeats,
            RegistryHooks(
                changed=wake.set,
                kv_blocks=kv.apply,
                finetune=lambda node, msg: self.finetunes.report(node, msg),
            ),
        )
        # The agents' settings the cluster decides (ctl config).
        self.agent_settings = AgentSettings(store, on_change=self._settings_changed)
        # The engines the fleet runs (server.yaml's engines:, ctl engines over it).
        self.engines = FleetEngines(store, config.engines, on_change=self._engines_changed)
        # llmgw's firewall on every node (server.yaml's firewall:, the API's over it).
        self.firewall = FleetFirewall(store, config.firewall, on_change=self._settings_changed)
        # The InfiniBand fabrics, from what the nodes' ports see.
        self.fabric_watch = FabricWatch()
        self.fabric_maps = FabricMaps(self.registry, self.fabric_watch)
        self.fleet = FleetService(self.registry, self.cluster_secret)
        self.fabrics = FabricService(self.fabric_watch, self.fabric_maps, self.registry)
        own_hub = self_url(config.listen) + "/mirror/hf" if self.mirror is not None else None
        self.inspector = make_inspector(self.registry, own_hub)
        self.reconciler = Reconciler(
            config.scheduling, self.engines.version_of, self.fabric_maps.wiring
        )
        self.models = ModelService(
            store,
            self.registry,
            self.reconciler,
            config.scheduling,
            self.cluster_secret,
            wake,
            CatalogHooks(
                inspect=self.inspect_shape,
                remove_files=self.fleet.remove_source,
                vouched=self.mirror_watch.vouched,
                hub_for=self.mirror_watch.hub_for,
                finetuned=lambda model, name: self.finetunes.servable(model, name),
                tracing=self.tracing,
            ),
        )
        self.planner = Planner(self.inspector, self.models.room, self.registry)
        self.explore = explore_service(self.registry, self.models.room, self.agent_settings)
        self.finetunes = FinetuneService(store, self.registry, lambda: self.models.models)
        # The gateway is made below: the views read what it routes to when asked.
        self.views = ModelViews(
            self.models.models,
            self.reconciler,
            lambda: self.models.passes,
            self.registry,
            lambda name: self.gateway.endpoints_of(name),
        )
        # llmgw:admin, the tool server answered here (the MCP gateway lists it).
        self.admin_tools = AdminTools(
            self.fleet, self.views, self.models, lambda: plane_of(self.status())
        )
        # People, organisations, teams and projects: who is who, and their services.
        self.directory = Directory(store)
        # What only the leader's store takes (a standby sends it there); tool and guard audit.
        self.to_leader = ToLeader(store, lambda: self.ha)
        self.audit_trail = AuditTrail(self.to_leader.audit)
        # Guard policies: read the prompts and tool calls of keys that name them.
        self.guard = GuardService(
            store,
            lambda: self.models.models,
            Judge(lambda: self.gateway.router, lambda: self.gateway.upstream.pool),
            self.audit_trail,
        )
        # MCP tool servers behind the gateway's /mcp (ctl mcp).
        self.mcp = mcp_parts(
            store,
            self.audit_trail,
            self.cluster_secret,
            lambda: self.gateway.upstream.session,
            builtins=[self.admin_tools],
            guard=self.guard,
        )
        self.gateway = Gateway(
            store,
            self.registry,
            self.models,
            self.cluster_secret,
            config.gateway,
            self._demand,
            kv=kv,
            # Counted on a standby, usage goes to the leader; on the leader, to the store.
            write_usage=self.to_leader.usage,
            tree=lambda: self.directory.now,
            guard=self.guard,
            mcp=self.mcp.gateway,
            tracing=self.tracing,
        )
        # Slurm beside llmgw (ctl slurm): its settings, workflows and the leader's keeper.
        self.slurm = slurm_parts(
            store,
            self.cluster_secret,
            self.registry,
            self.fleet,
            self.models,
            self.gateway.router,
            self.gateway.queue,
            self.reconciler,
        )
        self.people = PeopleService(self.directory)
        self.orgs = OrgService(
            self.directory, changed=self.gateway.keys.relevel, keys=self.gateway.keys
        )
        self.oidc = OidcSettings(store, self.directory, self.cluster_secret)
        self.oidc_flow = OidcFlow(self.oidc, self.people, self.cluster_secret)
        self.device_logins = DeviceLogins(self.people, self.directory)
        self.ldap = LdapService(store, self.people, self.cluster_secret, lambda: self.ha.leading)
        # SCIM provisioning: the identity provider's users and groups (/scim/v2).
        self.scim = ScimService.over(self.directory, self.people)
        self.keys = KeyService(
            store,
            self.gateway.keys,
            self.gateway.flush,
            self.gateway.metrics.replica_tokens,
            lambda replica: self.registry.energy.joules.get(replica, 0.0),
            self.directory,
        )
        self.serving = ServingSwitch(store, self._apply_stopped)
        self.scrape = Scrape(
            self.gateway,
            self.models,
            self.views,
            self.registry,
            self.fabric_watch,
            self.slurm.service,
            self.agent_settings.fleet_detail,
        )
        self.tokens = JoinTokens(
            store,
            self.cluster_secret,
            self.ca,
            self.api_addresses,
            self.agent_addresses,
            self.registry.enrolled,
        )
        # What each node is told of the cluster's decisions, over its stream.
        self.pushed_for = Pushed(
            config,
            self.agent_settings,
            self.engines,
            self.firewall,
            self.slurm.service,
            self.mirror,
            self.api_addresses,
            lambda: self.agent_port.control_planes() if self.agent_port else [],
            self.metrics_token,
        )
        self.upgrades = upgrade_parts(
            store, self.registry, lambda: self.ha, self.relaunch, self.release_source
        )
        self.leader = LeaderWork(
            [
                Duty("reconciler", self.models.run),
                Duty("usage", self.gateway.run, self.gateway.flush),
                Duty("audit trail", self.audit_trail.run, self.audit_trail.flush),
                Duty("node states", self.registry.monitor, self.registry.flush),
                Duty("fabric maps", self.fabric_maps.run),
                self.slurm.duty(),
                self.upgrades.duty(),
                Duty("fine-tunes", self.finetunes.run, self.finetunes.flush),
            ]
        )
        self.ha = self._leadership()
        # A standby's on-demand requests, for the leader's catalog.
        self.demand_relay = DemandRelay(self.ha.client, lambda: self.ha.follower.leader)
        self.members = Membership(self.ha, self.admission)
        # `llmgw restart`: the agents, the other control planes, then this one.
        self.restarts = cluster_restart(self.registry, self.ha, store, self.relaunch)
        # The pages' sessions, one set for every listener; sign-outs go through the store.
        self.sessions = Sessions(self.cluster_secret, self.admin_tokens.hashes)
        self.revocations = Revocations(
            self.sessions, store, lambda: self.ha.leading, self.to_leader.sign_out
        )
        self.peer_listener: PeerListener | None = None

    def _leadership(self) -> Leadership:
        config, data = self.config, self.data
        seat = seat_of(config, data, self.api_addresses, self.agent_addresses)
        hooks = Hooks(
            applied=self.reload,
            followed=self.registry.follow,
            fleet=self.registry.followable,
            demand=self.models.demand,
            usage=self.gateway.take_usage,
            audit=self.store.audit_many,
            signed_out=lambda sid, expires, actor: self.revocations.record(
                SignOut(sid, expires, actor)
            ),
            remember=data.remember_role,
            standby_duties=lambda ha: [
                Duty("usage", self.gateway.run, self.gateway.flush),
                Duty("audit trail", self.audit_trail.run, self.audit_trail.flush),
                Duty("on-demand requests", self.demand_relay.run, self.demand_relay.close),
            ],
            announce=self._announce,
            stepped_down=self._stepped_down,
            key_counts=self.gateway.keys.counts,
            elsewhere=self.gateway.keys.heard,
        )
        ha = config.ha
        client = peer_client(data)
        return Leadership(
            self.store, seat, ha.role, ha.leader, client, self.leader, hooks, ha.lease_seconds
        )

    def _demand(self, model: str, start: bool) -> None:
        """A request for an on-demand model: the catalog's on the leader; a standby
        passes it to the leader, whose catalog places replicas."""
        if self.ha.leading:
            self.models.demand(model, start)
        else:
            self.demand_relay.ask(model, start)

    def _stepped_down(self, why: str) -> None:
        if self.agent_port is not None:
            self.agent_port.drop_all(f"this control plane no longer leads: {why}")

    def release_source(self) -> str:
        """Where new machines and ``ctl upgrade`` fetch llmgw (``GET /api/v1/release``)."""
        return release_source(self.mirror, self.api_addresses, self.config.releases.source)

    def _settings_changed(self) -> None:
        """ctl config or ctl engines changed something: every agent hears of it now."""
        if self.agent_port is not None:
            self._spawn(self.agent_port.push_settings())

    def _engines_changed(self, engine: str | None, old: str | None, new: str | None) -> None:
        """ctl engines: agents converge, and a changed version's replicas are replaced
        one at a time (placed where the new version is installed)."""
        self._settings_changed()
        if engine is not None and new is not None and old != new:
            detail = f"{engine} {old or 'unnamed'} -> {new}"
            self._spawn(self._follow_engine(engine, detail))

    async def _follow_engine(self, engine: str, detail: str) -> None:
        moved = await self.models.follow_engine(engine, detail, ENGINES)
        if moved:
            log.info("replacing the replicas of %s for %s", ", ".join(moved), detail)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _announce(self) -> None:
        if self.agent_port is not None:
            await self.agent_port.announce()

    async def reload(self, tables: set[str]) -> None:
        """A standby's store changed under it: take again what is kept in memory."""
        every = "*" in tables
        if every or "admin_tokens" in tables:
            await self.admin_tokens.load()
        if every or "api_keys" in tables:
            self.gateway.keys.load(await self.store.list_api_keys())
        if every or "models" in tables:
            await self.models.reload()
        if every or "settings" in tables:
            await self.serving.load()
            await self.agent_settings.load()
            await self.engines.load()
            await self.firewall.load()
            await self.oidc.load()
            await self.slurm.kept.load()
            await self.guard.load()
            await self.mcp.registry.load()
        if every or "nodes" in tables:
            await self.registry.reload_marks()
        if every or "finetunes" in tables:
            await self.finetunes.load()
        if every or "servers" in tables:
            await self.ha.reload_servers()
        if every or "session_revocations" in tables:
            await self.revocations.load()
        if every or tables & PEOPLE_TABLES:
            await self.directory.load()
            self.gateway.keys.relevel()  # their limits, on every control plane
        if every or tables & SCIM_TABLES:
            await self.scim.load()

    def relaunch(self, reason: str) -> None:
        """Stop serving, then start again in place (``llmgw.reexec``): after an upgrade
        swapped the zipapp, or for ``llmgw restart``. The engines keep serving."""
        log.info("starting again in place: %s", reason)
        self.relaunch_reason = reason
        self.stopping.set()

    async def load(self) -> None:
        await self.admin_tokens.load()
        await self.revocations.load()
        await self.directory.load()
        await self.scim.load()
        await self.registry.load()
        await self.models.load()
        await self.gateway.load()
        await self.agent_settings.load()
        await self.engines.load()
        await self.firewall.load()
        await self.oidc.load()
        await self.serving.load()
        await self.slurm.kept.load()
        await self.guard.load()
        await self.mcp.registry.load()

    def _apply_stopped(self, stopped: bool) -> None:
        """`llmgw stop`: /v1 refuses, every model goes to zero; the catalog is unchanged."""
        self.gateway.halt(stopped)
        self.models.halt(stopped)

    async def inspect_shape(self, source: str, allow_pickle: bool) -> ModelShape:
        """What a model is, read from the hub, the control plane's disk, or a node."""
        return (await self.inspector.inspect(source, allow_pickle=allow_pickle)).shape

    async def admission(self) -> Admission:
        return Admission(
            self.store,
            self.cluster_secret,
            self.ca,
            self.ha.state()["leader"],
            self.ha.term,
            {"backend": self.config.store.backend, "dsn": self.config.store.connection()},
        )

    def status(self) -> dict[str, Any]:
        port = self.agent_port
        writable = self.store.writable()
        return {
            "version": __version__,
            "uptime_seconds": round(time.time() - self.started, 1),
            "leader": self.leader.leading,
            "name": self.ha.name,
            "role": self.ha.role,
            "term": self.ha.state()["term"],
            "control_planes": self.members.counts(),
            "serving": "stopped" if self.gateway.stopped else "serving",
            "store": self.config.store.backend,
            "store_writable": writable.ok,
            "store_problem": writable.problem or None,
            "listen": self.config.listen,
            "agent_port": self.config.agent_port,
            "advertise": list(self.config.advertise),
            "ca_fingerprint": self.ca_fingerprint,
            "nodes": self.registry.counts(),
            "agent_streams": len(port.connections) if port else 0,
            "heartbeats": self.registry.heartbeats,
            "heartbeat_handling": self.registry.handle_percentiles(),
            "reconcile_passes": self.models.passes,
            "connections": {listener.address: listener.counts() for listener in self.listeners},
            "usage_pending": len(self.gateway.usage.pending),
        }

    def routes(self) -> Ops:
        """Every admin route, each with who may call it."""
        ops: Ops = []
        ops += cluster.routes(
            self.store.writable,
            self.status,
            self.scrape,
            self.tokens,
            lambda: openapi.document(
                ops, bounds_of(self.config.gateway), request_names(self.models.models)
            ),
        )
        ops += replicas.routes(self.fleet, self.views, self.slurm.service.stage_of)
        ops += models.routes(self.models, self.views, self.fleet)
        ops += adapters.routes(self.models)
        ops += jobs.routes(self.models.jobs)
        ops += finetunes.routes(self.finetunes)
        ops += plan.routes(self.planner)
        ops += explore.routes(self.explore)
        ops += keys.routes(self.keys, self.serving)
        ops += people.routes(self.people, self.orgs, self.keys)
        ops += grants.routes(self.directory, self.gateway.keys.records)
        ops += signin.routes(self.oidc)
        ops += login.routes(self.device_logins, self.orgs)
        ops += ldap.routes(self.ldap)
        ops += scim.routes(self.scim)
        ops += admintoken.routes(self.admin_tokens)
        ops += servers.routes(self.ha, self.tokens, self.members)
        # The hook for an offline cluster's mirror: the source a new machine fetches from.
        ops += releases.routes(self.members, self.fleet.nodes, self.release_source)
        ops += settings.routes(self.agent_settings)
        ops += engines.routes(self.engines, self.registry)
        ops += firewall.routes(self.firewall)
        ops += fabrics.routes(self.fabrics)
        ops += nvlink.routes(self.registry)
        ops += slurm.routes(self.slurm.service)
        ops += guard.routes(self.guard)
        ops += mcp.routes(self.mcp.service)
        ops += upgrade.routes(self.upgrades.service)
        ops += restart.routes(self.restarts)
        return ops

    def admin_app(self) -> AdminApp:
        """The admin API and pages as an ASGI app: every route behind the one gate."""
        gate = Gate(self.admin_tokens.ok, self._standby, self.sessions, self.directory)
        gate.metrics_token = self.metrics_token
        services = Services(
            registry=self.registry,
            gateway=self.gateway,
            store=self.store,
            keys=self.keys,
            serving=self.serving,
            models=self.models,
            views=self.views,
            fleet=self.fleet,
            planner=self.planner,
            explore=self.explore,
            fabrics=self.fabrics,
            device_logins=self.device_logins,
            people=self.people,
            orgs=self.orgs,
            admin_token_ok=self.admin_tokens.ok,
            revocations=self.revocations,
            ldap=self.ldap,
            behind_tls=self.config.pages_behind_tls,
            body_timeout=self.config.gateway.body_timeout,
            oidc=self.oidc_flow,
            signins=SignIns(self.oidc, self.ldap, self.scim, self.store),
            slurm=self.slurm.service,
            mirror=self.mirror,
            mirror_watch=self.mirror_watch,
            mcp=self.mcp.service,
            guard=self.guard,
            finetunes=self.finetunes,
        )
        body_timeout = self.config.gateway.body_timeout
        pages = [
            *site.routes(services, gate, self._standby),
            scim.mount(self.scim, self._standby, body_timeout),
        ]
        return build_app(self.routes(), gate, body_timeout, pages)

    def _standby(self) -> dict[str, Any] | None:
        """The leader, while this control plane is a standby (writes go there)."""
        if self.ha.leading:
            return None
        return self.ha.state()["leader"] or {}
