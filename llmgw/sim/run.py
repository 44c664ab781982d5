"""The simulation: discrete events on a clock of its own, through the control plane's
own reconcile loop (``Dispatch`` over a ``Reconciler``, placing with the scheduler) and
the gateway's ``Router``, with no process and no socket.

- Agents are immediate state changes: a StartShard that reaches a node's stand-in
  session makes the shard Downloading at once and Ready after fetching its weights (none
  when the node holds them), loading them and starting the engine; a StopShard removes
  it. Ready shards hold their memory in the node's figures, as a heartbeat would say.
- A reconcile pass runs at the start, whenever a shard or a node changed, and at the
  next moment one of the reconciler's timers (backoff, lost-node grace, start timeout)
  runs out, as the real loop's wake-ups and interval would have it.
- The fleet is brought up first; the trace's time 0 (and each ``--fail`` time) is the
  moment every replica the first pass placed is Ready.
- A request goes to the replica ``Router.pick`` chooses among those with a free slot,
  or waits in its model's line as the gateway's queue has it (FIFO, ``queue_depth``
  waiters at most, ``queue_wait`` seconds at most); with no replica it fails at once.
  Its first token comes after its prompt at the replica's prefill rate, its last after
  its output at the decode rate; each slot decodes at the single-reply rate (decode reads
  the weights once a step for every slot, so it stays memory-bound).
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import cast

from llmgw.config import GatewayConfig, SchedulingConfig
from llmgw.server.catalog import scheduler
from llmgw.server.catalog.dispatch import Dispatch
from llmgw.server.catalog.model import Model, parse_member_id, parse_replica_id
from llmgw.server.catalog.reconciler import Reconciler
from llmgw.server.catalog.tracks import REPORT_TIMEOUT
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.gateway.router import Endpoint, Router
from llmgw.sim.cards import SimError
from llmgw.sim.fleet import SimSession
from llmgw.sim.load import FleetEvent, Request
from llmgw.sim.models import SimModel, Speed, speed
from llmgw.wire.messages import ShardStatus, StartShard, StopShard
from llmgw.wire.states import NodeState, ShardState

GB = 1000**3
# Weights come from the hub or a mirror at this rate unless told (``--fetch-gbs``), are
# read into the engine at LOAD_GBS, and an engine takes ENGINE_START_S to come up.
FETCH_GBS = 1.25
LOAD_GBS = 4.0
ENGINE_START_S = 20.0
# How often a fetching agent reports its bytes.
PROGRESS_EVERY = 60.0
# How long bring-up may take before the trace starts regardless.
BRING_UP_LIMIT = 6 * 3600.0


class SimNodes:
    """The registry as the router and the reconcile loop read it."""

    def __init__(self, nodes: dict[str, NodeView]) -> None:
        self.nodes = nodes
        self.version = 0


class SimCatalog:
    def __init__(self, models: dict[str, Model]) -> None:
        self.models = models
        self.version = 0


class SimProbe:
    """The control plane's probe of engines on silent nodes: a failed node's engines
    died with it, so none answers."""

    version = 0

    def answers(self, replica_id: str) -> bool:
        return False

    def proven(self, replica_id: str) -> bool:
        return False


@dataclass
class Replica:
    """One replica as the simulation followed it."""

    replica_id: str
    model: str
    node: str
    cards: list[str]
    workers: list[str] = field(default_factory=list)
    started_at: float = 0.0
    ready_at: float | None = None
    stopped_at: float | None = None
    stop_reason: str = ""
    speed: Speed | None = None
    # Why it was started: the catalog's count, or in place of a replica an event took.
    why: str = "the catalog asks for it"
    output_tokens: int = 0
    # Requests in flight on it: request number -> (output tokens, when it ends).
    in_flight: dict[int, tuple[int, float]] = field(default_factory=dict)


@dataclass
class Why:
    """A model's verdicts on the fleet before anything ran: nodes that fit, and the
    others by the kind of their first reason, with one node's reasons for each kind."""

    fits: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    example: dict[str, str] = field(default_factory=dict)


@dataclass
class ModelTally:
    requests: int = 0
    served: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    interrupted: int = 0
    waits: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    output_tokens: int = 0


@dataclass
class EventTally:
    event: FleetEvent
    replicas: list[str] = field(default_factory=list)
    models: dict[str, int] = field(default_factory=dict)  # replicas to replace, by model
    moved: list[str] = field(default_factory=list)  # the replacements' replica ids
    replaced: list[str] = field(default_factory=list)  # the replicas they replace
    interrupted: int = 0
    failed_before: int = 0
    failed_after: int | None = None
    queued_before: int = 0
    queued_after: int | None = None
    recovered_at: float | None = None


class Simulation:
    def __init__(
        self,
        nodes: dict[str, NodeView],
        models: Sequence[SimModel],
        requests: Sequence[Request],
        events: Sequence[FleetEvent],
        scheduling: SchedulingConfig | None = None,
        gateway: GatewayConfig | None = None,
        fetch_gbs: float = FETCH_GBS,
    ) -> None:
        self.now = 0.0
        self.nodes = SimNodes(nodes)
        self.sims = {s.model.name: s for s in models}
        self.catalog = SimCatalog({s.model.name: s.model for s in models})
        self.scheduling = scheduling or SchedulingConfig()
        self.gateway = gateway or GatewayConfig()
        self.fetch_gbs = fetch_gbs
        self.requests = requests
        self.fleet_events = sorted(events, key=lambda e: e.at)
        self.reconciler = Reconciler(
            self.scheduling, lambda engine: None, lambda nodes: {}, clock=lambda: self.now
        )
        self.dispatch = Dispatch(
            self.reconciler,
            # Dispatch reads the registry's ``nodes`` alone.
            cast(NodeRegistry, self.nodes),
            self.catalog.models,
            b"llmgw sim",
            self.scheduling,
            asyncio.Event(),
            self._park,
        )
        self.router = Router(self.nodes, self.catalog, SimProbe(), b"llmgw sim")
        # Events by time: what happens then (None: a reconcile pass), in order of asking.
        self._heap: list[tuple[float, int, Callable[[], None] | None]] = []
        self._seq = 0
        self._pass_at: float | None = None
        self.replicas: dict[str, Replica] = {}
        self.tally = {name: ModelTally() for name in self.sims}
        self.lines: dict[str, deque[tuple[int, float]]] = {n: deque() for n in self.sims}
        self.event_tallies: list[EventTally] = []
        self.parks: list[tuple[str, str]] = []
        self.start: float = 0.0  # when the trace began (the fleet was up)
        self.passes = 0
        self.queued = 0  # requests that waited in a line, fleet-wide
        self.starting = 0  # replicas started, neither Ready nor stopped yet
        self.why: dict[str, Why] = {}
        # When each node has (or will have) each source's weights on its disk.
        self.fetched: dict[tuple[str, str], float] = {}

    # ----------------------------------------------------------------- the clock

    def _at(self, when: float, action: Callable[[], None] | None) -> None:
        """``action`` at ``when``; None: a reconcile pass then (``_wake``)."""
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, action))

    def _wake(self, when: float | None = None) -> None:
        """A pass at ``when`` (now), unless one is due by then."""
        when = self.now if when is None else when
        if self._pass_at is None or self._pass_at > when:
            self._pass_at = when
            self._at(when, None)

    async def _park(self, name: str, reason: str) -> None:
        self.parks.append((name, reason))
        self.catalog.models[name] = replace(self.catalog.models[name], parked=reason)
        self.catalog.version += 1

    def explain(self) -> None:
        """Each model's verdicts on the fleet as it stands, as `ctl explain` judges them."""
        caps = self.reconciler.capacities(self.nodes.nodes)
        strategy: scheduler.Strategy = (
            "spread" if self.scheduling.strategy == "spread" else "binpack"
        )
        for name, sim in self.sims.items():
            profile = sim.model.profiles[0]
            request = self.reconciler.request(sim.model, profile, self.now)
            why = Why()
            for v in scheduler.explain(request, caps, strategy):
                if v.ok:
                    why.fits += 1
                    continue
                kind = v.reasons[0].split(":", 1)[0]
                why.refused[kind] = why.refused.get(kind, 0) + 1
                why.example.setdefault(kind, f"{v.node}: {'; '.join(v.reasons)}")
            self.why[name] = why
            if not why.fits and profile.replicas and profile.nodes == 1:
                # As `ctl model serve` refuses it (``Room.check_fits``).
                counts = ", ".join(f"{k}: {n} node(s)" for k, n in why.refused.items())
                example = next(iter(why.example.values()), "no nodes")
                raise SimError(
                    f"{name} fits no node even with nothing else running, so `ctl model "
                    f"serve` would refuse it ({counts or 'no nodes'}; e.g. {example})"
                )

    async def run(self) -> None:
        """Bring the fleet up, then play the trace and the events to their end."""
        self.explain()
        self._wake(0.0)
        await self._drain(BRING_UP_LIMIT, bring_up=True)
        self.start = self.now
        for i, req in enumerate(self.requests):
            self._at(self.start + req.at, partial(self._arrive, i))
        for e in self.fleet_events:
            self._at(self.start + e.at, partial(self._fleet, e))
        await self._drain(None, bring_up=False)

    def _up(self) -> bool:
        """Every replica placed is Ready and no pass is due: the fleet is up."""
        return self._pass_at is None and self.starting == 0

    async def _drain(self, until: float | None, bring_up: bool) -> None:
        heap = self._heap
        while heap:
            if bring_up and self._up():
                return
            item = heapq.heappop(heap)
            when, _, action = item
            if until is not None and when > until:
                heapq.heappush(heap, item)
                return
            self.now = max(self.now, when)
            if action is not None:
                action()
            elif self._pass_at == when:
                self._pass_at = None
                await self._pass()

    # ------------------------------------------------------------ the control plane

    async def _pass(self) -> None:
        self.passes += 1
        plan = await self.dispatch.reconcile()
        why = {stop.replica_id: stop.reason for stop in plan.stops}
        starts: list[tuple[NodeView, StartShard]] = []
        for view in self.nodes.nodes.values():
            session = view.session
            if isinstance(session, SimSession) and session.sent:
                for msg in session.take():
                    if isinstance(msg, StartShard):
                        starts.append((view, msg))
                    elif isinstance(msg, StopShard):
                        reason = why.get(msg.replica_id, "stopped by the reconciler")
                        self._stop(view, msg.replica_id, reason, msg.grace)
        # A replica's leader first, so its workers find it.
        starts.sort(key=lambda s: parse_member_id(s[1].spec.replica_id) is not None)
        for view, msg in starts:
            self._start(view, msg)
        # Nothing changes between events here but the reconciler's own timers: the real
        # loop's interval passes in between would decide the same.
        nxt = self._next_timer()
        if nxt is not None:
            self._wake(nxt)

    def _next_timer(self) -> float | None:
        """The next moment a reconciler timer runs out: a backoff, a lost node's grace,
        a replica's start or report timeout."""
        now, cfg = self.now, self.scheduling
        times = [h.next_try for h in self.reconciler.health.values() if h.next_try > now]
        for view in self.nodes.nodes.values():
            if view.state != NodeState.READY and view.last_heartbeat is not None:
                times.append(view.last_heartbeat + cfg.node_lost_grace + 0.001)
        for t in self.reconciler.tracks.values():
            if t.state != ShardState.READY:
                times.append(t.moved_at + cfg.start_timeout + 0.001)
            if t.sent_at is not None:
                times.append(t.sent_at + REPORT_TIMEOUT + 0.001)
        later = [t for t in times if t > now]
        return min(later) if later else None

    # ------------------------------------------------------------------- agents

    def _start(self, view: NodeView, msg: StartShard) -> None:
        spec = msg.spec
        member = parse_member_id(spec.replica_id)
        rid = member[0] if member else spec.replica_id
        parsed = parse_replica_id(rid)
        assert parsed is not None, f"a start of no model's replica: {spec.replica_id}"
        sim = self.sims[parsed[0]]
        profile = sim.model.profiles[0]
        # A node fetches a source once: a second replica of it waits for the same fetch.
        fetched = self.fetched.get((view.id, spec.source))
        if fetched is None:
            fetched = self.now + sim.model.weight_bytes / (self.fetch_gbs * GB)
            self.fetched[(view.id, spec.source)] = fetched
            # Its agent reports the bytes as they come: progress the reconciler sees,
            # so a long fetch is not taken for a start that hangs.
            step = PROGRESS_EVERY
            while self.now + step < fetched:
                done = int(step * self.fetch_gbs * GB)
                self._at(self.now + step, partial(self._fetch, view.id, spec.source, done, False))
                step += PROGRESS_EVERY
            self._at(
                fetched, partial(self._fetch, view.id, spec.source, sim.model.weight_bytes, True)
            )
        fetch = max(0.0, fetched - self.now)
        ready = self.now + fetch + sim.model.weight_bytes / (LOAD_GBS * GB) + ENGINE_START_S
        view.shards[spec.replica_id] = ShardStatus(
            replica_id=spec.replica_id,
            state=ShardState.DOWNLOADING if fetch else ShardState.LOADING,
            fingerprint=spec.fingerprint,
            engine=spec.engine,
            source=spec.source,
            port=spec.port,
            cards=list(spec.cards),
        )
        self.nodes.version += 1
        if member is not None:
            rep = self.replicas.get(rid)
            if rep is not None:
                rep.workers.append(view.id)
        else:
            rep = Replica(rid, sim.model.name, view.id, list(spec.cards), started_at=self.now)
            rep.speed = speed(sim, view, spec.cards, profile.nodes)
            self.replicas[rid] = rep
            self.starting += 1
            self._moved(rep)
        self._at(ready, partial(self._shard, view.id, spec.replica_id))
        self._wake()

    def _fetch(self, node: str, source: str, done: int, finished: bool) -> None:
        """A node's DownloadProgress, as the registry keeps it."""
        view = self.nodes.nodes[node]
        if view.state != NodeState.READY:
            return
        if finished:
            view.downloads.pop(source, None)
            return
        waiting = [
            sid
            for sid, s in view.shards.items()
            if s.source == source and s.state == ShardState.DOWNLOADING
        ]
        view.downloads[source] = {"source": source, "done": done, "replica_ids": waiting}

    def _shard(self, node: str, shard_id: str) -> None:
        """A shard comes up: Ready, its memory held in its node's figures."""
        view = self.nodes.nodes[node]
        shard = view.shards.get(shard_id)
        if shard is None or view.state != NodeState.READY:
            return
        view.shards[shard_id] = replace(shard, state=ShardState.READY)
        self._hold(view, shard_id, shard, +1)
        self.nodes.version += 1
        rep = self.replicas.get(shard_id)
        if rep is not None:
            rep.ready_at = self.now
            self.starting -= 1
            self._serve_line(rep.model)
            self._recovered()
        self._wake()

    def _hold(self, view: NodeView, shard_id: str, shard: ShardStatus, sign: int) -> None:
        member = parse_member_id(shard_id)
        rep = self.replicas.get(member[0] if member else shard_id)
        if rep is None:
            return
        profile = self.sims[rep.model].model.profiles[0]
        figures = view.figures()
        view.live.memory_available = (figures.memory_available or 0) - sign * profile.memory
        held = set(shard.cards)
        view.live.gpus = [
            replace(g, memory_used=(g.memory_used or 0) + sign * profile.card_memory)
            if g.uuid in held
            else g
            for g in figures.gpus
        ]

    def _stop(self, view: NodeView, shard_id: str, reason: str, grace: float) -> None:
        shard = view.shards.pop(shard_id, None)
        if shard is None:
            return
        if shard.state == ShardState.READY:
            self._hold(view, shard_id, shard, -1)
        self.nodes.version += 1
        rep = self.replicas.get(shard_id)
        if rep is not None:
            self._retire(rep, reason, grace)
        self._wake()

    def _retire(self, rep: Replica, reason: str, grace: float = 0.0) -> None:
        """The replica is gone: requests in flight on it that would not end within the
        stop's grace are cut off (a failed node gives none)."""
        if rep.stopped_at is not None:
            return
        rep.stopped_at = self.now
        rep.stop_reason = reason
        if rep.ready_at is None:
            self.starting -= 1
        cut = [i for i, (_, ends) in rep.in_flight.items() if ends > self.now + grace]
        self.tally[rep.model].interrupted += len(cut)
        for e in self.event_tallies:
            if rep.replica_id in e.replicas:
                e.interrupted += len(cut)
        for i in cut:
            del rep.in_flight[i]

    # ------------------------------------------------------------------ the fleet

    def _fleet(self, event: FleetEvent) -> None:
        view = self.nodes.nodes[event.node]
        tally = EventTally(event, failed_before=self.failures(), queued_before=self.queued)
        on_node = [
            r
            for r in self.replicas.values()
            if r.stopped_at is None and (r.node == event.node or event.node in r.workers)
        ]
        tally.replicas = [r.replica_id for r in on_node]
        for r in on_node:
            tally.models[r.model] = tally.models.get(r.model, 0) + 1
        self.event_tallies.append(tally)
        if event.kind == "drain":
            view.draining = True
        else:
            view.state = NodeState.NOT_READY
            view.reason = "simulated failure"
            view.last_heartbeat = self.now
            view.session = None
            for r in on_node:
                self._retire(r, f"its node {event.node} failed")
        self.nodes.version += 1
        if not on_node:
            tally.failed_after = tally.queued_after = 0
            tally.recovered_at = self.now
        self._wake()

    def _moved(self, rep: Replica) -> None:
        """A new replica of a model an event took replicas from is one of its moves."""
        for e in self.event_tallies:
            if e.models.get(rep.model, 0) > 0 and e.recovered_at is None:
                e.models[rep.model] -= 1
                e.moved.append(rep.replica_id)
                old = next(
                    r
                    for r in e.replicas
                    if self.replicas[r].model == rep.model and r not in e.replaced
                )
                e.replaced.append(old)
                what = "failed" if e.event.kind == "node" else "was drained"
                rep.why = f"in place of {old}: its node {e.event.node} {what}"
                return

    def _recovered(self) -> None:
        for e in self.event_tallies:
            if e.recovered_at is not None or any(e.models.values()):
                continue
            if all(self.replicas[r].ready_at is not None for r in e.moved):
                e.recovered_at = self.now
                e.failed_after = self.failures() - e.failed_before
                e.queued_after = self.queued - e.queued_before

    def failures(self) -> int:
        return sum(sum(t.failed.values()) + t.interrupted for t in self.tally.values())

    # ------------------------------------------------------------------ requests

    def _fail(self, model: str, why: str) -> None:
        failed = self.tally[model].failed
        failed[why] = failed.get(why, 0) + 1

    def _arrive(self, i: int) -> None:
        req = self.requests[i]
        tally = self.tally[req.model]
        tally.requests += 1
        line = self.lines[req.model]
        if not line:
            endpoint = self.router.pick(req.model, room=True)
            if endpoint is not None:
                self._send(i, endpoint)
                return
            if self.router.room(req.model) is None:
                self._fail(req.model, "no_replica")
                return
        if len(line) >= self.gateway.queue_depth:
            self._fail(req.model, "queue_full")
            return
        line.append((i, self.now))
        self.queued += 1
        self._at(self.now + self.gateway.queue_wait, partial(self._expire, req.model))

    def _expire(self, model: str) -> None:
        line = self.lines[model]
        while line and line[0][1] + self.gateway.queue_wait <= self.now:
            line.popleft()
            self._fail(model, "queue_timeout")

    def _serve_line(self, model: str) -> None:
        line = self.lines[model]
        while line:
            endpoint = self.router.pick(model, room=True)
            if endpoint is None:
                if self.router.room(model) is None:
                    for _ in range(len(line)):
                        self._fail(model, "no_replica")
                    line.clear()
                return
            i, _ = line.popleft()
            self._send(i, endpoint)

    def _send(self, i: int, endpoint: Endpoint) -> None:
        req = self.requests[i]
        rep = self.replicas[endpoint.replica_id]
        assert rep.speed is not None
        arrived = self.start + req.at
        first = self.now + req.prompt_tokens / rep.speed.prefill
        tally = self.tally[req.model]
        tally.waits.append(self.now - arrived)
        tally.ttft.append(first - arrived)
        endpoint.outstanding += 1
        ends = first + req.output_tokens / rep.speed.decode
        rep.in_flight[i] = (req.output_tokens, ends)
        self._at(ends, partial(self._done, endpoint, i))

    def _done(self, endpoint: Endpoint, i: int) -> None:
        endpoint.outstanding -= 1
        rep = self.replicas[endpoint.replica_id]
        held = rep.in_flight.pop(i, None)
        if held is None:
            return  # cut off when its replica went
        tokens = held[0]
        rep.output_tokens += tokens
        tally = self.tally[rep.model]
        tally.served += 1
        tally.output_tokens += tokens
        self._serve_line(rep.model)

    # ------------------------------------------------------------------- the end

    @property
    def end(self) -> float:
        return self.now

    def models(self) -> Mapping[str, Model]:
        return self.catalog.models
