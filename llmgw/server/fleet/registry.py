"""The live view of every node: enrolled certificates, facts, heartbeats and readiness.

What only agents know (live figures, whether a node answers) is held here in memory and
rebuilt from their reports after a restart; the store keeps who is enrolled, the last
facts and state, and the replicas each agent last reported Ready, written in batches so
heartbeats never wait on a disk. Those replicas are only *remembered* after a restart:
the gateway routes to one once its engine answers the control plane's probe, until the
node's agent registers and its word replaces them (``NodeView.routable``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from llmgw.server.fleet.energy import EnergyMeter
from llmgw.server.fleet.figures import (
    LiveFigures,
    card_identity,
)
from llmgw.server.fleet.history import FleetHistory
from llmgw.server.fleet.nodeview import NodeView, Session, WireMap
from llmgw.server.store import Audit, Store, StoreUnavailable
from llmgw.wire import Heartbeat, HostFacts, Register
from llmgw.wire.hardware import GPU
from llmgw.wire.messages import (
    AdapterAsk,
    DownloadProgress,
    EngineStatus,
    FinetuneStatus,
    KvBlocks,
    MessageError,
    ShardStatus,
    SlurmStatus,
    from_map,
    to_map,
)
from llmgw.wire.states import NodeState, ShardState

log = logging.getLogger("llmgw.nodes")


@dataclass(frozen=True)
class RegistryHooks:
    """What the registry tells the rest of the control plane."""

    # What a node runs may have changed: the reconciler's wake-up.
    changed: Callable[[], None]
    # A replica's KV-cache blocks changed (vLLM's events), and whether the node that
    # told runs that replica (only then is it believed): the gateway's KV index.
    kv_blocks: Callable[[str, KvBlocks, bool], None]
    # A fine-tune's word from the node training it, or a node's ask for a fine-tune's
    # stored adapter (``server/finetune``).
    finetune: Callable[[str, FinetuneStatus | AdapterAsk], None] = lambda node_id, msg: None


def _stored_facts(node_id: str, stored: dict[str, Any] | None) -> HostFacts | None:
    """The facts the store kept of a node (its last Register's): typed again here, the
    one place they cross from JSON. Facts it cannot read are no facts until the node's
    next Register brings them."""
    if not stored:
        return None
    try:
        return from_map(HostFacts, stored)
    except MessageError as exc:
        log.warning("node %s: its stored facts cannot be read (%s)", node_id, exc)
        return None


def _stored_replicas(node_id: str, stored: list[dict[str, Any]] | None) -> dict[str, ShardStatus]:
    """The Ready replicas the store kept of a node, typed again; one it cannot read is
    left out (its node's agent will report it)."""
    out: dict[str, ShardStatus] = {}
    for item in stored or ():
        try:
            shard = from_map(ShardStatus, item)
        except MessageError as exc:
            log.warning("node %s: a stored replica cannot be read (%s)", node_id, exc)
            continue
        out[shard.replica_id] = shard
    return out


def serving_replicas(shards: dict[str, ShardStatus]) -> list[WireMap]:
    """What the store keeps of a node's shards: those a client's request can go to
    (Ready, with a port, a whole replica or a spanning one's leader), as the wire
    writes them, in a stable order so that an unchanged set is not written again."""
    return [
        to_map(replace(s, last_lines=None))
        for _, s in sorted(shards.items())
        if s.state == ShardState.READY and s.port and not s.rank
    ]


def _facts_json(view: NodeView) -> dict[str, Any]:
    """A registered node's facts as the store keeps them (JSON)."""
    facts: dict[str, Any] = to_map(view.facts) if view.facts is not None else {}
    return facts


class NodeRegistry:
    def __init__(
        self,
        store: Store,
        heartbeat_interval: float,
        missed_heartbeats: int,
        hooks: RegistryHooks,
    ) -> None:
        self.store = store
        self.hooks = hooks
        self.interval = heartbeat_interval
        self.missed = missed_heartbeats
        self.nodes: dict[str, NodeView] = {}
        self._dirty: dict[str, NodeView] = {}
        self._registered: dict[str, NodeView] = {}
        # The serving replicas last written per node, and nodes whose shards changed since.
        self._replicas_written: dict[str, list[WireMap]] = {}
        self._replicas_dirty: dict[str, NodeView] = {}
        self.handle_times: deque[float] = deque(maxlen=50_000)
        # The last hour of each node's figures at 10 s steps (the console's sparklines).
        self.history = FleetHistory()
        # Each replica's cards' energy, for joules per token.
        self.energy = EnergyMeter()
        self.heartbeats = 0
        # Bumped on every change of what runs where: the gateway rebuilds its routes.
        self.version = 0

    async def load(self) -> None:
        """Every enrolled node, NotReady until its agent reports again."""
        for rec in await self.store.list_nodes():
            view = NodeView(
                id=rec.id,
                cert_serial=int(rec.cert_serial),
                address=rec.address,
                version=rec.version,
                facts=_stored_facts(rec.id, rec.facts),
                last_seen=rec.last_seen,
                reason="waiting for its agent since the control plane started",
                cordoned=rec.cordoned,
                draining=rec.draining,
                labels=dict(rec.labels or {}),
                remembered=_stored_replicas(rec.id, rec.replicas),
            )
            self._replicas_written[rec.id] = list(rec.replicas or [])
            self.nodes[rec.id] = view
            if rec.state != NodeState.NOT_READY:
                self._dirty[rec.id] = view

    async def reload_marks(self) -> None:
        """A standby's store changed: take each node's cordon, drain and labels again,
        and nodes enrolled since (their certificates too)."""
        changed = False
        for rec in await self.store.list_nodes():
            view = self.nodes.get(rec.id)
            if view is None:
                view = self.nodes[rec.id] = NodeView(
                    id=rec.id, cert_serial=int(rec.cert_serial), address=rec.address
                )
                changed = True
            marks = (int(rec.cert_serial), rec.cordoned, rec.draining, dict(rec.labels or {}))
            if marks != (view.cert_serial, view.cordoned, view.draining, view.labels):
                view.cert_serial, view.cordoned, view.draining, view.labels = marks
                changed = True
        if changed:
            self.version += 1

    async def set_scheduling(
        self,
        view: NodeView,
        cordoned: bool,
        draining: bool,
        labels: dict[str, str],
        audit: Audit,
    ) -> None:
        """An operator's marks on a node: written with their audit entry, then taken."""
        await self.store.set_node_scheduling(view.id, cordoned, draining, labels, audit)
        view.cordoned, view.draining, view.labels = cordoned, draining, labels
        self.version += 1
        self.hooks.changed()

    def certificate_ok(self, node_id: str, serial: int) -> bool:
        """Only a node's newest certificate is honoured: re-enrolling retires the old one."""
        view = self.nodes.get(node_id)
        return view is not None and view.cert_serial == serial

    async def enrolled(self, node_id: str, serial: int) -> None:
        now = time.time()
        await self.store.enroll_node(node_id, str(serial), now)
        view = self.nodes.get(node_id)
        if view is None:
            self.nodes[node_id] = NodeView(id=node_id, cert_serial=serial, reason="enrolled")
        else:
            view.cert_serial = serial
            if view.session is not None:
                view.session.close("the node was enrolled again with a new certificate")

    async def register(self, msg: Register, session: Session) -> None:
        view = self.nodes[msg.node_id]
        if view.session is not None and view.session is not session:
            view.session.close("replaced by a newer connection from the same node")
        view.session = session
        view.address = msg.address
        view.version = msg.version
        view.facts = msg.host
        view.last_heartbeat = time.monotonic()
        view.last_seen = time.time()
        view.live = LiveFigures.registered(view.last_seen)
        if view.state != NodeState.READY:
            log.info("node %s is Ready (%s)", view.id, "registered")
        view.state, view.reason = NodeState.READY, ""
        view.engines = list(msg.engines)
        view.engines_probed = msg.engines_probed
        view.engine_progress = {}
        view.features = list(msg.features)
        view.installable = list(msg.installable_engines)
        view.settings = msg.settings
        # What the node runs now is the truth; statuses from before the reconnect go.
        view.shards = {s.replica_id: s for s in msg.shards}
        view.remembered = {}
        self._replicas_dirty[view.id] = view
        view.usage = {}
        self._dirty.pop(view.id, None)
        # Written with the next flush, in one transaction with every other node that
        # registered meanwhile: a reconnect storm makes one commit a second, not thousands.
        self._registered[view.id] = view
        self.version += 1
        self.hooks.changed()

    def heartbeat(self, node_id: str, msg: Heartbeat) -> None:
        """Hot path: in memory only; the monitor writes what changed in batches."""
        view = self.nodes[node_id]
        live = view.live
        live.take(msg, time.time())
        if msg.gpus is not None and view.shards:
            self.energy.heartbeat(
                msg.gpus, ((r, s.cards) for r, s in view.shards.items() if s.cards)
            )
        if msg.settings is not None:
            view.settings = msg.settings
        if msg.shards is not None:
            view.usage = {u.replica_id: u for u in msg.shards}
        view.last_heartbeat = time.monotonic()
        view.last_seen = time.time()
        facts = view.facts
        now = view.last_seen
        gpus: Sequence[GPU] = live.gpus if live.gpus is not None else facts.gpus if facts else ()
        # The history keeps what is live: a card's last figures while its tool hangs
        # are not this heartbeat's, and leave a gap rather than repeat.
        if gpus and not live.is_live("gpus", now):
            gpus = [card_identity(g) for g in gpus]
        self.history.record(
            node_id,
            now,
            live.cpu_percent if live.is_live("cpu_percent", now) else None,
            facts.memory_total if facts else None,
            live.memory_available if live.is_live("memory_available", now) else None,
            gpus,
        )
        if view.state != NodeState.READY:
            log.info("node %s is Ready again", node_id)
            view.state, view.reason = NodeState.READY, ""
            self._dirty[node_id] = view
            self.version += 1
        self.heartbeats += 1

    def report(
        self,
        node_id: str,
        msg: ShardStatus
        | DownloadProgress
        | EngineStatus
        | KvBlocks
        | SlurmStatus
        | FinetuneStatus
        | AdapterAsk,
    ) -> None:
        """Keep the latest word of a shard, a download, the node's engines or its Slurm;
        hand a replica's cache blocks on to the router and a fine-tune's word to the
        fine-tunes (they change nothing else)."""
        if isinstance(msg, FinetuneStatus | AdapterAsk):
            self.hooks.finetune(node_id, msg)
            return
        if isinstance(msg, KvBlocks):
            view = self.nodes.get(node_id)
            self.hooks.kv_blocks(node_id, msg, view is not None and msg.replica_id in view.shards)
            return
        view = self.nodes[node_id]
        if not isinstance(msg, DownloadProgress):
            self.version += 1
            self.hooks.changed()
        if isinstance(msg, ShardStatus):
            self._replicas_dirty[node_id] = view
            if msg.state == ShardState.STOPPED:
                view.shards.pop(msg.replica_id, None)
                view.usage.pop(msg.replica_id, None)
            else:
                view.shards[msg.replica_id] = msg
            if msg.state == ShardState.FAILED:
                log.warning("shard %s on %s failed: %s", msg.replica_id, node_id, msg.reason)
        elif isinstance(msg, DownloadProgress):
            if msg.finished:
                view.downloads.pop(msg.source, None)
            else:
                view.downloads[msg.source] = to_map(msg)
        elif isinstance(msg, SlurmStatus):
            view.slurm = msg
        else:
            view.engines = list(msg.engines)
            view.engines_probed = msg.probed
            view.engine_message = msg.message
            if msg.progress is not None:
                view.engine_progress = dict(msg.progress)

    def disconnected(self, node_id: str, session: Session) -> None:
        view = self.nodes.get(node_id)
        if view is not None and view.session is session:
            view.session = None
            self.version += 1

    def sweep(self, now: float | None = None) -> list[str]:
        """Mark NotReady each node past its missed heartbeats; returns their ids."""
        now = time.monotonic() if now is None else now
        limit = self.interval * self.missed
        lost: list[str] = []
        for view in self.nodes.values():
            if view.state != NodeState.READY or view.last_heartbeat is None:
                continue
            if now - view.last_heartbeat > limit:
                view.state = NodeState.NOT_READY
                view.reason = f"missed {self.missed} heartbeats ({limit:g} s without word)"
                log.warning("node %s is NotReady: %s", view.id, view.reason)
                self._dirty[view.id] = view
                lost.append(view.id)
                self.version += 1
        return lost

    async def flush(self) -> None:
        """Write registrations, then state changes (a node lost after registering must
        end NotReady in the store), then the serving replicas that changed."""
        registered, self._registered = self._registered, {}
        dirty, self._dirty = self._dirty, {}
        touched, self._replicas_dirty = self._replicas_dirty, {}
        replicas = [(v.id, serving_replicas(v.shards)) for v in touched.values()]
        replicas = [(i, r) for i, r in replicas if r != self._replicas_written.get(i)]
        try:
            await self.store.register_nodes(
                [
                    (v.id, v.address, v.version, _facts_json(v), v.last_seen or time.time())
                    for v in registered.values()
                ]
            )
            if dirty:
                await self.store.set_node_states(
                    [(v.id, v.state, v.reason, v.last_seen) for v in dirty.values()]
                )
            if replicas:
                await self.store.set_node_replicas(replicas)
        except Exception:
            # Nothing is lost: what was not written is written with the next flush.
            self._registered = {**registered, **self._registered}
            self._dirty = {**dirty, **self._dirty}
            self._replicas_dirty = {**touched, **self._replicas_dirty}
            raise
        self._replicas_written.update(replicas)

    async def monitor(self, stop: asyncio.Event) -> None:
        """Sweep every second and write changes; runs until ``stop`` is set."""
        while not stop.is_set():
            self.sweep()
            try:
                await self.flush()
            except StoreUnavailable:
                pass  # said once by the store; kept and written when it can be
            except Exception:
                log.exception("could not write node states; will retry")
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                pass

    # --- a standby's fleet: what the leader's agents say, every two seconds ------------

    def followable(self) -> list[dict[str, Any]]:
        """The fleet as standbys follow it: each node's state, address and shards."""
        return [
            {
                "id": v.id,
                "state": str(v.state),
                "reason": v.reason,
                "address": v.address,
                "last_seen": v.last_seen,
                "shards": [to_map(s) for s in v.shards.values()],
                "remembered": [to_map(s) for s in v.remembered.values()],
            }
            for v in self.nodes.values()
        ]

    def follow(self, nodes: list[dict[str, Any]]) -> None:
        """Take the leader's word for which replicas run Ready where (a standby serves
        ``/v1`` from it); a node the leader no longer lists keeps its last word."""
        changed = False
        now = time.monotonic()
        for item in nodes:
            view = self.nodes.get(item["id"])
            if view is None:
                continue  # enrolled after this standby's last copy: the next one has it
            shards = {
                s.replica_id: s for s in (from_map(ShardStatus, m) for m in item.get("shards", []))
            }
            state = NodeState(item["state"])
            if (view.state, view.address, view.shards) != (state, item.get("address"), shards):
                changed = True
            view.state, view.reason = state, str(item.get("reason", ""))
            view.address = item.get("address")
            view.last_seen = item.get("last_seen")
            view.last_heartbeat = now
            view.shards = shards
            remembered = _stored_replicas(view.id, item.get("remembered"))
            if remembered != view.remembered:
                changed = True
            view.remembered = remembered
        if changed:
            self.version += 1

    def wanted_sources(self) -> set[str]:
        """Weights some shard on some node uses now (its LoRA adapters' too); the rest
        no model wants."""
        return {
            source
            for view in self.nodes.values()
            for shard in view.shards.values()
            for source in (shard.source, *(a.source for a in shard.adapters or ()))
            if source
        }

    def counts(self) -> dict[str, int]:
        ready = sum(1 for v in self.nodes.values() if v.state == NodeState.READY)
        return {"total": len(self.nodes), "ready": ready, "not_ready": len(self.nodes) - ready}

    def handle_percentiles(self) -> dict[str, float | None]:
        times = sorted(self.handle_times)
        if not times:
            return {"p50_ms": None, "p99_ms": None}
        return {
            "p50_ms": round(times[len(times) // 2] * 1000, 4),
            "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 4),
        }
