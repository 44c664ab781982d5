"""``llmgw server run``: the control plane process, put together and run to a signal."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request

from llmgw import __version__, jointoken, pki
from llmgw.config import ServerConfig, format_hostport, parse_hostport
from llmgw.modelplan import ModelShape
from llmgw.server.agentport import AgentPort
from llmgw.server.api import build_app, new_token_record
from llmgw.server.datadir import DataDir
from llmgw.server.front import AsgiBridge, Listener
from llmgw.server.gateway import Gateway
from llmgw.server.models import ModelService
from llmgw.server.nodes import NodeRegistry
from llmgw.server.planner import make_inspector
from llmgw.server.store import Store, open_store

log = logging.getLogger("llmgw.server")


class ControlPlane:
    def __init__(self, data: DataDir, config: ServerConfig, store: Store) -> None:
        self.data = data
        self.config = config
        self.store = store
        self.cluster_secret = data.cluster_secret()
        self.ca = data.ca()
        self.ca_fingerprint = pki.fingerprint(self.ca.cert_pem)
        self.registry = NodeRegistry(store, config.heartbeat_interval, config.missed_heartbeats)
        _, http_port = parse_hostport(config.listen)
        self.api_addresses = [format_hostport(a, http_port) for a in config.advertise]
        self.agent_addresses = [format_hostport(a, config.agent_port) for a in config.advertise]
        self._admin_hashes: set[str] = set()
        self.started = time.time()
        self.stopping = asyncio.Event()
        self.agent_port: AgentPort | None = None
        self.inspector = make_inspector(self)
        self.models = ModelService(self, inspect=self.inspect_shape)
        self.gateway = Gateway(self)
        self.registry.on_change = self.models.wake

    async def load(self) -> None:
        self._admin_hashes = set(await self.store.admin_token_hashes())
        await self.registry.load()
        await self.models.load()
        await self.gateway.load()
        self.set_stopped(self.gateway.stopped)

    def set_stopped(self, stopped: bool) -> None:
        """`llmgw stop`: /v1 refuses, every model goes to zero; the catalog is unchanged."""
        self.gateway.stopped = stopped
        self.models.reconciler.halted = stopped
        self.models.version += 1
        self.models.wake()

    async def inspect_shape(self, source: str, allow_pickle: bool) -> ModelShape:
        """What a model is, read from the hub, the control plane's disk, or a node."""
        return (await self.inspector.inspect(source, allow_pickle=allow_pickle)).shape

    def admin_token_ok(self, token: str) -> bool:
        return pki.token_hash(token) in self._admin_hashes

    def authorised(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            return False
        return self.admin_token_ok(header[7:].strip())

    def wanted_sources(self) -> set[str]:
        """Weights some shard on some node uses now; the rest no model wants."""
        return {
            str(shard["source"])
            for view in self.registry.nodes.values()
            for shard in view.shards.values()
            if shard.get("source")
        }

    async def mint_join_token(self, ttl: int) -> jointoken.JoinToken:
        secret = pki.new_secret()
        record = new_token_record(self, ttl, secret)
        await self.store.add_join_token(record)
        await self.store.audit("admin", "token.create", record.id, f"ttl {ttl}s")
        return jointoken.JoinToken(
            id=record.id,
            secret=secret,
            addresses=self.api_addresses,
            ca_fingerprint=self.ca_fingerprint,
            expires_at=record.expires_at,
        )

    def status(self) -> dict[str, Any]:
        port = self.agent_port
        return {
            "version": __version__,
            "uptime_seconds": round(time.time() - self.started, 1),
            "leader": True,
            "serving": "stopped" if self.gateway.stopped else "serving",
            "store": self.config.store.backend,
            "listen": self.config.listen,
            "agent_port": self.config.agent_port,
            "advertise": list(self.config.advertise),
            "ca_fingerprint": self.ca_fingerprint,
            "nodes": self.registry.counts(),
            "agent_streams": len(port.connections) if port else 0,
            "heartbeats": self.registry.heartbeats,
            "heartbeat_handling": self.registry.handle_percentiles(),
        }

    async def run(self) -> None:
        agent_host = parse_hostport(self.config.listen)[0]
        self.agent_port = AgentPort(
            self.registry,
            pki.server_tls(self.data.server_cert, self.data.server_key, self.data.ca_cert),
            agent_host,
            self.config.agent_port,
            self.agent_addresses,
        )
        await self.agent_port.start()
        bridge = AsgiBridge(build_app(self))
        listeners = [Listener(self.config.listen, self.gateway.handle, bridge)]
        if self.config.admin_listen:
            # The admin listener serves the admin API and pages, never /v1.
            listeners.append(Listener(self.config.admin_listen, None, bridge))
        monitor = asyncio.create_task(self.registry.monitor(self.stopping))
        reconciler = asyncio.create_task(self.models.run(self.stopping))
        usage = asyncio.create_task(self.gateway.run(self.stopping))
        try:
            for listener in listeners:
                await listener.start()
            log.info(
                "control plane %s: HTTP on %s, agents on port %d, store %s",
                __version__,
                self.config.listen,
                self.config.agent_port,
                self.config.store.backend,
            )
            await self.stopping.wait()
        finally:
            self.stopping.set()
            for listener in listeners:
                await listener.stop()
            await reconciler
            await usage
            await self.gateway.flush()
            await self.gateway.close()
            await self.inspector.close()
            await self.agent_port.stop()
            await monitor
            await self.registry.flush()


async def run_server(root: Path) -> None:
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    cp = ControlPlane(data, config, store)
    await cp.load()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, cp.stopping.set)
    try:
        await cp.run()
    finally:
        await store.close()
