"""A standby's on-demand requests, passed to the leader.

Only the leader places replicas, so a request a standby gets for an on-demand model
must reach the leader's catalog: at zero to have a replica started, while it runs to
keep it from idling back to zero. ``DemandRelay`` gathers what the standby's gateway
asks (one entry per model, a start wanted winning over a keep-up), and its loop, a
standby duty, sends them on the control planes' link (``POST /peer/demand``) at once
for a start and every ``EVERY`` seconds for the rest. Meanwhile the standby's gateway
waits for the replica as the leader's does: it appears in the leader's fleet, which
the standby follows, and the standby serves it.

What cannot be sent (no leader known, the leader not answering) is kept and sent with
the next round, so a request waiting for its replica is not lost to one failed call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from llmgw.jsonvalue import JSONObject
from llmgw.server.ha.peerlink import PeerClient, PeerError

log = logging.getLogger("llmgw.ha.demand")

# How often a standby sends on the models it was asked for that need no start.
EVERY = 2.0
PATH = "/peer/demand"


class DemandRelay:
    def __init__(self, client: PeerClient, leader: Callable[[], str]) -> None:
        """``leader``: the leader's peer address as the standby knows it now ("" when it
        knows none)."""
        self.client = client
        self.leader = leader
        self.pending: dict[str, bool] = {}
        self.sent = 0
        self._now = asyncio.Event()

    def ask(self, model: str, start: bool) -> None:
        """The standby's gateway wants ``model`` up (``start``: and started if at zero)."""
        self.pending[model] = self.pending.get(model, False) or start
        if start:
            self._now.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            waiters = [asyncio.ensure_future(self._now.wait()), asyncio.ensure_future(stop.wait())]
            try:
                await asyncio.wait(waiters, timeout=EVERY, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
            self._now.clear()
            if self.pending and not stop.is_set():
                await self.send()

    async def send(self) -> bool:
        """Send what is pending to the leader; kept for the next round when it cannot."""
        leader = self.leader()
        if not leader or not self.pending:
            return False
        models, self.pending = self.pending, {}
        body: JSONObject = {"models": dict(models)}
        try:
            await self.client.json("POST", leader, PATH, body, timeout=5)
        except (PeerError, OSError, TimeoutError) as exc:
            log.warning("could not pass on-demand requests to the leader %s: %s", leader, exc)
            for model, start in models.items():
                self.ask(model, start)
            self._now.clear()
            return False
        self.sent += 1
        return True

    async def close(self) -> None:
        """Stopping: one last try for what is pending."""
        with contextlib.suppress(Exception):
            await self.send()
