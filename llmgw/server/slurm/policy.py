"""Lending by policy (``llmgw ctl slurm policy``): which nodes to lend to Slurm and which
to take back, one pass at a time. Pure: the keeper gathers the inputs, calls
``decide``, and hands each decision to the Slurm service with its words as the audit's
reason; ``ctl slurm status`` shows the same words as what the policy would do next.

The rules, in order:

- Off: nothing while neither ``lend_idle_after`` nor ``reclaim_when_queued`` is set.
- Starved: a model is starved when its requests have queued without a break for
  ``reclaim_when_queued`` or longer, or when a replica of it has nowhere to go (the
  reconciler could place it on no node). Nothing is starved while
  ``reclaim_when_queued`` is not set.
- Reclaim: the fewest lent nodes, one per starved model, most starved first. A node on
  its way back counts for one starved model: one reclaiming, or one back in llmgw for
  less than ``reclaim_when_queued`` (its room is still being taken up). A node is taken
  back only when it is in Slurm's set, lent and Ready; those running no job first,
  then those whose last job ends soonest, then those whose jobs' ends are unknown.
- Lend: only while no model is starved, so a pass never lends and reclaims, and a node
  just taken back for a model is not lent again at once. A node is lent when it is in
  Slurm's set, serving, Ready, not cordoned by an operator, runs no replica (one whose
  replicas could be placed elsewhere is left to an operator's ``ctl slurm lend``, which
  moves them first), and served nothing for ``lend_idle_after`` (a node that never
  served counts as idle for as long as the keeper has watched, so a new leader waits
  the whole time again); the longest idle first, as long as ``keep_free_gpus`` cards
  stay with llmgw, counted over the Ready, uncordoned nodes serving llmgw (in Slurm's
  set or not).

The same inputs give the same decisions, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmgw.server.slurm.settings import SlurmPolicy

Stage = Literal["serving", "lending", "lent", "reclaiming"]
Action = Literal["lend", "reclaim"]


@dataclass(frozen=True)
class PolicyJob:
    """A Slurm job on a node, as its agent read it from squeue; ``end`` in epoch
    seconds, None when Slurm does not know it."""

    id: str
    end: float | None


@dataclass(frozen=True)
class PolicyNode:
    """What the policy knows of one node.

    ``idle``: seconds since its cards (or CPU replicas) last served a request, or since
    it came back to llmgw when that is later; None: it served nothing since the keeper
    began watching. ``returned``: seconds since it came back from Slurm (None: not since
    the keeper began watching). ``cordoned``: by an operator. ``jobs``: None when Slurm
    could not be asked; ``steps``: the job steps running on the machine (None: not
    read)."""

    id: str
    in_set: bool
    stage: Stage
    ready: bool
    cards: int
    idle: float | None
    replicas: int
    jobs: tuple[PolicyJob, ...] | None = None
    steps: int | None = None
    returned: float | None = None
    # An operator's cordon or drain in llmgw (not one made for Slurm): never lent by
    # policy, and its cards are not free for llmgw's replicas.
    cordoned: bool = False


@dataclass(frozen=True)
class PolicyModel:
    """One model's want of room: ``queued`` the seconds its requests have waited in the
    gateway's queue without a break (None: none waiting); ``nowhere`` why a replica of
    it could be placed on no node (None: every replica it wants is placed)."""

    name: str
    queued: float | None = None
    nowhere: str | None = None


@dataclass(frozen=True)
class Decision:
    """Lend or reclaim one node, and why, in words (the audit's reason)."""

    action: Action
    node: str
    reason: str

    def words(self) -> str:
        return f"{self.action} {self.reason}"


@dataclass(frozen=True)
class Outlook:
    """A pass's decisions, and when there are none, what the policy waits for."""

    decisions: list[Decision] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)

    def next(self) -> list[str]:
        """What the policy would do next, in words (``SlurmJson.next``)."""
        return [d.words() for d in self.decisions] or self.waiting


def span(seconds: float) -> str:
    """A duration as people say it: 75 s, 31 min, 3 h, 2 d."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h"
    return f"{s // 86400} d"


def decide(
    nodes: Sequence[PolicyNode],
    models: Sequence[PolicyModel],
    policy: SlurmPolicy,
    now: float,
    watched: float,
) -> Outlook:
    """This pass's decisions. ``now``: epoch seconds (jobs' ends are Slurm's epoch);
    ``watched``: seconds since the keeper began watching (a node that never served has
    been idle at least that long)."""
    if not policy.on:
        return Outlook()
    starved = _starved(models, policy)
    if starved:
        return _reclaims(nodes, starved, policy, now)
    return _lends(nodes, policy, watched)


def _starved(models: Sequence[PolicyModel], policy: SlurmPolicy) -> list[tuple[PolicyModel, str]]:
    """Each starved model and why, most starved first: nowhere to go before queued, the
    longest queued first, then by name."""
    limit = policy.reclaim_when_queued
    if limit is None:
        return []
    found: list[tuple[int, float, str, PolicyModel, str]] = []
    for model in models:
        if model.nowhere is not None:
            why = f"a replica of model {model.name} has nowhere to go ({model.nowhere})"
            found.append((0, 0.0, model.name, model, why))
        elif model.queued is not None and model.queued >= limit:
            why = (
                f"model {model.name}'s requests have queued for {span(model.queued)} "
                f"(policy: {span(limit)})"
            )
            found.append((1, -model.queued, model.name, model, why))
    found.sort(key=lambda f: f[:3])
    return [(f[3], f[4]) for f in found]


def _job_end(node: PolicyNode) -> tuple[int, float]:
    """How soon a node is free of Slurm: (0, 0) running no job, (1, end of its last
    job), (2, 0) not known."""
    if node.jobs is None:
        return (0, 0.0) if node.steps == 0 else (2, 0.0)
    if not node.jobs:
        return (0, 0.0) if not node.steps else (2, 0.0)
    ends = [job.end for job in node.jobs]
    if any(end is None for end in ends):
        return (2, 0.0)
    return (1, max(end for end in ends if end is not None))


def _jobs_words(node: PolicyNode, now: float) -> str:
    kind, end = _job_end(node)
    if kind == 0:
        return f"{node.id} runs no job"
    count = len(node.jobs or ())
    jobs = f"{count} job{'s' if count != 1 else ''}" if count else "job steps"
    if kind == 1:
        return f"{node.id}'s {jobs} end in {span(end - now)}"
    return f"{node.id} runs {jobs} whose end Slurm does not know"


def _reclaims(
    nodes: Sequence[PolicyNode],
    starved: list[tuple[PolicyModel, str]],
    policy: SlurmPolicy,
    now: float,
) -> Outlook:
    limit = policy.reclaim_when_queued
    assert limit is not None
    coming = sorted(
        (
            n
            for n in nodes
            if n.in_set
            and (
                n.stage == "reclaiming"
                or (n.stage == "serving" and n.returned is not None and n.returned < limit)
            )
        ),
        key=lambda n: n.id,
    )
    lent = sorted(
        (n for n in nodes if n.in_set and n.stage == "lent" and n.ready),
        key=lambda n: (*_job_end(n), n.id),
    )
    decisions: list[Decision] = []
    waiting: list[str] = []
    for i, (_model, why) in enumerate(starved):
        if i < len(coming):
            node = coming[i]
            back = "being taken back" if node.stage == "reclaiming" else "just back"
            waiting.append(f"{why}: {node.id} is {back} for it")
        elif lent:
            node = lent.pop(0)
            reason = f"{node.id}: {why}; {_jobs_words(node, now)}"
            decisions.append(Decision("reclaim", node.id, reason))
        else:
            waiting.append(f"{why}, and no Ready node is lent to Slurm to take back")
    return Outlook(decisions, waiting)


def _lends(nodes: Sequence[PolicyNode], policy: SlurmPolicy, watched: float) -> Outlook:
    after = policy.lend_idle_after
    if after is None:
        return Outlook([], ["nothing: no model waits for room (lending by policy is off)"])
    free = sum(
        n.cards
        for n in nodes
        if n.ready and not n.cordoned and (not n.in_set or n.stage == "serving")
    )
    candidates = sorted(
        (
            (n, watched if n.idle is None else n.idle)
            for n in nodes
            if n.in_set and n.stage == "serving" and n.ready and not n.cordoned and not n.replicas
        ),
        key=lambda c: (-c[1], c[0].id),
    )
    decisions: list[Decision] = []
    waiting: list[str] = []
    for node, idle in candidates:
        what, serve = ("its cards", "serve") if node.cards else ("it", "serves")
        if node.cards and free - node.cards < policy.keep_free_gpus:
            waiting.append(
                f"{node.id} stays: lending its {node.cards} card"
                f"{'s' if node.cards != 1 else ''} would leave {free - node.cards} with "
                f"llmgw (policy: keep {policy.keep_free_gpus} free)"
            )
            continue
        if idle < after:
            waiting.append(
                f"lend {node.id} in {span(after - idle)} if {what} {serve} nothing meanwhile "
                f"(policy: {span(after)})"
            )
            continue
        served = (
            f"{what} served nothing for {span(idle)}"
            if node.idle is not None
            else f"{what} served nothing since the keeper began watching {span(idle)} ago"
        )
        decisions.append(Decision("lend", node.id, f"{node.id}: {served} (policy: {span(after)})"))
        free -= node.cards
    if decisions:
        return Outlook(decisions)
    if not waiting:
        waiting.append(
            "nothing to lend: no node of Slurm's set is serving, Ready and free of replicas"
        )
    return Outlook([], waiting)
