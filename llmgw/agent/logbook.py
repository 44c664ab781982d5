"""In-memory tails of logs: the agent's own last lines and each engine's, for
``ctl logs`` and for the last words of a crash. Bounded, so a chatty engine costs a
fixed amount of memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path

AGENT_LINES = 2000
ENGINE_LINES = 500


class LogRing:
    """The last ``size`` lines, with listeners for ``--follow``."""

    def __init__(self, size: int) -> None:
        self.lines: deque[str] = deque(maxlen=size)
        self._listeners: set[Callable[[str], None]] = set()

    def add(self, line: str) -> None:
        self.lines.append(line)
        for listener in list(self._listeners):
            listener(line)

    def tail(self, n: int) -> list[str]:
        if n <= 0:
            return []
        return list(self.lines)[-n:]

    def listen(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener`` with each new line until the returned function is called."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)


class RingHandler(logging.Handler):
    """Copies the agent's log records into a LogRing."""

    def __init__(self, ring: LogRing) -> None:
        super().__init__()
        self.ring = ring
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.ring.add(self.format(record))
        except Exception:  # a log handler must never raise into the code that logged
            self.handleError(record)


def last_lines_of(path: Path, n: int, max_bytes: int = 256 * 1024) -> list[str]:
    """The last ``n`` lines of a file, reading at most its last ``max_bytes``."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first may be cut in half
    return lines[-n:]


async def follow_file(path: Path, ring: LogRing, stop: asyncio.Event, poll: float = 0.2) -> None:
    """Copy lines appended to ``path`` into ``ring`` until ``stop`` is set.

    Engines write to a file rather than a pipe to the agent, so an agent that dies does
    not take them down with a broken pipe, and a new agent can pick the tail up again.
    """
    for line in last_lines_of(path, ring.lines.maxlen or ENGINE_LINES):
        ring.add(line)
    try:
        offset = path.stat().st_size
    except OSError:
        offset = 0
    partial = b""
    while not stop.is_set():
        try:
            size = path.stat().st_size
        except OSError:
            size = offset
        if size < offset:  # truncated or replaced: start over
            offset, partial = 0, b""
        if size > offset:
            with path.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read(size - offset)
            offset += len(chunk)
            data = partial + chunk
            *complete, partial = data.split(b"\n")
            for raw in complete:
                ring.add(raw.decode(errors="replace").rstrip("\r"))
        try:
            await asyncio.wait_for(stop.wait(), timeout=poll)
        except TimeoutError:
            pass
    if partial:
        ring.add(partial.decode(errors="replace"))
