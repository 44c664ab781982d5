"""Room: whether a model fits the fleet, judged by placement itself.

Before a model is kept, ``Room`` asks the scheduler with every node as if it ran
nothing (could this ever fit?) and, for a change that starts new replicas beside the
running ones, with the nodes as they are now (is there room beside them?); each
refusal names every node's reason. ``explain`` is ``ctl explain``: every node's verdict
for each profile, judged afresh. One judge of fit: the planner's figures
(``plan_nodes``) come from the same capacities.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from llmgw.config import SchedulingConfig
from llmgw.server.catalog import model as catalog
from llmgw.server.catalog import scheduler
from llmgw.server.catalog.model import Model
from llmgw.server.catalog.placement import span_reason
from llmgw.server.catalog.reconciler import Reconciler
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
from llmgw.wire.admin.catalog import ExplainJson


class Room:
    def __init__(
        self, reconciler: Reconciler, registry: NodeRegistry, scheduling: SchedulingConfig
    ) -> None:
        self.reconciler = reconciler
        self.registry = registry
        self.strategy: scheduler.Strategy = (
            "spread" if scheduling.strategy == "spread" else "binpack"
        )

    def fleet(self, at_rest: bool) -> list[scheduler.NodeCapacity]:
        """Nodes as placement sees them now, or empty of replicas and Ready (``at_rest``:
        could this ever fit?)."""
        caps = self.reconciler.capacities(self.registry.nodes)
        if not at_rest:
            return caps
        out = []
        for cap in caps:
            if not cap.memory_total:
                continue  # a node never heard from: nothing to judge it by
            cards = tuple(replace(c, memory_free=c.memory_total, reserved=0) for c in cap.cards)
            out.append(
                replace(
                    cap,
                    ready=True,
                    cordoned=False,
                    cpu_reserved=0.0,
                    memory_available=cap.memory_total,
                    memory_reserved=0,
                    cards=cards,
                )
            )
        return out

    def check_fits(self, model: Model) -> None:
        """Refuse a model no node could ever hold, with every node's reason."""
        nodes = self.fleet(at_rest=True)
        if not nodes:
            return
        for profile in model.profiles:
            if not profile.replicas:
                continue
            request = self.reconciler.request(model, profile, 0.0)
            # An engine still installing is on its way, not a reason it never fits.
            at_rest = replace(request, avoid=frozenset(), engine_version=None)
            verdicts = scheduler.explain(at_rest, nodes)
            if profile.nodes > 1:
                spans = scheduler.explain_spans(at_rest, nodes)
                if spans and spans[0].ok:
                    continue
                raise Refusal(
                    409,
                    "does_not_fit",
                    f"{model.name} (profile {profile.name}) fits nowhere even with nothing "
                    f"else running: {span_reason(profile.nodes, spans)}",
                    verdicts=[v.as_json() for v in verdicts],
                )
            if any(v.ok for v in verdicts):
                continue
            reasons = "; ".join(f"{v.node}: {', '.join(v.reasons)}" for v in verdicts)
            raise Refusal(
                409,
                "does_not_fit",
                f"{model.name} (profile {profile.name}) fits no node even with nothing "
                f"else running: {reasons}",
                verdicts=[v.as_json() for v in verdicts],
            )

    def check_room(self, model: Model, changed: Model) -> None:
        """A change that needs new replicas starts them beside the old: refuse when
        there is no room for one beside them (``in_place`` stops first)."""
        if changed.in_place or changed.stopped:
            return
        caps = self.fleet(at_rest=False)
        for profile in changed.profiles:
            old = model.profile(profile.name)
            if old is None or not profile.replicas:
                continue
            if catalog.fingerprint(changed, profile) == catalog.fingerprint(model, old):
                continue
            if not self.reconciler.running_nodes(model.name, profile.name):
                continue  # nothing runs now: nothing to be beside
            # Room is cards, memory and disk: an engine version still installing is not
            # a lack of room (its replacements wait for it).
            request = replace(self.reconciler.request(changed, profile, 0.0), engine_version=None)
            result = scheduler.place(request, caps)
            if isinstance(result, scheduler.Refusal):
                raise Refusal(
                    409,
                    "no_room",
                    f"no room to start the changed replicas of {model.name} beside the "
                    f"running ones ({result.reason}); add --in-place to stop each "
                    "replica before its replacement starts",
                    verdicts=[v.as_json() for v in result.verdicts],
                )

    def check_leaving(self, nodes: Collection[str], models: Mapping[str, Model]) -> None:
        """Every replica running on ``nodes`` placed on the fleet without them (as a
        drain would place it): refuse, naming each replica that fits nowhere else and
        every node's reason, when one does not."""
        leaving = set(nodes)
        if not leaving:
            return
        caps = [
            replace(c, cordoned=True) if c.id in leaving else c for c in self.fleet(at_rest=False)
        ]
        now = self.reconciler.now()
        moved: list[tuple[str, scheduler.Request]] = []
        for track in sorted(self.reconciler.tracks.values(), key=lambda t: t.replica_id):
            model = models.get(track.model)
            profile = model.profile(track.profile) if model is not None else None
            if model is None or profile is None or not leaving & set(track.nodes):
                continue
            request = replace(self.reconciler.request(model, profile, now), engine_version=None)
            moved.append((track.replica_id, request))
        placed = scheduler.place_many([r for _, r in moved], caps, self.strategy)
        for (replica_id, request), result in zip(moved, placed, strict=True):
            if isinstance(result, scheduler.Refusal):
                raise Refusal(
                    409,
                    "nowhere_to_go",
                    f"replica {replica_id} of {request.model} (profile {request.profile}) "
                    f"has nowhere else to go: {result.reason}; make room for it first "
                    "(more nodes, or fewer replicas)",
                    "nodes",
                    verdicts=[v.as_json() for v in result.verdicts],
                )

    def largest(self, cards: int) -> int | None:
        """The most memory one replica could have: the largest card's (``cards``) or
        node's, as if it ran nothing."""
        nodes = self.fleet(at_rest=True)
        if cards:
            sizes = [c.memory_total for n in nodes for c in n.cards]
        else:
            sizes = [n.memory_total for n in nodes]
        return max(sizes) if sizes else None

    def explain(self, model: Model) -> list[ExplainJson]:
        """Every node's verdict for each profile of ``model``, and what it asks."""
        caps = self.fleet(at_rest=False)
        reconciler = self.reconciler
        now = reconciler.now()
        out: list[ExplainJson] = []
        for profile in model.profiles:
            request = reconciler.request(model, profile, now)
            status = reconciler.status_of(model.name, profile.name)
            spans = (
                [s.as_json() for s in scheduler.explain_spans(request, caps, self.strategy)]
                if profile.nodes > 1
                else None
            )
            out.append(
                {
                    "nodes": profile.nodes,
                    "spans": spans,
                    "model": model.name,
                    "profile": profile.name,
                    "engine": profile.engine,
                    "desired": reconciler.desired(model, profile, now),
                    "memory": request.memory,
                    "disk": request.disk,
                    "cpu_cores": request.cpu_cores,
                    "cards": request.cards,
                    "card_memory": request.card_memory,
                    "avoid": sorted(request.avoid),
                    "running_on": reconciler.running_nodes(model.name, profile.name),
                    "note": status.note if status else "",
                    "verdicts": [
                        v.as_json() for v in scheduler.explain(request, caps, self.strategy)
                    ],
                }
            )
        return out
