"""When Python's cycle collector runs in the control plane, and over what.

A control plane with thousands of agents holds millions of objects that live as long as
the agents' streams do (their connections, HTTP/2 and TLS state, registered facts and
cards) and makes as many that live a heartbeat (each heartbeat's records replace the
last). Left to itself the interpreter promotes the heartbeat's records to its oldest
generation, since they outlive several young collections, and starts a full collection
each time that generation has grown by a quarter: at 5,000 nodes of 8 cards one about
every 10 seconds, walking every object and holding the event loop for over a second
(``docs/performance.md``): a tenth of a core, heartbeats and ``/v1`` answers late by a
second, and a ``/metrics`` scrape that met one or two on its way.

So the control plane collects on its own schedule, with the interpreter's own turned off:

* every ``young`` seconds the two young generations: what was made since, a few
  hundred thousand objects at most, milliseconds;
* every ``settle`` seconds the oldest generation too, then what survived is frozen
  (``gc.freeze``): kept out of every later walk. The oldest generation then holds only
  what was promoted since: mostly every node's figures of its last heartbeat, which
  at 5,000 agents with 8 cards hold the loop about 0.4 s a minute. And sooner whenever
  half as many small objects again live as at the last (``sys.getallocatedblocks``,
  the interpreter's own count, under a millisecond to read): while thousands of agents
  connect at once (a control plane started, or taking over), their streams' objects
  are walked and frozen a slice at a time (0.03 to 0.34 s each at 5,000 x 8), not all
  in the first minute's walk (0.88 to 0.98 s). A scrape with fleet detail on, whose
  snapshots live as long as it does, adds about a fifth and sets none off
  (``docs/performance.md``);
* every ``hour`` the frozen objects are walked again (``gc.unfreeze``, a full
  collection, frozen again), so that a reference cycle among them (a connection that
  closed) is not kept for ever: at 5,000 nodes about a second, once an hour.

Objects that nothing refers to any more go at once, frozen or not (reference counting
does not wait for the collector); only garbage in reference cycles waits for a walk.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("llmgw.collector")

YOUNG = 1.0
SETTLE = 60.0
HOUR = 3600.0
# Small objects alive grown by this share since the last settled walk: a walk now.
SETTLE_GROWTH = 0.5
MIDDLE, OLDEST = 1, 2


@dataclass
class Tally:
    """Walks of one kind made by the schedule, and the longest one held the loop."""

    count: int = 0
    longest: float = 0.0


@dataclass
class Walks:
    young: Tally = field(default_factory=Tally)
    settled: Tally = field(default_factory=Tally)
    whole: Tally = field(default_factory=Tally)


class Collector:
    """The cycle collector on a schedule (see the module's docstring)."""

    def __init__(
        self,
        young: float = YOUNG,
        settle: float = SETTLE,
        hour: float = HOUR,
        settle_growth: float = SETTLE_GROWTH,
        alive: Callable[[], int] = sys.getallocatedblocks,
    ) -> None:
        """``alive``: how many small objects live now (the interpreter's count)."""
        if not 0 < young <= settle <= hour:
            raise ValueError("the collector needs 0 < young <= settle <= hour")
        self.young = young
        self.settle = settle
        self.hour = hour
        self.settle_growth = settle_growth
        self.alive = alive
        self.walks = Walks()
        self._was_enabled = gc.isenabled()

    def start(self) -> None:
        """What the control plane has loaded is frozen, and the interpreter's own
        schedule stops."""
        gc.disable()
        gc.collect()
        gc.freeze()

    def stop(self) -> None:
        """Back to the interpreter's own schedule (frozen objects are walked again)."""
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()

    def collect_young(self) -> float:
        """The two young generations."""
        return self._walk(self.walks.young, MIDDLE)

    def collect_settled(self) -> float:
        """The oldest generation too (frozen objects aside), then what lives is frozen."""
        return self._walk(self.walks.settled, OLDEST, freeze=True)

    def collect_whole(self) -> float:
        """Every object walked, frozen ones too, then frozen again."""
        held = self._walk(self.walks.whole, OLDEST, thaw=True, freeze=True)
        log.info("every object walked in %.3f s; %d kept", held, gc.get_freeze_count())
        return held

    @staticmethod
    def _walk(tally: Tally, generation: int, *, thaw: bool = False, freeze: bool = False) -> float:
        """One collection; the seconds it held the interpreter."""
        start = time.perf_counter()
        if thaw:
            gc.unfreeze()
        gc.collect(generation)
        if freeze:
            gc.freeze()
        held = time.perf_counter() - start
        tally.count += 1
        tally.longest = max(tally.longest, held)
        return held

    async def run(self, stop: asyncio.Event) -> None:
        self.start()
        try:
            settled = whole = time.monotonic()
            alive_then = self.alive()
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), self.young)
                    return
                except TimeoutError:
                    pass
                now = time.monotonic()
                alive = self.alive()
                alive_then = min(alive_then, alive)  # grown from its lowest since
                if now - whole >= self.hour:
                    self.collect_whole()
                    settled = whole = now
                    alive_then = alive
                elif now - settled >= self.settle or alive >= alive_then * (1 + self.settle_growth):
                    self.collect_settled()
                    settled = now
                    alive_then = alive
                else:
                    self.collect_young()
        finally:
            self.stop()
