"""The work only the leading control plane does, behind one switch.

The reconciler's loop (placing and stopping replicas), the flush of the gateway's usage
counts and the writes of node states change the store and the fleet: two control planes
doing them at once would fight. ``LeaderWork`` starts them when this control plane leads
and stops them, with a last flush, when it no longer does. Everything else (``/v1``,
the agents' streams, reading the catalog) runs on every control plane. Today a control
plane always leads from start to stop; the standby issue adds who decides.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("llmgw.leader")

# A loop that runs until its event is set.
Loop = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
# Written once more when leadership ends, so nothing counted is lost.
Flush = Callable[[], Awaitable[None]]
# How long a duty, or its last flush, is waited for when leadership ends.
STOP_WAIT = 5.0


@dataclass(frozen=True)
class Duty:
    name: str
    loop: Loop
    flush: Flush | None = None


class LeaderWork:
    def __init__(self, duties: list[Duty], label: str = "leading") -> None:
        self.duties = duties
        self.label = label
        self._stop = asyncio.Event()
        self._tasks: list[tuple[Duty, asyncio.Task[None]]] = []

    @property
    def leading(self) -> bool:
        return bool(self._tasks)

    def lead(self) -> None:
        """Start every duty; a second call while leading does nothing."""
        if self._tasks:
            return
        self._stop = asyncio.Event()
        self._tasks = [
            (duty, asyncio.create_task(duty.loop(self._stop), name=f"leader:{duty.name}"))
            for duty in self.duties
        ]
        log.info("%s: %s", self.label, ", ".join(d.name for d in self.duties))

    async def step_down(self, patience: float = STOP_WAIT) -> None:
        """Stop every duty, then flush what each still holds. A duty stuck on a store
        that does not answer is cancelled after ``patience`` seconds, and so is a flush:
        leadership must end even when the store is gone."""
        if not self._tasks:
            return
        self._stop.set()
        tasks, self._tasks = self._tasks, []
        _, stuck = await asyncio.wait([t for _, t in tasks], timeout=patience)
        for task in stuck:
            task.cancel()
        for duty, task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                log.warning("%s did not stop within %g s: cancelled", duty.name, patience)
            except Exception:
                log.exception("%s ended with an error", duty.name)
        for duty, _ in tasks:
            if duty.flush is None:
                continue
            try:
                await asyncio.wait_for(duty.flush(), patience)
            except Exception as exc:
                log.error("%s: what the last seconds held could not be written: %s", duty.name, exc)
