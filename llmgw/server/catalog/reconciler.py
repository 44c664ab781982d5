"""The reconciler: the catalog's wish against what the agents report, one pass at a time.

A pass reads the models and the live node views, and answers with the replicas to
start (placed by ``llmgw.server.catalog.scheduler``) and the ones to stop. It keeps only what
agents cannot tell it: the replicas it asked for that no agent has reported yet, when
each replica last made progress, and where each profile failed. So after a restart of
the control plane the replicas are rebuilt from the agents' reports alone.

The rules, per profile of each model:

- Desired: the profile's replicas; none while the model is stopped or parked, or is
  on demand with no recent demand.
- A replica runs the profile's fingerprint (current), one the operator moved away from
  (``Model.replaced``: it is replaced, one by one), or another (stale: flagged and
  kept serving, never restarted behind the operator's back). Replicas on a draining
  node are replaced like moved-away ones.
- Short: start new ones (one at a time while old ones are being replaced). Over: stop
  the extras, but never a ready one while the model would then have fewer ready than it
  wants in all, so a change of split starts the new before stopping the old.
- Failed, or not Ready within the start timeout of its last progress: stop it, count a
  failure, wait base x 2^(n-1) before the next try, and place it away from where it
  failed while anything else fits. An on-demand model failing ``park_after`` times in
  a row is parked.
- A node NotReady past the grace period: its replicas no longer count and are placed
  elsewhere; when it returns, what it still runs counts again and the extras stop.
  Right after a control plane starts, nothing new is placed until every node has
  reported or the grace period has passed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from llmgw.config import SchedulingConfig
from llmgw.server.catalog import holdings, scheduler
from llmgw.server.catalog.model import (
    Model,
    Profile,
    fingerprint,
    member_id,
    new_replica_id,
    parse_member_id,
    parse_replica_id,
)
from llmgw.server.catalog.ports import EnginePorts
from llmgw.server.catalog.tracks import (
    AVOID_FOR,
    LIVE,
    REJUDGE,
    REPORT_TIMEOUT,
    STOP_RESEND,
    Health,
    Member,
    Plan,
    ProfileStatus,
    ReplicaNote,
    Start,
    StartMember,
    Stop,
    Track,
    merge_workers,
    replica_progress,
    stop_order,
    unreported_workers,
)
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.wiring import Wiring
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import NodeState, ShardState

__all__ = ["Plan", "ProfileStatus", "Reconciler", "Start", "Stop", "Track"]


class Reconciler:
    def __init__(
        self,
        config: SchedulingConfig,
        engine_version: Callable[[str], str | None],
        wiring: Callable[[Mapping[str, NodeView]], Mapping[str, Wiring]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``engine_version``: the version the fleet runs an engine at (``engines:``;
        None: no version asked). ``wiring``: how the nodes are wired (NVLink domains,
        fabrics, leaves), for replicas spanning nodes."""
        self.config = config
        self.engine_version = engine_version
        self.wiring = wiring
        self.clock = clock
        self.started = clock()
        self.ports = EnginePorts(config.engine_ports)
        self.tracks: dict[str, Track] = {}
        self.health: dict[tuple[str, str], Health] = {}
        self.status: dict[tuple[str, str], ProfileStatus] = {}
        # On-demand models asked for, and until when they stay up.
        self.demand: dict[str, float] = {}
        self._profiles: dict[tuple[str, str], Profile] = {}
        self._notes: dict[tuple[str, str], tuple[float, str]] = {}
        # `llmgw stop`: every model at zero, the catalog untouched.
        self.halted = False
        self.passes = 0
        # Workers whose replica is gone (shard id -> node), and when each was told to stop.
        self.orphans: dict[str, str] = {}
        self._orphan_stops: dict[str, float] = {}
        # Models a replica of which the last pass could place on no node, and why.
        self.unplaced: dict[str, str] = {}

    # ------------------------------------------------------------------ observing

    def _lost(self, view: NodeView, now: float) -> bool:
        if view.state == NodeState.READY:
            return False
        since = view.last_heartbeat if view.last_heartbeat is not None else self.started
        return now - since > self.config.node_lost_grace

    def _waiting_for_nodes(self, nodes: Mapping[str, NodeView], now: float) -> bool:
        if now - self.started > self.config.node_lost_grace:
            return False
        return any(v.last_heartbeat is None for v in nodes.values())

    def observe(self, nodes: Mapping[str, NodeView], now: float) -> None:
        """Merge what the agents report into the tracks."""
        seen: set[str] = set()
        workers: list[tuple[str, str, int, ShardStatus]] = []
        for view in nodes.values():
            for rid, shard in view.shards.items():
                parsed = parse_replica_id(rid)
                if parsed is None and (member := parse_member_id(rid)) is not None:
                    workers.append((view.id, rid, member[1], shard))
                    continue
                if parsed is None or shard.fingerprint == "direct":
                    continue  # started by hand with `ctl shard start`: not ours to steer
                seen.add(rid)
                state = shard.state
                track = self.tracks.get(rid)
                if track is None:
                    track = Track(
                        rid,
                        parsed[0],
                        parsed[1],
                        view.id,
                        shard.fingerprint,
                        state,
                        moved_at=now,
                        port=shard.port,
                    )
                    self.tracks[rid] = track
                track.node = view.id
                track.sent_at = None
                if shard.fingerprint:
                    track.fingerprint = shard.fingerprint
                if shard.port:
                    track.port = shard.port
                if shard.cards:
                    track.cards = tuple(shard.cards)
                track.reason = shard.reason
                if state != track.state:
                    track.state, track.moved_at = state, now
                done = replica_progress(track, nodes)
                if done is not None and done != track.progress:
                    track.progress, track.moved_at = done, now
        reported, self.orphans = merge_workers(self.tracks, workers)
        for rid, track in list(self.tracks.items()):
            unreported_workers(track, reported, nodes, now)
            if rid in seen:
                continue
            home = nodes.get(track.node)
            if track.sent_at is not None:
                if now - track.sent_at > REPORT_TIMEOUT:
                    self.failed(track, now, "the node never reported starting it")
                    del self.tracks[rid]
            elif track.stop_sent is not None or home is None or home.session is not None:
                # Stopped, or its node is connected and no longer runs it.
                del self.tracks[rid]

    # -------------------------------------------------------------------- failures

    def failed(self, track: Track, now: float, reason: str) -> None:
        """Count a failure of the track's profile: backoff, and its node passed over."""
        if track.failure_counted:
            return
        track.failure_counted = True
        h = self.health.setdefault((track.model, track.profile), Health())
        h.consecutive += 1
        h.last_at, h.last_reason = now, reason
        h.nodes[track.node] = now
        wait = min(self.config.backoff_max, self.config.backoff_base * 2 ** (h.consecutive - 1))
        h.next_try = now + wait
        if track.port is not None and "address" in reason:
            self.ports.bad[(track.node, track.port)] = now

    def _succeeded(self, track: Track) -> None:
        h = self.health.get((track.model, track.profile))
        if h is not None and h.consecutive:
            h.consecutive = 0
            h.next_try = 0.0

    def want(self, model: str, now: float | None = None) -> None:
        """An on-demand model was asked for: keep it up until it idles."""
        now = self.clock() if now is None else now
        self.demand[model] = now + self.config.on_demand_idle

    def forget_failures(self, model: str) -> None:
        """The operator started the model again: try at once, anywhere."""
        for key in [k for k in self.health if k[0] == model]:
            del self.health[key]

    def halt(self, halted: bool) -> None:
        """`llmgw stop` (True): every model's desired count is zero; False undoes it."""
        self.halted = halted

    def abandon(self, replica_id: str, reason: str) -> None:
        """A start that could not be sent (its node went away meanwhile): forgotten, and
        counted as a failure of its profile."""
        track = self.tracks.pop(replica_id, None)
        if track is not None:
            self.failed(track, self.clock(), reason)

    # ----------------------------------------------------------------- what it knows

    def now(self) -> float:
        return self.clock()

    def status_of(self, model: str, profile: str) -> ProfileStatus | None:
        """The profile's counts and note after the last pass; None before one."""
        return self.status.get((model, profile))

    def running_nodes(self, model: str, profile: str) -> list[str]:
        """Every node a replica of the profile runs on (each node of one spanning nodes)."""
        return sorted(
            {
                node
                for t in self.tracks.values()
                if t.model == model and t.profile == profile
                for node in t.nodes
            }
        )

    def running_fingerprints(self, model: str) -> set[str]:
        """The fingerprints the model's replicas run now."""
        return {t.fingerprint for t in self.tracks.values() if t.model == model and t.fingerprint}

    def cards_of(self, replica_id: str) -> list[str]:
        track = self.tracks.get(replica_id)
        return list(track.cards) if track else []

    # ------------------------------------------------------------------------ a pass

    def desired(self, model: Model, profile: Profile, now: float) -> int:
        if self.halted or model.stopped or model.parked:
            return 0
        if model.on_demand and self.demand.get(model.name, 0.0) <= now:
            return 0
        return profile.replicas

    def plan(
        self,
        models: Iterable[Model],
        nodes: Mapping[str, NodeView],
        now: float | None = None,
    ) -> Plan:
        """One pass: observe, then decide. Records the starts it asks for as tracks."""
        now = self.clock() if now is None else now
        self.passes += 1
        self.observe(nodes, now)
        catalog = {m.name: m for m in models}
        self._profiles = {(m.name, p.name): p for m in catalog.values() for p in m.profiles}
        plan = Plan()
        lost = {nid for nid, v in nodes.items() if self._lost(v, now)}
        draining = {nid for nid, v in nodes.items() if v.draining}
        by_profile: dict[tuple[str, str], list[Track]] = {}
        for track in self.tracks.values():
            if track.stop_sent is not None:
                if now - track.stop_sent > STOP_RESEND:
                    track.stop_sent = now
                    self._stops(plan, track, track.stop_reason, skip=lost)
                continue
            model = catalog.get(track.model)
            if model is None or model.profile(track.profile) is None:
                what = "model" if model is None else "profile"
                self._stop(plan, track, now, f"its {what} is no longer in the catalog")
                continue
            if track.state == ShardState.FAILED:
                self.failed(track, now, track.reason or "the engine failed")
                self._stop(plan, track, now, "failed: " + (track.reason or "no reason given"))
                continue
            lost_node = next((n for n in track.nodes if n in lost), None)
            broken = track.broken() or (
                f"its node {lost_node} was lost" if track.workers and lost_node else None
            )
            if broken is not None:
                # One node of a replica spanning nodes down is the whole replica down:
                # it is placed again as one.
                self.failed(track, now, broken)
                self._stop(plan, track, now, "failed: " + broken)
                continue
            if track.state == ShardState.READY:
                self._succeeded(track)
            elif track.state in LIVE and now - track.moved_at > self.config.start_timeout:
                reason = (
                    f"not Ready {self.config.start_timeout:g} s after it last made progress "
                    f"(state {track.state})"
                )
                self.failed(track, now, reason)
                self._stop(plan, track, now, reason)
                continue
            if track.node in lost:
                continue
            by_profile.setdefault((track.model, track.profile), []).append(track)

        hold = self._waiting_for_nodes(nodes, now)
        if not hold:
            self._stop_orphans(plan, now)
        wanted: list[tuple[Model, Profile, int]] = []
        self.status = {}
        self.unplaced = {}
        for model in sorted(catalog.values(), key=lambda m: m.name):
            self._plan_model(model, by_profile, draining, hold, now, plan, wanted)
        if wanted:
            self._place(wanted, nodes, lost, now, plan)
        return plan

    def _plan_model(
        self,
        model: Model,
        by_profile: Mapping[tuple[str, str], list[Track]],
        draining: set[str],
        hold: bool,
        now: float,
        plan: Plan,
        wanted: list[tuple[Model, Profile, int]],
    ) -> None:
        groups = []
        model_ready = model_desired = 0
        for profile in model.profiles:
            key = (model.name, profile.name)
            tracks = by_profile.get(key, [])
            fp = fingerprint(model, profile)
            desired = self.desired(model, profile, now)
            old = [t for t in tracks if t.fingerprint in model.replaced or t.node in draining]
            keep = [t for t in tracks if t not in old]
            stale = [t for t in keep if t.fingerprint != fp]
            status = ProfileStatus(
                desired=desired,
                ready=sum(1 for t in keep if t.state == ShardState.READY),
                starting=sum(1 for t in keep if t.state != ShardState.READY),
                stale=len(stale),
                replacing=len(old),
            )
            if stale:
                status.note = (
                    f"{len(stale)} stale: started from another version of this profile; "
                    f"`llmgw ctl model restart {model.name}` replaces them"
                )
            self.status[key] = status
            model_ready += status.ready
            model_desired += desired
            groups.append((profile, tracks, keep, old, desired, status))

        for profile, _tracks, keep, old, desired, status in groups:
            key = (model.name, profile.name)
            short = desired - len(keep)
            if short > 0:
                starting_new = sum(1 for t in keep if t.state != ShardState.READY)
                if old and model.in_place:
                    # Stop one old replica, then start its replacement where it was.
                    if starting_new == 0 and len(keep) + len(old) >= desired:
                        victim = stop_order(old)[0]
                        self._stop(plan, victim, now, "replaced in place by a changed profile")
                        old.remove(victim)
                    short = min(desired - len(keep) - len(old), 1 - starting_new)
                elif old:
                    short = min(short, 1 - starting_new)
                health = self.health.get(key)
                if health and health.consecutive and now < health.next_try:
                    status.note = (
                        f"failed {health.consecutive} time(s), last: {health.last_reason}; "
                        f"next try in {health.next_try - now:.0f} s"
                    )
                    if (
                        model.on_demand
                        and health.consecutive >= self.config.park_after
                        and not model.parked
                    ):
                        plan.parks.append(
                            (
                                model.name,
                                f"failed {health.consecutive} times in a row, last: "
                                f"{health.last_reason}",
                            )
                        )
                    short = 0
                if hold and short > 0:
                    status.note = "waiting for every node to report after the control plane started"
                    short = 0
                if short > 0:
                    wanted.append((model, profile, short))
            elif short < 0:
                for track in stop_order(keep)[:-short]:
                    if track.state == ShardState.READY:
                        if model_ready - 1 < model_desired:
                            continue  # the model would run fewer than it wants
                        model_ready -= 1
                    self._stop(plan, track, now, "more replicas than the profile asks for")
            # Old replicas go as the new become ready: keep as many as are still missing.
            missing = max(0, desired - sum(1 for t in keep if t.state == ShardState.READY))
            for track in stop_order(old)[: max(0, len(old) - missing)]:
                why = "its node is draining" if track.node in draining else "replaced"
                self._stop(plan, track, now, why)

    def _stop(self, plan: Plan, track: Track, now: float, reason: str) -> None:
        track.stop_sent, track.stop_reason = now, reason
        self._stops(plan, track, reason)

    @staticmethod
    def _stops(plan: Plan, track: Track, reason: str, skip: Iterable[str] = ()) -> None:
        """Stop every shard of the replica: its own, and each worker's."""
        skip = set(skip)
        if track.node not in skip:
            plan.stops.append(Stop(track.replica_id, track.node, reason))
        for w in track.workers:
            if w.node not in skip:
                plan.stops.append(Stop(member_id(track.replica_id, w.rank), w.node, reason))

    def _stop_orphans(self, plan: Plan, now: float) -> None:
        for sid, node in self.orphans.items():
            told = self._orphan_stops.get(sid)
            if told is None or now - told > STOP_RESEND:
                self._orphan_stops[sid] = now
                plan.stops.append(Stop(sid, node, "a worker of a replica that is gone"))
        for sid in [s for s in self._orphan_stops if s not in self.orphans]:
            del self._orphan_stops[sid]

    # -------------------------------------------------------------------- placing

    def capacities(self, nodes: Mapping[str, NodeView]) -> list[scheduler.NodeCapacity]:
        """Each node's facts with what the replicas placed there hold (``holdings``)."""
        return holdings.capacities(self.tracks.values(), self._profiles, nodes, self.wiring(nodes))

    def request(self, model: Model, profile: Profile, now: float) -> scheduler.Request:
        health = self.health.get((model.name, profile.name))
        avoid = frozenset(
            n for n, at in (health.nodes.items() if health else ()) if now - at < AVOID_FOR
        )
        return scheduler.Request(
            model=model.name,
            profile=profile.name,
            engine=profile.engine,
            source=model.source,
            memory=profile.memory,
            disk=model.weight_bytes,
            cpu_cores=profile.cpu_cores,
            cards=profile.cards,
            card_memory=profile.card_memory,
            role=profile.role,
            selector=profile.selector,
            card_class=profile.card_class,
            avoid=avoid,
            engine_version=self.engine_version(profile.engine),
            nodes=profile.nodes,
        )

    def _place(
        self,
        wanted: Sequence[tuple[Model, Profile, int]],
        nodes: Mapping[str, NodeView],
        lost: set[str],
        now: float,
        plan: Plan,
    ) -> None:
        caps = self.capacities(nodes)
        asked = {(m.name, p.name): (m, p) for m, p, _ in wanted}
        prints = {key: fingerprint(m, p) for key, (m, p) in asked.items()}
        requests: list[scheduler.Request] = []
        for model, profile, count in wanted:
            requests += [self.request(model, profile, now)] * count
        strategy: scheduler.Strategy = "spread" if self.config.strategy == "spread" else "binpack"
        results = scheduler.place_many(requests, caps, strategy)
        used = self.ports.used(nodes, self.tracks.values())
        refused: set[tuple[str, str]] = set()
        for result in results:
            req = result.request
            key = (req.model, req.profile)
            if isinstance(result, scheduler.Refusal):
                if key not in refused:
                    refused.add(key)
                    note = self._refusal_note(key, result, now)
                    self.unplaced.setdefault(req.model, note)
                    status = self.status.get(key)
                    if status is not None:
                        status.note = note
                continue
            ports = self.ports.for_placement(result, nodes, used, now)
            if ports is None:
                status = self.status.get(key)
                if status is not None:
                    where = ", ".join([result.node, *(n for n, _ in result.workers)])
                    status.note = f"no free engine port on {where} ({self.config.engine_ports})"
                continue
            port, rendezvous, worker_ports = ports
            rid = new_replica_id(req.model, req.profile)
            model, profile = asked[key]
            workers = tuple(
                StartMember(rank, node, p, cards)
                for rank, ((node, cards), p) in enumerate(
                    zip(result.workers, worker_ports, strict=True), start=1
                )
            )
            self.tracks[rid] = Track(
                rid,
                req.model,
                req.profile,
                result.node,
                prints[key],
                ShardState.PENDING,
                moved_at=now,
                port=port,
                cards=result.cards,
                sent_at=now,
                workers=[Member(w.rank, w.node, w.port, w.cards, sent_at=now) for w in workers],
                rendezvous_port=rendezvous,
                nvlink=result.nvlink,
            )
            plan.starts.append(
                Start(
                    rid,
                    req.model,
                    req.profile,
                    result.node,
                    port,
                    result.cards,
                    workers,
                    rendezvous,
                    result.nvlink,
                )
            )

    def _refusal_note(self, key: tuple[str, str], refusal: scheduler.Refusal, now: float) -> str:
        """Why a profile is short, by reason and count of nodes. Judging every node
        costs more than placing, so a profile that stays short is judged again only
        every REJUDGE seconds; `ctl explain` always judges afresh."""
        cached = self._notes.get(key)
        if cached is not None and now - cached[0] < REJUDGE:
            return cached[1]
        if refusal.request.nodes > 1:
            note = f"{refusal.reason}; `llmgw ctl explain {key[0]}` says why for each set"
            self._notes[key] = (now, note)
            return note
        counts: dict[str, int] = {}
        for verdict in refusal.verdicts:
            if verdict.reasons:
                kind = verdict.reasons[0].split(":", 1)[0]
                counts[kind] = counts.get(kind, 0) + 1
        found = ", ".join(f"{kind}: {n} node{'s' if n > 1 else ''}" for kind, n in counts.items())
        note = (
            f"no node fits ({found or 'no nodes'}); `llmgw ctl explain {key[0]}` says why "
            "for each node"
        )
        self._notes[key] = (now, note)
        return note

    # ------------------------------------------------------------------ describing

    def describe(
        self, replica_id: str, models: Mapping[str, Model], reported: str | None = None
    ) -> ReplicaNote:
        """The catalog's view of one replica, for the replicas listing; ``reported``
        is the fingerprint its agent reports (known before any pass has seen it)."""
        member = parse_member_id(replica_id)
        if member is not None and reported != "direct":
            rid, rank = member
            model_name, profile_name = parse_replica_id(rid) or ("", "")
            note = f"rank {rank} of {rid}, a replica spanning nodes"
            if replica_id in self.orphans:
                note = f"rank {rank} of {rid}, which is gone: being stopped"
            return {"model": model_name, "profile": profile_name, "stale": False, "note": note}
        parsed = parse_replica_id(replica_id)
        track = self.tracks.get(replica_id)
        if parsed is None or reported == "direct":
            return {"model": None, "profile": None, "stale": False, "note": ""}
        model = models.get(parsed[0])
        profile = model.profile(parsed[1]) if model else None
        running = reported or (track.fingerprint if track else None)
        stale = False
        note = ""
        if track is not None and track.stop_sent is not None:
            note = "stopping: " + track.stop_reason
        elif model is None or profile is None:
            note = "not in the catalog"
        elif running:
            if running in model.replaced:
                note = "being replaced by a changed profile"
            elif running != fingerprint(model, profile):
                stale = True
                note = (
                    "stale: started from another version of its profile; "
                    f"`llmgw ctl model restart {model.name}` replaces it"
                )
        return {"model": parsed[0], "profile": parsed[1], "stale": stale, "note": note}
