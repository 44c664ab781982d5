"""What a simulation found, as one object of plain fields (``--json``) and as text.

Times are seconds from the trace's start (the moment the fleet was up) unless they
say otherwise; a figure the simulation could not work out is null, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

from llmgw.sim.run import Replica, Simulation

GIB = 1024**3
# How the scheduler chose among the nodes that fit (``scheduler.py``).
STRATEGY = {
    "binpack": "each replica to the node holding its weights, else the fullest that fits",
    "spread": "each replica to the node holding its weights, else the emptiest that fits",
}


class PlacementWhyJson(TypedDict):
    """The model's verdicts on the fleet before anything ran (``ctl explain``'s)."""

    nodes_fit: int
    refused: dict[str, int]  # nodes, by the kind of their first reason
    examples: dict[str, str]  # one node's reasons for each kind


class ModelReportJson(TypedDict):
    name: str
    engine: str
    replicas_wanted: int
    replicas_ready: int
    cards_per_replica: int
    memory: int
    card_memory: int
    note: str  # the reconciler's note at the end (why a profile is short)
    placement: PlacementWhyJson
    requests: int
    served: int
    failed: dict[str, int]  # no_replica, queue_full, queue_timeout
    interrupted: int
    queue_wait_p50: float | None
    queue_wait_p95: float | None
    ttft_p50: float | None
    ttft_p95: float | None
    ttft_max: float | None
    tokens_per_second: float | None  # one reply's decode rate on its first replica
    prefill_tokens_per_second: float | None
    output_tokens: int
    joules_per_token: float | None


class ReplicaJson(TypedDict):
    replica: str
    model: str
    node: str
    cards: list[str]
    workers: list[str]
    started_at: float
    ready_at: float | None
    stopped_at: float | None
    stop_reason: str
    why: str  # the catalog asks for it, or in place of which replica, and what happened
    output_tokens: int


class EventJson(TypedDict):
    kind: str  # node (it failed) or drain
    node: str
    at: float
    replicas: list[str]  # on the node when it happened
    moved_to: list[ReplicaJson]  # the replicas started in their place
    interrupted: int  # requests in flight on its replicas
    failed_until_recovered: int | None  # requests failed meanwhile, fleet-wide
    queued_until_recovered: int | None  # requests that waited in a line meanwhile
    recovered_at: float | None  # when every replacement was Ready; null: never


class SimReportJson(TypedDict):
    nodes: int
    cards: int
    strategy: str
    duration: float
    bring_up_seconds: float
    reconcile_passes: int
    requests: int
    models: list[ModelReportJson]
    replicas: list[ReplicaJson]
    events: list[EventJson]
    parked: list[str]
    joules: float | None
    output_tokens: int
    joules_per_token: float | None


def _pct(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1)], 4)


def _t(value: float | None, start: float) -> float | None:
    return None if value is None else round(value - start, 3)


def _replica(r: Replica, start: float) -> ReplicaJson:
    return {
        "replica": r.replica_id,
        "model": r.model,
        "node": r.node,
        "cards": list(r.cards),
        "workers": list(r.workers),
        "started_at": round(r.started_at - start, 3),
        "ready_at": _t(r.ready_at, start),
        "stopped_at": _t(r.stopped_at, start),
        "stop_reason": r.stop_reason,
        "why": r.why,
        "output_tokens": r.output_tokens,
    }


def _joules(replicas: Sequence[Replica], end: float) -> float | None:
    """Board power over each replica's life, from its start (idle is part of its price,
    as ``EnergyMeter`` counts it); None when a replica's power is not known."""
    total = 0.0
    for r in replicas:
        if r.speed is None or r.speed.power_w is None:
            return None
        total += r.speed.power_w * ((r.stopped_at or end) - r.started_at)
    return total


def build(sim: Simulation, duration: float) -> SimReportJson:
    start, end = sim.start, max(sim.now, sim.start + duration)
    models: list[ModelReportJson] = []
    every: list[Replica] = sorted(sim.replicas.values(), key=lambda r: (r.model, r.started_at))
    fleet_joules: float | None = 0.0
    for name, s in sorted(sim.sims.items()):
        tally = sim.tally[name]
        profile = s.model.profiles[0]
        mine = [r for r in every if r.model == name]
        joules = _joules(mine, end) if mine else None
        if mine:
            fleet_joules = None if joules is None or fleet_joules is None else fleet_joules + joules
        first = mine[0].speed if mine else None
        status = sim.reconciler.status_of(name, profile.name)
        why = sim.why.get(name)
        models.append(
            {
                "name": name,
                "engine": profile.engine,
                "replicas_wanted": profile.replicas,
                "replicas_ready": sum(
                    1 for r in mine if r.stopped_at is None and r.ready_at is not None
                ),
                "cards_per_replica": profile.cards,
                "memory": profile.memory,
                "card_memory": profile.card_memory,
                "note": status.note if status else "",
                "placement": {
                    "nodes_fit": why.fits if why else 0,
                    "refused": dict(why.refused) if why else {},
                    "examples": dict(why.example) if why else {},
                },
                "requests": tally.requests,
                "served": tally.served,
                "failed": dict(sorted(tally.failed.items())),
                "interrupted": tally.interrupted,
                "queue_wait_p50": _pct(tally.waits, 0.5),
                "queue_wait_p95": _pct(tally.waits, 0.95),
                "ttft_p50": _pct(tally.ttft, 0.5),
                "ttft_p95": _pct(tally.ttft, 0.95),
                "ttft_max": _pct(tally.ttft, 1.0),
                "tokens_per_second": round(first.decode, 3) if first else None,
                "prefill_tokens_per_second": round(first.prefill, 3) if first else None,
                "output_tokens": tally.output_tokens,
                "joules_per_token": round(joules / tally.output_tokens, 4)
                if joules is not None and tally.output_tokens
                else None,
            }
        )
    events: list[EventJson] = []
    for e in sim.event_tallies:
        events.append(
            {
                "kind": e.event.kind,
                "node": e.event.node,
                "at": e.event.at,
                "replicas": list(e.replicas),
                "moved_to": [_replica(sim.replicas[r], start) for r in e.moved],
                "interrupted": e.interrupted,
                "failed_until_recovered": (
                    e.failed_after
                    if e.failed_after is not None
                    else sim.failures() - e.failed_before
                ),
                "queued_until_recovered": (
                    e.queued_after if e.queued_after is not None else sim.queued - e.queued_before
                ),
                "recovered_at": _t(e.recovered_at, start),
            }
        )
    tokens = sum(t.output_tokens for t in sim.tally.values())
    return {
        "nodes": len(sim.nodes.nodes),
        "cards": sum(len(v.figures().gpus) for v in sim.nodes.nodes.values()),
        "strategy": sim.scheduling.strategy,
        "duration": duration,
        "bring_up_seconds": round(start, 3),
        "reconcile_passes": sim.passes,
        "requests": len(sim.requests),
        "models": models,
        "replicas": [_replica(r, start) for r in every],
        "events": events,
        "parked": [f"{name}: {why}" for name, why in sim.parks],
        "joules": None if fleet_joules is None else round(fleet_joules, 1),
        "output_tokens": tokens,
        "joules_per_token": round(fleet_joules / tokens, 4)
        if fleet_joules is not None and tokens
        else None,
    }


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def text(report: SimReportJson) -> str:
    rule = STRATEGY[report["strategy"]]
    lines = [
        f"{report['nodes']} nodes, {report['cards']} cards, {report['strategy']} ({rule}); "
        f"the fleet was up after {report['bring_up_seconds']:.0f} s ({report['reconcile_passes']} "
        f"reconcile passes); {report['requests']} requests over {report['duration']:g} s",
        "",
    ]
    by_model: dict[str, list[ReplicaJson]] = {}
    for r in report["replicas"]:
        by_model.setdefault(r["model"], []).append(r)
    for m in report["models"]:
        p = m["placement"]
        refused = ", ".join(f"{k}: {n}" for k, n in p["refused"].items())
        lines.append(
            f"{m['name']} ({m['engine']}, {m['cards_per_replica']} card(s), "
            f"{m['card_memory'] / GIB:.1f} GiB a card, {m['memory'] / GIB:.1f} GiB host): "
            f"{m['replicas_ready']} of {m['replicas_wanted']} replicas Ready at the end"
        )
        lines.append(
            f"  placement: {p['nodes_fit']} node(s) fit"
            + (f"; refused by {refused}" if refused else "")
        )
        for example in p["examples"].values():
            lines.append(f"    e.g. {example}")
        if m["note"]:
            lines.append(f"  note: {m['note']}")
        for r in by_model.get(m["name"], []):
            cards = ",".join(c.rsplit("-", 1)[-1] for c in r["cards"])
            ended = (
                f", stopped at {r['stopped_at']:.0f} s: {r['stop_reason']}"
                if r["stopped_at"] is not None
                else ""
            )
            workers = f" + {', '.join(r['workers'])}" if r["workers"] else ""
            why = f" ({r['why']})" if r["why"] != "the catalog asks for it" else ""
            lines.append(f"    {r['replica']}: {r['node']}{workers} cards [{cards}]{why}{ended}")
        failed = ", ".join(f"{k} {n}" for k, n in m["failed"].items()) or "none"
        jpt = m["joules_per_token"]
        lines.append(
            f"  requests {m['requests']}: served {m['served']}, failed {failed}, "
            f"interrupted {m['interrupted']}; queue wait p50 {_s(m['queue_wait_p50'])} "
            f"p95 {_s(m['queue_wait_p95'])}; first token p50 {_s(m['ttft_p50'])} "
            f"p95 {_s(m['ttft_p95'])} max {_s(m['ttft_max'])}; "
            + ("energy unknown" if jpt is None else f"{jpt:.3f} J a token")
        )
        lines.append("")
    for e in report["events"]:
        what = "failed" if e["kind"] == "node" else "drained"
        moved = (
            ", ".join(
                f"{r['replica']} -> {' + '.join([r['node'], *r['workers']])}" for r in e["moved_to"]
            )
            or "none"
        )
        recovered = (
            "never recovered"
            if e["recovered_at"] is None
            else f"recovered at {e['recovered_at']:.0f} s"
        )
        lines.append(
            f"{e['node']} {what} at {e['at']:g} s: {len(e['replicas'])} replica(s) on it; "
            f"moved: {moved}; {e['interrupted']} request(s) cut off; {recovered}"
            + (
                f" ({e['failed_until_recovered']} request(s) failed and "
                f"{e['queued_until_recovered']} queued meanwhile)"
                if e["failed_until_recovered"] is not None
                else ""
            )
        )
    for parked in report["parked"]:
        lines.append(f"parked: {parked}")
    jpt = report["joules_per_token"]
    lines.append(
        f"energy: {report['output_tokens']} tokens answered, "
        + ("unknown" if jpt is None else f"{jpt:.3f} J a token")
    )
    return "\n".join(lines)
