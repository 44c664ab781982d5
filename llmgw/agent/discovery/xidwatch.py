"""Xids as they happen: the kernel log followed, or NVML's event set where it cannot be.

``XidWatch`` keeps, per card, each Xid code seen: how many times and when last. It reads
``/dev/kmsg`` (root only on most systems; every record since boot on the first read,
then what is new) and places each report on a card by its PCI address. Where the kernel
log cannot be read, NVML's critical-Xid events are taken instead, from the moment the
agent started. Both at once would count each Xid twice, so the log wins when readable.

A ``/dev/kmsg`` record reads ``PRIORITY,SEQ,MICROSECONDS,FLAGS;MESSAGE``, the time being
microseconds since boot; ``boot_time`` turns it into wall-clock time.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llmgw.agent.discovery.xid import parse_xid_line, xid_meaning
from llmgw.wire.hardware import XidSeen

KMSG = Path("/dev/kmsg")
_MAX_READS = 100_000  # records read in one go: a flood is read in the next beat


def boot_time() -> float:
    """When the machine booted, wall clock."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


@dataclass
class _Seen:
    count: int
    last: float


def _pci_key(bus_id: str) -> str:
    """'00000000:3B:00.0' / '0000:3b:00' -> '3b:00', the part every form shares."""
    parts = bus_id.lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else bus_id.lower()


class XidWatch:
    """Xids per card UUID. ``read`` takes what is new; ``seen`` says what is known."""

    def __init__(self, kmsg: Path = KMSG, boot: float | None = None) -> None:
        self._path = kmsg
        self._boot = boot_time() if boot is None else boot
        self._fd: int | None = None
        self._log_state = "untried"  # "open", "unreadable"
        self._seen: dict[str, dict[int, _Seen]] = {}
        self._rest = ""

    @property
    def uses_kernel_log(self) -> bool:
        return self._log_state == "open"

    def _open(self) -> None:
        try:
            self._fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK)
            self._log_state = "open"
        except OSError:
            self._log_state = "unreadable"

    def _records(self) -> Iterable[tuple[float, str]]:
        assert self._fd is not None
        for _ in range(_MAX_READS):
            try:
                raw = os.read(self._fd, 8192)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten before we read them: go on from here
                raise
            if not raw:
                return  # a plain file (tests): its end
            # /dev/kmsg gives one whole record a read; a plain file may split one.
            text = self._rest + raw.decode("utf-8", "replace")
            lines = text.split("\n")
            self._rest = lines.pop()
            for record in lines:
                head, sep, message = record.partition(";")
                if not sep:
                    continue  # a continuation line (" KEY=value")
                fields = head.split(",")
                try:
                    micros = int(fields[2])
                except (IndexError, ValueError):
                    continue
                yield self._boot + micros / 1e6, message

    def read(self, cards_by_bus: Mapping[str, str]) -> None:
        """Take the kernel log's new Xid reports; ``cards_by_bus`` maps bus ids to UUIDs."""
        if self._log_state == "untried":
            self._open()
        if self._fd is None:
            return
        where = {_pci_key(bus): uuid for bus, uuid in cards_by_bus.items()}
        try:
            for at, message in self._records():
                event = parse_xid_line(message)
                if event is None:
                    continue
                uuid = where.get(_pci_key(event.pci), f"pci:{event.pci}")
                self._note(uuid, event.code, at)
        except OSError:
            self.close()
            self._log_state = "unreadable"

    def nvml_events(self, events: Iterable[tuple[str, int]], now: float | None = None) -> None:
        """NVML's Xid events (card UUID, code), taken only when the log is unreadable."""
        if self.uses_kernel_log:
            return
        at = time.time() if now is None else now
        for uuid, code in events:
            self._note(uuid, code, at)

    def _note(self, uuid: str, code: int, at: float) -> None:
        seen = self._seen.setdefault(uuid, {}).get(code)
        if seen is None:
            self._seen[uuid][code] = _Seen(1, at)
        else:
            seen.count += 1
            seen.last = max(seen.last, at)

    def seen(self, uuid: str) -> list[XidSeen]:
        """Each code seen on a card, oldest last-seen first."""
        codes = self._seen.get(uuid, {})
        return sorted(
            (
                XidSeen(code=code, count=s.count, last=s.last, meaning=xid_meaning(code)[0])
                for code, s in codes.items()
            ),
            key=lambda x: x.last,
        )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
