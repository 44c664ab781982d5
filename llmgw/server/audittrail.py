"""Audit entries that describe no change of the store: the MCP gateway's tool calls and
the guard's decisions, many a second. Each is queued where it happens (never awaited on
a request's path) and a second's worth is written at once, in one transaction: to this
control plane's store when it leads, to the leader's (``POST /peer/audit``) when it is
a standby, whose store takes no writes. What cannot be written yet stays queued and goes
with the next batch; past ``MAX_QUEUED`` the oldest are dropped and counted (a store
down for long must not take the control plane's memory with it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from llmgw.jsonvalue import JSON, as_str
from llmgw.server.store import Audit, StoreUnavailable

log = logging.getLogger("llmgw.audit")

MAX_QUEUED = 10_000
EVERY = 1.0

AuditWriter = Callable[[list[Audit]], Awaitable[None]]


def entry_json(entry: Audit) -> list[JSON]:
    """One entry as a standby sends it to the leader."""
    return [entry.at, entry.actor, entry.action, entry.target, entry.detail]


def entries_from_json(rows: Sequence[JSON]) -> list[Audit]:
    """What a standby sent (``entry_json``'s rows); ValueError naming a bad one."""
    out = []
    for n, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 5:
            raise ValueError(f"entry {n}: not [at, actor, action, target, detail]")
        at, actor, action, target, detail = row
        if not isinstance(at, int | float) or isinstance(at, bool):
            raise ValueError(f"entry {n}: its time is not a number")
        try:
            texts = as_str(actor), as_str(action), as_str(target), as_str(detail)
        except TypeError as exc:
            raise ValueError(f"entry {n}: {exc}") from None
        out.append(Audit(*texts, at=float(at)))
    return out


class AuditTrail:
    """The queue and its writer; ``write`` decides where a batch goes (the store, or the
    leader) when it is called."""

    def __init__(
        self,
        write: AuditWriter,
        clock: Callable[[], float] = time.time,
        limit: int = MAX_QUEUED,
    ) -> None:
        self.write = write
        self.clock = clock
        self.limit = limit
        self.queued: deque[Audit] = deque()
        self.written = 0
        self.dropped = 0
        self._said: str | None = None

    def add(self, actor: str, action: str, target: str, detail: str) -> None:
        """Queue an entry, stamped now."""
        queued = self.queued
        if len(queued) >= self.limit:
            queued.popleft()
            self.dropped += 1
        queued.append(Audit(actor, action, target, detail, None, self.clock()))

    async def flush(self) -> None:
        """Write what is queued as one batch; on failure it stays queued, ahead of what
        came meanwhile (the oldest dropped past the limit)."""
        if not self.queued:
            return
        batch, self.queued = list(self.queued), deque()
        try:
            await self.write(batch)
        except BaseException:
            kept = deque(batch)
            kept.extend(self.queued)
            while len(kept) > self.limit:
                kept.popleft()
                self.dropped += 1
            self.queued = kept
            raise
        self.written += len(batch)

    async def run(self, stop: asyncio.Event) -> None:
        """Write once a second until ``stop``; a failure is said once until it changes."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=EVERY)
            except TimeoutError:
                pass
            try:
                await self.flush()
                self._said = None
            except StoreUnavailable:
                pass  # the store says so itself; written once it takes writes again
            except Exception as exc:
                said = f"{type(exc).__name__}: {exc}"
                if said != self._said:
                    log.warning(
                        "%d audit entries not written yet (%s); kept and tried again",
                        len(self.queued),
                        said,
                    )
                    self._said = said
