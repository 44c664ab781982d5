"""Lending by policy at work: each pass of Slurm's keeper, the policy's inputs gathered
from the fleet, the gateway and the reconciler, its decisions carried out through the
Slurm service as the ``slurm-policy`` principal (each decision's words are the audit's
reason), and what it would do at the next pass kept for ``ctl slurm status``.

Where each input comes from:

- a node's stage and whether it is in Slurm's set: the Slurm service (``stages``);
- Ready, cards, replicas, jobs and steps: the registry's ``NodeView`` (its facts, its
  shards, its agent's last ``SlurmStatus``);
- when its cards last served: the gateway's ``Router.last_served`` (a request began or
  ended on one of its replicas), or later, when this lender last saw it run a replica
  or come back from Slurm (so a node just back from Slurm is not lent again at once);
- how long a model's requests have queued: the gateway's ``FairQueue.backlogs``;
- a replica with nowhere to go: the reconciler's ``unplaced`` (its last pass).

What it remembers (when a node last ran a replica, when it came back) lives in memory
and starts again with each leadership (``restart``): a new leader waits the whole
``lend_idle_after`` before it lends, rather than trusting what it did not see. The
gateway's figures are this control plane's own: requests a standby served or queued
are not seen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from llmgw.server.catalog.reconciler import Reconciler
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.gateway.queue import FairQueue
from llmgw.server.gateway.router import Router
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import SlurmNodes
from llmgw.server.slurm.policy import (
    Decision,
    Outlook,
    PolicyJob,
    PolicyModel,
    PolicyNode,
    Stage,
    decide,
)
from llmgw.server.slurm.settings import SlurmPolicy
from llmgw.server.slurm.view import SlurmView
from llmgw.wire.states import NodeState

log = logging.getLogger("llmgw.slurm.policy")

# Who lends and reclaims by policy, in the audit.
POLICY = Principal.system("slurm-policy")

Clock = Callable[[], float]
STAGES: dict[str | None, Stage] = {
    "serving": "serving",
    "lending": "lending",
    "lent": "lent",
    "reclaiming": "reclaiming",
}
# The decision carried out (the Slurm service's lend or reclaim, with its reason).
Act = Callable[[Decision], Awaitable[object]]


@dataclass(frozen=True)
class Sources:
    """Where the lender reads: each a callable, so it holds no part of the control
    plane it does not use. ``stages``: the nodes of Slurm's set (and those being taken
    back) with their stage; ``served``: node id -> monotonic time of its last request;
    ``backlogs``: model -> seconds its requests have queued; ``unplaced``: model -> why
    a replica of it has nowhere to go."""

    policy: Callable[[], SlurmPolicy]
    stages: Callable[[], Mapping[str, Stage]]
    nodes: Callable[[], Mapping[str, NodeView]]
    served: Callable[[], Mapping[str, float]]
    backlogs: Callable[[], Mapping[str, float]]
    unplaced: Callable[[], Mapping[str, str]]


class Lender:
    def __init__(
        self, sources: Sources, act: Act, clock: Clock = time.monotonic, wall: Clock = time.time
    ) -> None:
        """``clock``: monotonic, the gateway's (``served``); ``wall``: epoch seconds,
        Slurm's (jobs' ends)."""
        self.sources = sources
        self.act = act
        self.clock = clock
        self.wall = wall
        self.started = clock()
        # When each node was last seen running a replica, and last came back from Slurm.
        self.busy: dict[str, float] = {}
        self.returned: dict[str, float] = {}
        self.stages: dict[str, Stage] = {}
        # What the policy would do at its next pass, in words.
        self.next: list[str] = []
        self.decided = 0

    def restart(self) -> None:
        """Leadership begins: nothing seen yet."""
        self.started = self.clock()
        self.busy, self.returned, self.stages = {}, {}, {}
        self.next = []

    def gather(self) -> tuple[list[PolicyNode], list[PolicyModel]]:
        """The policy's inputs now; remembers what it saw for the next pass."""
        now = self.clock()
        stages = self.sources.stages()
        served = self.sources.served()
        nodes: list[PolicyNode] = []
        for node_id, view in sorted(self.sources.nodes().items()):
            stage = stages.get(node_id)
            before = self.stages.get(node_id)
            if stage == "serving" and before is not None and before != "serving":
                self.returned[node_id] = now
            if stage is not None:
                self.stages[node_id] = stage
            else:
                self.stages.pop(node_id, None)
            if view.shards:
                self.busy[node_id] = now
            back = self.returned.get(node_id)
            seen = (served.get(node_id), self.busy.get(node_id), back)
            last = max((t for t in seen if t is not None), default=None)
            status = view.slurm
            jobs = (
                None
                if status is None or status.jobs is None
                else tuple(PolicyJob(j.id, j.end) for j in status.jobs)
            )
            nodes.append(
                PolicyNode(
                    id=node_id,
                    in_set=stage is not None,
                    stage=stage or "serving",
                    ready=view.state == NodeState.READY,
                    cards=len(view.facts.gpus) if view.facts is not None else 0,
                    idle=None if last is None else max(0.0, now - last),
                    replicas=len(view.shards),
                    jobs=jobs,
                    steps=status.steps if status is not None else None,
                    returned=None if back is None else max(0.0, now - back),
                    cordoned=view.cordoned or view.draining,
                )
            )
        backlogs = self.sources.backlogs()
        unplaced = self.sources.unplaced()
        models = [
            PolicyModel(name, backlogs.get(name), unplaced.get(name))
            for name in sorted({*backlogs, *unplaced})
        ]
        return nodes, models

    def outlook(self) -> Outlook:
        nodes, models = self.gather()
        watched = self.clock() - self.started
        return decide(nodes, models, self.sources.policy(), self.wall(), watched)

    async def pass_once(self) -> list[Decision]:
        """Decide, carry out each decision, and say what the next pass would do. A
        decision the service refuses (a replica that would have nowhere to go) is said
        in ``next`` with why, and tried again at a later pass."""
        outlook = self.outlook()
        refused: dict[tuple[str, str], str] = {}
        done: list[Decision] = []
        for decision in outlook.decisions:
            try:
                await self.act(decision)
            except Refusal as exc:
                log.info("lending by policy: %s refused: %s", decision.words(), exc.message)
                refused[(decision.action, decision.node)] = (
                    f"{decision.words()} (refused: {exc.message})"
                )
                continue
            log.info("lending by policy: %s", decision.words())
            done.append(decision)
        self.decided += len(done)
        # What the next pass would do: the state changed with what was done.
        after = self.outlook() if done else outlook
        self.next = [
            refused.get((d.action, d.node), d.words()) for d in after.decisions
        ] or after.waiting
        return done


class Desk(Protocol):
    """What the lender asks of the Slurm service: its lend and reclaim, with a reason."""

    async def lend(self, ask: SlurmNodes, by: Principal, reason: str | None = None) -> object: ...

    async def reclaim(
        self, ask: SlurmNodes, by: Principal, reason: str | None = None
    ) -> object: ...


def policy_lender(
    view: SlurmView,
    desk: Desk,
    registry: NodeRegistry,
    router: Router,
    queue: FairQueue,
    reconciler: Reconciler,
) -> Lender:
    """The lender of a control plane: the Slurm service's settings and stages (``view``)
    and workflows (``desk``), the registry, the gateway's router and queue, the
    reconciler."""

    def stages() -> dict[str, Stage]:
        found: dict[str, Stage] = {}
        for node_id in registry.nodes:
            stage = STAGES.get(view.stage_of(node_id))
            if stage is not None:
                found[node_id] = stage
        return found

    async def act(decision: Decision) -> None:
        ask = SlurmNodes(nodes=(decision.node,))
        if decision.action == "lend":
            await desk.lend(ask, POLICY, decision.reason)
        else:
            await desk.reclaim(ask, POLICY, decision.reason)

    sources = Sources(
        policy=lambda: view.settings.policy,
        stages=stages,
        nodes=lambda: registry.nodes,
        served=lambda: router.last_served,
        backlogs=queue.backlogs,
        unplaced=lambda: reconciler.unplaced,
    )
    return Lender(sources, act)
