"""The gateway's queue: requests for a model whose every replica is at its slots wait
here, in a bounded line per model, instead of piling onto the engines.

The contract:

- A request goes at once when no one of its model is waiting and a replica has room
  (fewer requests outstanding than the model's ``slots``); one that finds others
  waiting waits too, so no newcomer overtakes the line.
- Waiters are served by their key's priority, higher first, and within one priority by
  round robin across keys: each key with a waiter gets one turn before any key gets a
  second, so one key's hundred waiting requests cannot starve another key's one. A key
  is served its own requests in arrival order.
- A line holds at most ``depth`` waiters: past it a request is refused at once
  (``queue_full``); a waiter not served within ``wait`` seconds is refused
  (``queue_timeout``). Both are 429 ``Refusal``s carrying ``retry_after``, the seconds
  the model's recent waiters took (at least 1, at most ``wait``).
- A waiter that is cancelled (its client went away) leaves the line; one cancelled after
  it was woken passes its turn on to the next.
- When a request of the model ends (``released``), the next waiters are woken, as many
  as there are free slots not already promised to woken waiters. Each woken waiter picks
  its replica itself, synchronously, right before it is sent; if something else took the
  room first (a retry on another replica, a breaker opening), it goes back to the front
  of the line with its turn kept.
- Waiters also look again every ``recheck`` seconds, so room that appears without a
  request ending (a new replica, a breaker closing) is found, and a model whose
  replicas are all gone sends its waiters on to the gateway's no-replica answer.
- Nothing bounds a model whose room is ``None`` (an external provider's keys, or no
  usable replica): its requests are never held here.

Pure asyncio and plain data: the room and the pick are handed in, the clock is injected.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TypeVar

from llmgw.server.refusal import Refusal

T = TypeVar("T")
# Free slots of a model's usable replicas, or None when nothing bounds it.
Room = Callable[[str], int | None]
# A waiter that leaves the line, and the seconds it waited: for the metrics.
Waited = Callable[[str, float], None]
Clock = Callable[[], float]

# How often a waiter looks for room that appeared without a request ending.
RECHECK = 1.0
# The weight of the newest wait in a model's running mean (for Retry-After).
NEWEST = 0.2


class Waiter:
    """One waiting request: its key, its priority, when it came, and its wake-up."""

    __slots__ = ("key", "priority", "since", "woken")

    def __init__(self, key: str, priority: int, since: float) -> None:
        self.key = key
        self.priority = priority
        self.since = since
        self.woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class Line:
    """One model's waiters: by priority, then round robin across keys; each key's own
    requests in arrival order."""

    __slots__ = ("levels", "depth", "handoff", "mean_wait", "since")

    def __init__(self) -> None:
        # Priority -> key -> that key's waiters; the first key is the next to be served.
        self.levels: dict[int, OrderedDict[str, deque[Waiter]]] = {}
        self.depth = 0
        # When the line last went from empty to holding a waiter: its backlog began.
        self.since: float | None = None
        # Woken waiters that have not picked their replica yet: room promised to them.
        self.handoff = 0
        self.mean_wait = 0.0

    def push(self, waiter: Waiter, front: bool = False) -> None:
        """At the back of its key's requests; ``front``: first of all at its priority
        (a woken waiter that found no room keeps its turn)."""
        keys = self.levels.setdefault(waiter.priority, OrderedDict())
        mine = keys.get(waiter.key)
        if mine is None:
            mine = keys[waiter.key] = deque()
        if front:
            mine.appendleft(waiter)
            keys.move_to_end(waiter.key, last=False)
        else:
            mine.append(waiter)
        self.depth += 1
        if self.since is None or waiter.since < self.since:
            self.since = waiter.since

    def pop(self) -> Waiter | None:
        """The next to be served: the highest priority's first key, which then goes to
        the back of that priority's keys if it has more waiting."""
        if not self.levels:
            return None
        priority = max(self.levels)
        keys = self.levels[priority]
        key, mine = next(iter(keys.items()))
        waiter = mine.popleft()
        if mine:
            keys.move_to_end(key)
        else:
            del keys[key]
            if not keys:
                del self.levels[priority]
        self.depth -= 1
        if not self.depth:
            self.since = None
        return waiter

    def remove(self, waiter: Waiter) -> None:
        keys = self.levels.get(waiter.priority)
        mine = keys.get(waiter.key) if keys is not None else None
        if keys is None or mine is None or waiter not in mine:
            return
        mine.remove(waiter)
        self.depth -= 1
        if not self.depth:
            self.since = None
        if not mine:
            del keys[waiter.key]
            if not keys:
                del self.levels[waiter.priority]


class FairQueue:
    """Every model's line. ``room`` says how many more requests a model's replicas take
    now; ``wait`` and ``depth`` are ``gateway.queue_wait`` and ``gateway.queue_depth``."""

    def __init__(
        self,
        room: Room,
        wait: float,
        depth: int,
        waited: Waited = lambda model, seconds: None,
        clock: Clock = time.monotonic,
        recheck: float = RECHECK,
    ) -> None:
        self.room = room
        self.wait = wait
        self.max_depth = depth
        self.waited = waited
        self.clock = clock
        self.recheck = recheck
        # One line per model that ever waited (bounded by the catalog): kept, so its
        # depth reads 0 rather than vanishing.
        self._lines: dict[str, Line] = {}

    def depth(self, model: str) -> int:
        line = self._lines.get(model)
        return line.depth if line is not None else 0

    def depths(self) -> dict[str, int]:
        return {model: line.depth for model, line in self._lines.items()}

    def backlogs(self) -> dict[str, float]:
        """Per model with requests waiting, the seconds its line has held waiters without
        a break (since the oldest waiting came, or before: a waiter refused at
        ``gateway.queue_wait`` does not end a backlog that others still wait in)."""
        now = self.clock()
        return {
            model: max(0.0, now - line.since)
            for model, line in self._lines.items()
            if line.since is not None
        }

    async def admit(
        self, model: str, key: str, priority: int, pick: Callable[[], T | None]
    ) -> T | None:
        """``pick()``'s replica once this request's turn came and a replica has room;
        None when the model has no usable replica (not the queue's to hold: the caller
        answers as it would without a queue). Raises a 429 ``Refusal`` when the line
        is full or the wait runs out."""
        line = self._lines.get(model)
        if line is None:
            line = self._lines[model] = Line()
        if not line.depth and not line.handoff:
            got = pick()
            if got is not None or self.room(model) is None:
                return got
        if line.depth >= self.max_depth:
            raise self._refusal(
                model,
                line,
                "queue_full",
                f"its queue holds no more (gateway.queue_depth in server.yaml: {self.max_depth})",
            )
        waiter = Waiter(key, priority, self.clock())
        line.push(waiter)
        try:
            while True:
                await self._turn(model, line, waiter)
                line.handoff -= 1
                got = pick()
                if got is not None or self.room(model) is None:
                    self._left(model, line, waiter)
                    return got
                # Something else took the room first: the front of the line again.
                waiter.woken = asyncio.get_running_loop().create_future()
                line.push(waiter, front=True)
        except asyncio.CancelledError:
            if waiter.woken.done():  # woken, never picked: the turn goes on
                line.handoff -= 1
                self._wake(model, line)
            else:
                line.remove(waiter)
            self._left(model, line, waiter)
            raise

    async def _turn(self, model: str, line: Line, waiter: Waiter) -> None:
        """Until this waiter is woken; refused past its deadline."""
        deadline = waiter.since + self.wait
        self._wake(model, line)
        while not waiter.woken.done():
            left = deadline - self.clock()
            if left <= 0:
                line.remove(waiter)
                self._left(model, line, waiter)
                raise self._refusal(
                    model,
                    line,
                    "queue_timeout",
                    f"this request waited {self.wait:g} s in its queue "
                    "(gateway.queue_wait in server.yaml)",
                )
            await asyncio.wait((waiter.woken,), timeout=min(left, self.recheck))
            if not waiter.woken.done():
                self._wake(model, line)

    def released(self, model: str) -> None:
        """A request of ``model`` ended: its slot goes to the next in line."""
        line = self._lines.get(model)
        if line is not None and line.depth:
            self._wake(model, line)

    def _wake(self, model: str, line: Line) -> None:
        """Wake as many waiters, in turn, as the model has room not yet promised; all
        of them when nothing bounds it any more (no replica: they go on to say so)."""
        if not line.depth:
            return
        room = self.room(model)
        free = line.depth if room is None else room - line.handoff
        while free > 0:
            waiter = line.pop()
            if waiter is None:
                break
            waiter.woken.set_result(None)
            line.handoff += 1
            free -= 1

    def _left(self, model: str, line: Line, waiter: Waiter) -> None:
        seconds = max(0.0, self.clock() - waiter.since)
        line.mean_wait += NEWEST * (seconds - line.mean_wait)
        self.waited(model, seconds)

    def _refusal(self, model: str, line: Line, code: str, why: str) -> Refusal:
        retry = min(max(1, math.ceil(line.mean_wait)), max(1, math.ceil(self.wait)))
        return Refusal(
            429,
            code,
            f"every replica of '{model}' is busy and {why}; try again in {retry} s",
            retry_after=retry,
        )
