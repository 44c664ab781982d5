"""Leadership by a lease in PostgreSQL, for control planes sharing one store under
Patroni: the store's primary is the one arbiter, so no quorum of our own is needed.

Every control plane asks for the lease every round (``ROUND`` seconds): the holder
renews it, the others take it only once it expired, with the term one higher
(``PostgresStore.take_lease``, one UPDATE on the primary). A holder that has not renewed
for ``ttl - 2 * ROUND`` seconds, because the store is gone or cut off, stops leading on
its own, before another can take the lease; and every write it still tries is checked
against the lease in its own transaction (``PostgresStore.fence``), so two control planes
never both write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from llmgw.server.store import StoreError

log = logging.getLogger("llmgw.ha")

# How often the lease is asked for, and the longest one ask may take.
ROUND = 2.0


class Lease(Protocol):
    holder: str | None
    term: int

    def held_by(self, name: str) -> bool: ...


class LeaseStore(Protocol):
    fence: tuple[str, int] | None

    async def take_lease(self, name: str, ttl: float) -> Lease: ...

    async def release_lease(self, name: str) -> None: ...


class LeaseKeeper:
    def __init__(self, store: LeaseStore, name: str, ttl: float) -> None:
        self.store = store
        self.name = name
        # At least three rounds: a holder must renew twice before it would stop.
        self.ttl = max(ttl, 3 * ROUND)
        # Monotonic time of the last renewal that worked; what it said last.
        self.renewed: float | None = None
        self.last: Lease | None = None
        self.problem = ""
        # An ask still under way: a store cut off silently can hold one for as long as
        # TCP takes to give up, and it is never asked twice at once.
        self._asking: asyncio.Task[Lease] | None = None

    async def round(self) -> Lease | None:
        """Ask for the lease, waiting at most a round; None when the store did not
        answer (the ask goes on, and the next round takes its answer)."""
        if self._asking is None:
            self._asking = asyncio.create_task(self.store.take_lease(self.name, self.ttl))
        asking = self._asking
        done, _ = await asyncio.wait({asking}, timeout=ROUND)
        if not done:
            self._failed("the store did not answer within a round")
            return None
        self._asking = None
        try:
            lease = asking.result()
        except StoreError as exc:
            self._failed(str(exc))
            return None
        self.problem = ""
        self.last = lease
        if lease.held_by(self.name):
            self.renewed = time.monotonic()
        return lease

    def _failed(self, why: str) -> None:
        problem = f"the leader's lease cannot be asked for: {why}"
        if problem != self.problem:
            log.warning("%s", problem)
        self.problem = problem
        return None

    def held(self) -> bool:
        """Whether this control plane may go on leading: renewed recently enough that no
        other can have taken the lease meanwhile."""
        if self.renewed is None:
            return False
        return time.monotonic() - self.renewed < self.ttl - 2 * ROUND

    def fence(self, term: int | None) -> None:
        self.store.fence = None if term is None else (self.name, term)

    async def release(self) -> None:
        self.fence(None)
        if self._asking is not None:
            self._asking.cancel()
            self._asking = None
        try:
            await asyncio.wait_for(self.store.release_lease(self.name), ROUND)
        except (StoreError, TimeoutError) as exc:
            log.warning("could not give the leader's lease up (it expires by itself): %s", exc)
