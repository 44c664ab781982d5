"""The reconciler's plan carried out: the loop that makes the nodes run what the
catalog says.

``Dispatch`` runs a pass of the reconciler on every wake-up (a change of the catalog, a
node's report) and on a timer, and sends its plan down the agents' streams: StopShard
for each stop, StartShard for each start (a replica spanning nodes gets one per node,
with its peers' addresses), and parks the on-demand models that keep failing, through
the catalog's own ``park``. A start whose node went away before it could be sent is
abandoned, counted as a failure of its profile. It runs on the leader only.

With tracing on, each pass is a trace (``reconcile``) and each start a span in it
(``replica start``), whose traceparent goes down with the StartShard for the agent to
carry on (``llmgw.tracing``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from llmgw.config import SchedulingConfig
from llmgw.server.catalog import model as catalog
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.catalog.reconciler import Plan, Reconciler, Start
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.store import StoreUnavailable
from llmgw.tracing import OFF, Tracing
from llmgw.wire.messages import ShardSpec, StartShard, StopShard

log = logging.getLogger("llmgw.models")

# An on-demand model parked, and why.
Park = Callable[[str, str], Awaitable[None]]


def _address(view: NodeView | None) -> str:
    """The address the other nodes of a replica reach a node at: the one it reached
    the control plane from."""
    if view is None or not view.address:
        raise RuntimeError("a node of the replica has no known address")
    return view.address


class Dispatch:
    def __init__(
        self,
        reconciler: Reconciler,
        registry: NodeRegistry,
        models: Mapping[str, Model],
        secret: bytes,
        scheduling: SchedulingConfig,
        wake: asyncio.Event,
        park: Park,
        vouched: Callable[[str], dict[str, str]] = lambda source: {},
        hub_for: Callable[[str], str | None] = lambda source: None,
        tracing: Tracing = OFF,
    ) -> None:
        """``models`` is the catalog as it stands (read afresh at each pass); ``wake``
        is set by whoever changed something; ``park`` keeps a model parked; ``vouched``
        gives the sha256 of a source's files the control plane vouches for, ``hub_for``
        the mirror they are sent from; ``tracing`` where the passes' spans go."""
        self.reconciler = reconciler
        self.registry = registry
        self.models = models
        self.secret = secret
        self.interval = scheduling.interval
        self.wake = wake
        self.park = park
        self.vouched = vouched
        self.hub_for = hub_for
        self.tracing = tracing
        self.last_plan = Plan()
        # Passes made: a test waits for this to move on rather than sleeping.
        self.passes = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.reconcile()
            except StoreUnavailable as exc:
                log.warning("reconcile pass could not write the store (trying again): %s", exc)
            except Exception:
                log.exception("reconcile pass failed; trying again")
            self.wake.clear()
            waiters = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waiters, timeout=self.interval, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
            # Let a burst of changes (several shard reports at once) arrive together.
            await asyncio.sleep(0.05)

    async def reconcile(self) -> Plan:
        # A root span: each pass its own trace, whatever span woke it.
        with self.tracing.span("reconcile", parent="") as span:
            plan = await self._reconcile()
            span.set("llmgw.reconcile.pass", self.passes)
            span.set("llmgw.reconcile.starts", len(plan.starts))
            span.set("llmgw.reconcile.stops", len(plan.stops))
            span.set("llmgw.reconcile.parks", len(plan.parks))
        return plan

    async def _reconcile(self) -> Plan:
        nodes = self.registry.nodes
        plan = self.reconciler.plan(list(self.models.values()), nodes)
        self.last_plan = plan
        self.passes += 1
        for stop in plan.stops:
            view = nodes.get(stop.node)
            log.info("stopping %s on %s: %s", stop.replica_id, stop.node, stop.reason)
            if view is not None and view.session is not None:
                await view.session.send(StopShard(replica_id=stop.replica_id))
        for start in plan.starts:
            await self._start(start, nodes)
        for name, reason in plan.parks:
            await self.park(name, reason)
        return plan

    async def _start(self, start: Start, nodes: Mapping[str, NodeView]) -> None:
        model = self.models[start.model]
        profile = model.profile(start.profile)
        assert profile is not None
        homes = [nodes.get(n) for n in (start.node, *(w.node for w in start.workers))]
        if any(v is None or v.session is None or (start.workers and not v.address) for v in homes):
            self.reconciler.abandon(start.replica_id, "node not connected")
            return
        version = self.reconciler.engine_version(profile.engine)
        digests = self.vouched(model.source)
        hub = self.hub_for(model.source)
        for node, spec in self._specs(model, profile, start, nodes):
            spec = replace(spec, engine_version=version, sha256=digests, hub=hub)
            attributes = {
                "llmgw.model": model.name,
                "llmgw.profile": profile.name,
                "llmgw.replica": spec.replica_id,
                "llmgw.node": node,
                "llmgw.engine": spec.engine,
            }
            # Sent, not waited for: the agent's spans carry on from this one.
            with self.tracing.span("replica start", attributes, kind="client") as span:
                if spec.group is not None:
                    span.set("llmgw.rank", spec.group.rank)
                log.info(
                    "starting %s on %s (port %d%s)",
                    spec.replica_id,
                    node,
                    spec.port,
                    f", cards {', '.join(spec.cards)}" if spec.cards else "",
                )
                session = nodes[node].session
                if session is not None:
                    await session.send(StartShard(spec=spec, traceparent=span.traceparent))

    def _specs(
        self, model: Model, profile: Profile, start: Start, nodes: Mapping[str, NodeView]
    ) -> list[tuple[str, ShardSpec]]:
        where = [start.node, *(w.node for w in start.workers)]
        addresses = {n: _address(nodes.get(n)) for n in where} if start.workers else {}
        return catalog.start_specs(model, profile, start, addresses, self.secret)
