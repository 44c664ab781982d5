"""The audit trail of calls and decisions: queued where they happen, written a batch at
a time with the time each happened, kept (ahead of newer ones) while the writer fails,
bounded, and carried from a standby to the leader as plain rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.server.audittrail import AuditTrail, entries_from_json, entry_json
from llmgw.server.store import Audit, SQLiteStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_entries_are_written_in_one_batch_with_the_time_they_happened(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    clock = Clock()
    trail = AuditTrail(store.audit_many, clock)
    trail.add("gateway", "mcp.call", "jira.create", "key ci; 12.0 ms; ok")
    clock.now += 5
    trail.add("guard", "guard.redact", "pii", "key ci; prompt; email at 0-9")
    assert await store.audit_log() == []  # nothing until the batch is written
    await trail.flush()
    entries = sorted(await store.audit_log(), key=lambda e: e["at"])
    assert [(e["actor"], e["action"], e["target"]) for e in entries] == [
        ("gateway", "mcp.call", "jira.create"),
        ("guard", "guard.redact", "pii"),
    ]
    assert [e["at"] for e in entries] == [1_800_000_000.0, 1_800_000_005.0]
    assert trail.written == 2 and not trail.queued
    await store.close()


async def test_a_batch_the_writer_refuses_stays_queued_ahead_of_newer_ones() -> None:
    written: list[list[str]] = []
    refuse = True

    async def write(batch: list[Audit]) -> None:
        if refuse:
            raise ConnectionError("a standby that knows no leader keeps its audit entries")
        written.append([e.target for e in batch])

    trail = AuditTrail(write, Clock(), limit=3)
    trail.add("gateway", "mcp.call", "a.x", "")
    trail.add("gateway", "mcp.call", "b.x", "")
    with pytest.raises(ConnectionError):
        await trail.flush()
    trail.add("gateway", "mcp.call", "c.x", "")
    trail.add("gateway", "mcp.call", "d.x", "")  # past the limit: the oldest goes
    assert trail.dropped == 1
    refuse = False
    await trail.flush()
    assert written == [["b.x", "c.x", "d.x"]]


def test_a_standbys_rows_are_read_back_as_they_were_and_bad_ones_named() -> None:
    sent = Audit("guard", "guard.block", "pii", "key ci; tool_args jira.create", at=12.5)
    (back,) = entries_from_json([entry_json(sent)])
    assert back == sent
    with pytest.raises(ValueError, match="entry 0: not"):
        entries_from_json([["12", "guard"]])
    with pytest.raises(ValueError, match="entry 1: its time is not a number"):
        entries_from_json([entry_json(sent), ["soon", "a", "b", "c", "d"]])
    with pytest.raises(ValueError, match="entry 0: expected a JSON string"):
        entries_from_json([[1.0, "a", 2, "c", "d"]])
