"""A bounded, coalescing queue of messages waiting for a reader: no IO, no asyncio.

Every queue between the agent stream and whoever reads it is one of these: the agent's
outbox, the control plane's outbox to each node, and the answers of each ``ask()``. A
reader that stops reading must cost a fixed amount of memory, and what it reads when it
comes back must still be true. So:

- A message that says where something stands replaces the one of the same thing still
  waiting, in that one's place in line: ShardStatus per shard, DownloadProgress per
  source, EngineStatus and Heartbeat one each (a heartbeat keeps the older one's figures
  that the newer leaves out, as the control plane would have; whole cards replace
  the older one's moving figures of them).
- Lines of a followed log (a Response with ``more`` and a list of lines) merge into one
  batch per request of at most ``lines`` lines and ``line_bytes`` bytes. When full, the
  oldest go first, and the batch that goes out starts with a line saying how many were
  dropped there: the reader sees the gap, never a log that looks whole but is not.
- Everything else (commands, requests, final answers, Goodbye) must arrive as sent. At
  most ``limit`` entries wait in all; one more raises OutboxFull and the caller ends the
  stream: a peer that has read none of that many is not reading, and a new stream
  rebuilds what it knows from scratch (Register carries the whole state).
"""

from __future__ import annotations

import dataclasses
import re
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Hashable
from itertools import accumulate
from operator import methodcaller

from llmgw.wire.framing import MAX_FRAME
from llmgw.wire.messages import (
    DownloadProgress,
    EngineStatus,
    Heartbeat,
    Message,
    Response,
    ShardStatus,
    Slurm,
    SlurmStatus,
)

# Messages that must arrive, plus one entry per shard, source or followed log. A
# healthy stream holds a handful; this many unread means the peer has stopped reading.
LIMIT = 256
# Above the agent's own log ring (2,000 lines), so the tail a follow starts with is
# never cut; a reader more than this behind is told how many it missed instead.
LINES = 4096
# One batch goes out as one frame, so it must stay well inside MAX_FRAME (4 MiB) with
# msgpack's few bytes per line on top.
LINE_BYTES = 3 * 1024 * 1024
assert LINE_BYTES + LINES * 8 < MAX_FRAME

_MARKER = "[llmgw: {n} log line{s} dropped here; the reader fell behind]"
_MARKER_RE = re.compile(r"\[llmgw: (\d+) log lines? dropped here; the reader fell behind\]")
_MARKED = methodcaller("startswith", "[llmgw: ")
_HEARTBEAT = ("heartbeat",)
_ENGINES = ("engines",)
_SLURM = ("slurm",)
_SLURM_STATUS = ("slurm_status",)


class OutboxFull(Exception):
    """More messages that must arrive are waiting than the outbox holds."""


def dropped_marker(count: int) -> str:
    """The line that stands where ``count`` lines were dropped."""
    return _MARKER.format(n=count, s="" if count == 1 else "s")


def dropped_count(line: str) -> int | None:
    """How many lines a marker line stands for; None for any other line."""
    if not line.startswith("[llmgw: "):
        return None
    found = _MARKER_RE.fullmatch(line)
    return int(found.group(1)) if found else None


def coalesce_key(msg: Message) -> Hashable | None:
    """What a message is the latest word on, or None if it must arrive as sent. Keys of
    different kinds never meet: a shard's is its replica id (a str: no tuple to make on
    the busiest path), a download's and the singletons' tuples."""
    if isinstance(msg, ShardStatus):
        return msg.replica_id
    if isinstance(msg, DownloadProgress):
        return ("download", msg.source)
    if isinstance(msg, Heartbeat):
        return _HEARTBEAT
    if isinstance(msg, EngineStatus):
        return _ENGINES
    if isinstance(msg, SlurmStatus):
        return _SLURM_STATUS
    if isinstance(msg, Slurm):
        return _SLURM
    return None


def _is_lines(msg: Message) -> bool:
    return isinstance(msg, Response) and msg.more and msg.ok and isinstance(msg.result, list)


def _size(line: str) -> int:
    return len(line) if line.isascii() else len(line.encode())


class _Lines:
    """The waiting lines of one followed log, oldest first, and their sizes in bytes."""

    __slots__ = ("request_id", "lines", "sizes", "bytes", "marks", "dropped")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.lines: list[str] = []
        self.sizes: list[int] = []
        self.bytes = 0
        self.marks = 0  # marker lines among them (from the peer's own outbox)
        # Lines dropped before the first held one (not yet told to the reader).
        self.dropped = 0


class Outbox:
    """Put messages in as they are made; pop them as the reader can take them."""

    def __init__(
        self, limit: int = LIMIT, lines: int = LINES, line_bytes: int = LINE_BYTES
    ) -> None:
        self.limit = limit
        self.max_lines = lines
        self.line_bytes = line_bytes
        self._entries: OrderedDict[Hashable, Message | _Lines] = OrderedDict()
        self._serial = 0
        # Counters, for tests and status pages.
        self.coalesced = 0  # messages replaced by a newer word on the same thing
        self.dropped = 0  # log lines dropped (each told to its reader)

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def held_lines(self) -> int:
        return sum(len(e.lines) for e in self._entries.values() if isinstance(e, _Lines))

    def put(self, msg: Message) -> None:
        """Queue ``msg``; raises OutboxFull when it would take an entry past the limit."""
        if _is_lines(msg):
            assert isinstance(msg, Response)
            self._put_lines(msg)
            return
        key = coalesce_key(msg)
        if key is not None:
            older = self._entries.get(key)
            if older is not None:
                assert isinstance(older, Message)
                self._entries[key] = _newer(older, msg)
                self.coalesced += 1
                return
        else:
            self._serial += 1
            key = self._serial
        self._room()
        self._entries[key] = msg

    def pop(self) -> Message | None:
        """The message that has waited longest, or None when nothing waits."""
        if not self._entries:
            return None
        _, entry = self._entries.popitem(last=False)
        if isinstance(entry, _Lines):
            batch = list(entry.lines)
            if entry.dropped:
                batch.insert(0, dropped_marker(entry.dropped))
            return Response(id=entry.request_id, result=batch, more=True)
        return entry

    def clear(self) -> None:
        self._entries.clear()

    def _room(self) -> None:
        if len(self._entries) >= self.limit:
            raise OutboxFull(f"{len(self._entries)} messages wait to be read")

    def _put_lines(self, msg: Response) -> None:
        key = ("lines", msg.id)
        entry = self._entries.get(key)
        if entry is None:
            self._room()
            entry = self._entries[key] = _Lines(msg.id)
        assert isinstance(entry, _Lines)
        # Whole batches at a time, in C where it can be: a chatty engine's log must not
        # cost the agent a Python loop per line.
        lines: list[str] = msg.result
        if not set(map(type, lines)) <= {str}:
            lines = [str(line) for line in lines]
        if all(map(str.isascii, lines)):
            sizes = list(map(len, lines))
        else:
            sizes = [len(line.encode()) for line in lines]
        if sizes and max(sizes) > self.line_bytes:
            lines = [
                _cut(line, self.line_bytes // 2) if size > self.line_bytes else line
                for line, size in zip(lines, sizes, strict=True)
            ]
            sizes = [_size(line) for line in lines]
        if any(map(_MARKED, lines)):
            entry.marks += sum(1 for line in lines if dropped_count(line) is not None)
        entry.lines += lines
        entry.sizes += sizes
        entry.bytes += sum(sizes)
        drop = max(0, len(entry.lines) - self.max_lines)
        excess = entry.bytes - self.line_bytes
        if excess > 0:
            drop = max(drop, bisect_left(list(accumulate(entry.sizes)), excess) + 1)
        if not drop:
            return
        count = drop
        if entry.marks:
            # A marker dropped in turn still counts every line it stood for.
            for line in entry.lines[:drop]:
                told = dropped_count(line)
                if told is not None:
                    count += told - 1
                    entry.marks -= 1
        entry.bytes -= sum(entry.sizes[:drop])
        del entry.lines[:drop]
        del entry.sizes[:drop]
        entry.dropped += count
        self.dropped += count


def _newer(older: Message, newer: Message) -> Message:
    """The message that replaces ``older``: ``newer``, but a heartbeat keeps the older
    one's figures that it leaves out (absent means "unchanged", never "gone")."""
    if isinstance(older, Heartbeat) and isinstance(newer, Heartbeat):
        kept = {
            f.name: getattr(older, f.name)
            for f in dataclasses.fields(Heartbeat)
            if getattr(newer, f.name) is None and getattr(older, f.name) is not None
        }
        if newer.gpus is not None:
            # Whole cards replace the older one's moving figures of them; figures after
            # whole cards stay with them, laid over them by the control plane.
            kept.pop("gpu_figures", None)
        return dataclasses.replace(newer, **kept) if kept else newer
    return newer


def _cut(line: str, max_bytes: int) -> str:
    """A line too long for any batch, cut so that it fits, saying so."""
    head = line.encode()[:max_bytes].decode(errors="ignore")
    return f"{head} [llmgw: line cut here; it was {_size(line)} bytes]"
