"""The control plane's own check of engines whose node's agent has gone silent.

An agent that dies, hangs or loses its stream leaves its engines running and serving
(they run in their own sessions, and the next agent adopts them). While its node is
NotReady the gateway keeps routing to those engines as long as they answer this probe:
every INTERVAL seconds, each Ready replica on a silent node is asked for its model list
(``/v1/models``) with the replica's key; one that does not answer 200 is dropped from
the routing table at once and comes back when it answers again, or when its agent
returns and reports it. The model list, not the health route: engines answer their
health route to anyone, so a process that took a dead engine's port would pass for it,
while the model list answers only to the replica's own key. Replicas on nodes whose
agent speaks are never probed: the agent watches them.

The same check covers a control plane that starts while engines run: until a node's
agent registers again, the replicas it last reported Ready (the store keeps them,
``NodeView.remembered``) are probed too, but routed to only once their engine has
answered (``proven``): the agent's word is seconds old, the store's may be hours. The
first round runs before the control plane opens its listener (``first_round``), so
the first requests after a restart find the replicas that answer, not ``no_replica``.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from llmgw import pki
from llmgw.server.gateway.router import Nodes, engine_url
from llmgw.wire.states import NodeState, ShardState

log = logging.getLogger("llmgw.gateway")

INTERVAL = 2.0
TIMEOUT = 2.0


class EngineProbe:
    def __init__(self, nodes: Nodes, secret: bytes, interval: float = INTERVAL) -> None:
        self.nodes = nodes
        self.secret = secret
        self.interval = interval
        # Replicas on silent nodes whose engine did not answer the last probe; and those
        # only remembered from the store whose engine did.
        self.dead: set[str] = set()
        self.alive: set[str] = set()
        # Replicas probed because the store remembered them, not because an agent said.
        self.remembered: set[str] = set()
        # Set when a round has ended: the control plane listens after the first.
        self.checked = asyncio.Event()
        # Bumped when a verdict changes: the router rebuilds its table.
        self.version = 0
        self.rounds = 0
        self.last_round: float | None = None

    def answers(self, replica_id: str) -> bool:
        """Until a probe says otherwise, a replica that was Ready still serves."""
        return replica_id not in self.dead

    def proven(self, replica_id: str) -> bool:
        """Its engine answered the last probe (a replica only remembered needs this)."""
        return replica_id in self.alive

    def targets(self) -> list[tuple[str, str]]:
        """(replica id, model-list URL) of every Ready replica on a node not Ready, the
        ones only remembered from the store included (``remembered`` names those)."""
        out = []
        remembered = set()
        for view in self.nodes.nodes.values():
            if view.state == NodeState.READY or not view.address:
                continue
            for rid, shard in view.routable().items():
                # A worker of a replica spanning nodes serves no HTTP: its leader does.
                if shard.state == ShardState.READY and shard.port and not shard.rank:
                    out.append((rid, engine_url(view.address, shard.port) + "/v1/models"))
                    if rid not in view.shards:
                        remembered.add(rid)
        self.remembered = remembered
        return out

    async def round(self, session: aiohttp.ClientSession) -> None:
        targets = self.targets()
        results = await asyncio.gather(*(self._check(session, rid, url) for rid, url in targets))
        dead = {rid for (rid, _), ok in zip(targets, results, strict=True) if not ok}
        alive = {rid for rid, _ in targets if rid in self.remembered} - dead
        if alive != self.alive:
            for rid in alive - self.alive:
                log.info("%s: its engine answers: served until its agent reports", rid)
            self.alive = alive
            self.version += 1
        if dead != self.dead:
            for rid in dead - self.dead:
                log.warning("%s: its agent is silent and its engine no longer answers", rid)
            for rid in self.dead & {rid for rid, _ in targets} - dead:
                log.info("%s: its engine answers again", rid)
            self.dead = dead
            self.version += 1
        self.rounds += 1
        self.last_round = time.time()
        self.checked.set()

    async def first_round(self) -> None:
        """Wait for the first round to end (at most a probe's timeout and a second)."""
        try:
            await asyncio.wait_for(self.checked.wait(), TIMEOUT + 1.0)
        except TimeoutError:
            log.warning("the first probe of known engines took over %g s", TIMEOUT + 1.0)

    async def _check(self, session: aiohttp.ClientSession, replica_id: str, url: str) -> bool:
        key = pki.engine_key(self.secret, replica_id)
        try:
            async with session.get(
                url,
                headers={"Authorization": f"Bearer {key}"},
                timeout=aiohttp.ClientTimeout(total=TIMEOUT),
            ) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.round(session)
            except Exception:
                log.exception("probing engines failed; trying again")
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.interval)
            except TimeoutError:
                pass
