"""The store's serve jobs (table ``jobs``, migration 0013), written once for both
backends as ``statements.py`` is.

A job is kept as its JSON body (what the admin API answers, ``catalog/jobs.py`` reads
and writes it) with its id, kind, model, state and times beside it. Writes are not
audited: a job is a record of what the reconciler did after an audited serve, written
every few seconds while it runs. The table is kept bounded here: each new job prunes the
oldest past ``KEEP`` and those older than ``KEEP_SECONDS``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from llmgw.server.store.values import Params

# The newest jobs kept, and for how long at most.
KEEP = 200
KEEP_SECONDS = 7 * 86400.0

UPSERT = (
    "INSERT INTO jobs (id, kind, model, state, body, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
    "state = excluded.state, body = excluded.body, updated_at = excluded.updated_at"
)
PRUNE = (
    "DELETE FROM jobs WHERE created_at < ? OR id NOT IN "
    "(SELECT id FROM jobs ORDER BY created_at DESC, id DESC LIMIT ?)"
)


class Steps(Protocol):
    """What a backend runs (``statements.SQLStore``'s steps)."""

    async def _read(self, sql: str, params: Params = ()) -> list[dict[str, Any]]: ...

    async def _execute(self, sql: str, params: Params) -> int: ...


@dataclass(frozen=True)
class JobRecord:
    """A job as kept: ``body`` is its JSON object, decoded."""

    id: str
    kind: str
    model: str
    state: str
    body: dict[str, Any]
    created_at: float
    updated_at: float


def _record(row: dict[str, Any]) -> JobRecord:
    return JobRecord(
        id=str(row["id"]),
        kind=str(row["kind"]),
        model=str(row["model"]),
        state=str(row["state"]),
        body=json.loads(row["body"]),
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )


class JobRows:
    """The ``jobs`` table over a store's steps."""

    def __init__(self, store: Steps) -> None:
        self.store = store

    async def put(self, record: JobRecord) -> None:
        """Create or rewrite a job (its state, body and time updated)."""
        body = json.dumps(record.body, separators=(",", ":"))
        await self.store._execute(
            UPSERT,
            (
                record.id,
                record.kind,
                record.model,
                record.state,
                body,
                record.created_at,
                record.updated_at,
            ),
        )

    async def prune(self, now: float) -> int:
        """Drop the jobs past the newest ``KEEP`` and those older than ``KEEP_SECONDS``;
        how many went."""
        return await self.store._execute(PRUNE, (now - KEEP_SECONDS, KEEP))

    async def get(self, job_id: str) -> JobRecord | None:
        rows = await self.store._read("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return _record(rows[0]) if rows else None

    async def newest(self, limit: int = KEEP, model: str | None = None) -> list[JobRecord]:
        """The newest jobs first; with ``model``, only that model's."""
        if model is None:
            sql = "SELECT * FROM jobs ORDER BY created_at DESC, id DESC LIMIT ?"
            rows = await self.store._read(sql, (limit,))
        else:
            sql = "SELECT * FROM jobs WHERE model = ? ORDER BY created_at DESC, id DESC LIMIT ?"
            rows = await self.store._read(sql, (model, limit))
        return [_record(r) for r in rows]

    async def running(self) -> list[JobRecord]:
        """Every job still running, oldest first (a new leader carries them on)."""
        rows = await self.store._read(
            "SELECT * FROM jobs WHERE state = ? ORDER BY created_at, id", ("running",)
        )
        return [_record(r) for r in rows]
