"""The leader's duty that keeps Slurm beside llmgw true each pass (every 2 s, and soon
after the registry changes), from the settings and the agents' reports alone, so a new
leader carries on where the last one was:

- a reclaiming node whose agent reports no job step (``steps`` 0 and no job in
  squeue, or squeue unreadable because slurmctld is down) and that Slurm drained, or
  where Slurm is broken (its agent reports a problem), is given back to llmgw:
  uncordoned if llmgw cordoned it, and out of ``reclaim`` (audit ``slurm.reclaimed``);
  a lending node with no replica left is lent by the same reading (its stage is worked
  out, never kept), so its next message says ``lent``;
- lending by policy decides and lends or reclaims (``lender.py``; off by default);
- each connected agent is sent its ``Slurm`` message when it changed since the last
  one sent on that stream (the controller's carries the files, rendered once a pass
  from every node's facts and Slurm status).

A broken Slurm never keeps a node from llmgw: nothing here cordons a node; only
``lend`` does, and a reclaim ends once the node runs no step, whatever Slurm says.

``slurm_parts`` builds the service and its keeper for ``server/app.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from llmgw.server.catalog.reconciler import Reconciler
from llmgw.server.catalog.service import ModelService
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.fleet.service import FleetService
from llmgw.server.gateway.queue import FairQueue
from llmgw.server.gateway.router import Router
from llmgw.server.leader import Duty
from llmgw.server.principal import Principal
from llmgw.server.slurm.conf import SlurmFiles
from llmgw.server.slurm.lender import Lender, policy_lender
from llmgw.server.slurm.service import SlurmService
from llmgw.server.slurm.settings import KeptSlurm
from llmgw.server.store import Store
from llmgw.wire.messages import Slurm

log = logging.getLogger("llmgw.slurm")

# The control plane itself, in the audit, when the keeper gives a node back.
KEEPER = Principal.system("slurm")
INTERVAL = 2.0
# How often the registry's version is looked at between passes.
GLANCE = 0.25


class SlurmKeeper:
    def __init__(
        self,
        service: SlurmService,
        registry: NodeRegistry,
        lender: Lender | None,
        interval: float = INTERVAL,
    ) -> None:
        """``lender``: lending by policy (lender.py); None leaves it out."""
        self.service = service
        self.registry = registry
        self.interval = interval
        self.wake = asyncio.Event()
        # The message last sent to each node, with the stream it went on.
        self.sent: dict[str, tuple[object, Slurm]] = {}
        self.passes = 0
        self.lender = lender

    def poke(self) -> None:
        """Something changed (a workflow of the service): a pass soon."""
        self.wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        self.sent = {}
        if self.lender is not None:
            self.lender.restart()
        while not stop.is_set():
            seen = self.registry.version
            try:
                await self.pass_once()
            except Exception:
                log.exception("a pass of Slurm's keeper failed; the next one tries again")
            waited = 0.0
            while waited < self.interval and not stop.is_set():
                if self.wake.is_set() or self.registry.version != seen:
                    break
                # asyncio.timeout, not wait_for: on 3.11 a cancel (the leader stepping
                # down) that comes as the event is set would be lost there.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(GLANCE):
                        await self.wake.wait()
                waited += GLANCE
            self.wake.clear()

    async def pass_once(self) -> None:
        service = self.service
        settings = service.settings
        back = [n for n in settings.reclaim if service.returnable(n)]
        if back:
            await service.give_back(back, KEEPER)
            log.info("back in llmgw from Slurm: %s", ", ".join(back))
        await self.lend_by_policy()
        await self.send_messages()
        self.passes += 1

    async def lend_by_policy(self) -> None:
        """The policy's pass (while Slurm is on), and what it would do next."""
        lender = self.lender
        if lender is None or not self.service.settings.enabled:
            self.service.next = []
            return
        try:
            await lender.pass_once()
        except Exception:
            # The nodes still hear their part this pass; the policy tries at the next.
            log.exception("lending by policy failed this pass; the next one tries again")
            return
        self.service.next = lender.next

    async def send_messages(self) -> None:
        files: SlurmFiles | None
        try:
            files = self.service.rendered()
        except ValueError as exc:
            log.warning("slurm.conf cannot be written: %s", exc)
            files = None
        for node_id, view in list(self.registry.nodes.items()):
            session = view.session
            if session is None:
                self.sent.pop(node_id, None)
                continue
            message = self.service.message_for(node_id, files)
            if self.sent.get(node_id) == (session, message):
                continue
            try:
                await session.send(message)
            except (ConnectionError, OSError) as exc:
                log.info("could not tell %s its Slurm part: %s", node_id, exc)
                continue
            self.sent[node_id] = (session, message)


@dataclass(frozen=True)
class SlurmParts:
    kept: KeptSlurm
    service: SlurmService
    keeper: SlurmKeeper

    def duty(self) -> Duty:
        return Duty("slurm", self.keeper.run)


def slurm_parts(
    store: Store,
    cluster_secret: bytes,
    registry: NodeRegistry,
    fleet: FleetService,
    models: ModelService,
    router: Router,
    queue: FairQueue,
    reconciler: Reconciler,
    interval: float = INTERVAL,
) -> SlurmParts:
    """The settings, the service and its keeper (with lending by policy, which reads
    the gateway's ``router`` and ``queue`` and the ``reconciler``), each handed what it
    uses."""
    kept = KeptSlurm(store, cluster_secret)
    poke: list[Callable[[], None]] = []

    def check_leaving(nodes: Collection[str]) -> None:
        models.room.check_leaving(nodes, models.models)

    service = SlurmService(kept, registry, fleet, check_leaving, lambda: poke[0]())
    lender = policy_lender(service, service, registry, router, queue, reconciler)
    keeper = SlurmKeeper(service, registry, lender, interval)
    poke.append(keeper.poke)
    return SlurmParts(kept, service, keeper)
