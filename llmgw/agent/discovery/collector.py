"""Slow readers kept apart from the heartbeat: each on its own schedule, with its own
deadline, one read at a time.

A heartbeat takes what each collector last read, with how old it is, and never waits
for a read (kubelet and dcgm-exporter keep their heartbeats apart from slow collectors
the same way). A read that misses its deadline is cancelled: a tool run through
``agent/command.py`` is killed and reaped then. Until a cancelled read has ended (a
process stuck in the kernel ignores even SIGKILL until the driver lets it go) no other
read of that collector starts, so a hung ``nvidia-smi`` costs one process, not one more
per heartbeat.

A read that missed its deadline or failed leaves the collector with no figures (absent,
never the last good ones) and a warning that names the tool, since when it fails and
what to do; the next good read clears both. Warnings read
``TOOL: what happened (since HH:MM:SS UTC). Fix: what to do``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger("llmgw.agent.discovery.collector")

T = TypeVar("T")


class ReadFailed(Exception):
    """A read that ran but gave nothing usable: what went wrong, and the fix when the
    collector's own does not fit."""

    def __init__(self, detail: str, fix: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fix = fix


@dataclass(frozen=True)
class Reading(Generic[T]):
    """One good read: its value and when it ended (the collector's clock)."""

    value: T
    at: float


def _utc(wall: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(wall))


class Collector(Generic[T]):
    """Runs ``read`` every ``interval`` seconds (from one start to the next), gives up
    on it after ``deadline`` seconds, and keeps the latest good reading.

    ``tool`` names what is read in the warning (a callable when it depends on what the
    read chose, as NVML or nvidia-smi); ``doing`` what a read that missed its deadline
    was doing ("reading the filesystems of /srv"); ``fix`` is the warning's advice. Nothing runs
    until ``start`` (or the first ``next``); ``close`` ends the schedule and any read.
    ``turned`` is called when the tool stops answering and when it answers again, so
    the news can go out at once rather than with the next heartbeat.
    """

    def __init__(
        self,
        tool: str | Callable[[], str],
        read: Callable[[], Awaitable[T]],
        *,
        interval: float,
        deadline: float,
        fix: str,
        doing: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        turned: Callable[[], None] = lambda: None,
    ) -> None:
        self._tool = tool
        self._turned = turned
        self._read = read
        self.interval = interval
        self.deadline = deadline
        self._fix = fix
        self._doing = f" {doing}" if doing else ""
        self._clock = clock
        self._wall = wall
        self.latest: Reading[T] | None = None
        self.warning: str | None = None
        self._failing_since: float | None = None  # wall clock
        self._loop: asyncio.Task[None] | None = None
        self._current: asyncio.Future[T] | None = None
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()
        # Reads started and reads ended (a missed deadline ends when the read does).
        self.started = 0
        self.ended = 0

    @property
    def tool(self) -> str:
        return self._tool if isinstance(self._tool, str) else self._tool()

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    @property
    def scheduled(self) -> bool:
        """Whether ``start`` (or ``next``) set it going."""
        return self._loop is not None

    @property
    def in_flight(self) -> bool:
        return self._current is not None and not self._current.done()

    def age(self) -> float | None:
        """Seconds since the latest good reading ended; None when there is none."""
        return None if self.latest is None else max(0.0, self._clock() - self.latest.at)

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.create_task(self._schedule())

    async def next(self, timeout: float) -> Reading[T] | None:
        """The reading of a read started from now on (one is started at once unless one
        is under way, which is waited for first), waited for up to ``timeout`` seconds;
        the latest good one (or None) when that did not end in time."""
        target = self.started + 1
        self.start()
        self._wake.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.ended < target:
                    await self._ended.wait()
        return self.latest

    async def _schedule(self) -> None:
        while True:
            began = self._clock()
            self._wake.clear()
            await self._read_once()
            self.ended += 1
            self._ended.set()
            self._ended = asyncio.Event()
            wait = began + self.interval - self._clock()
            if wait > 0 and not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()

    async def _read_once(self) -> None:
        self.started += 1
        task = self._current = asyncio.ensure_future(self._read())
        done, _ = await asyncio.wait({task}, timeout=self.deadline)
        if not done:
            self._failed(f"no answer in {self.deadline:g} s{self._doing}", None)
            task.cancel()
            # However long it takes: the next read starts only once this one has ended.
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: it ended late and is not used
            return
        try:
            value = task.result()
        except ReadFailed as exc:
            self._failed(exc.detail, exc.fix)
        except Exception as exc:  # a reader's bug must not end the schedule
            log.exception("%s: the read failed", self.tool)
            self._failed(f"the read failed ({type(exc).__name__}: {exc})", None)
        else:
            self.latest = Reading(value, self._clock())
            if self._failing_since is not None:
                log.info("%s answers again", self.tool)
                self.warning = self._failing_since = None
                self._turned()

    def _failed(self, detail: str, fix: str | None) -> None:
        turning = self._failing_since is None
        if self._failing_since is None:
            self._failing_since = self._wall()
            log.warning("%s: %s", self.tool, detail)
        self.latest = None
        self.warning = (
            f"{self.tool}: {detail} (since {_utc(self._failing_since)}). Fix: {fix or self._fix}"
        )
        if turning:
            self._turned()

    async def close(self) -> None:
        """Stop the schedule and any read under way (its process killed and reaped)."""
        for task in (self._loop, self._current):
            if task is not None:
                task.cancel()
        pending = {t for t in (self._loop, self._current) if t is not None}
        if pending:
            # Bounded: a read stuck past SIGKILL must not hold the agent's exit.
            await asyncio.wait(pending, timeout=5)
        self._loop = self._current = None
