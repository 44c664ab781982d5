"""The store's fine-tune jobs and the adapters they made, written once for both
backends as ``statements.py`` is.

A job is a row of ``finetunes`` (its record as JSON beside the columns that find it);
its adapter is rows of ``finetune_pieces``, base64 text in order, written in one
transaction with the job's succeeded state and its audit entry, so a job says
succeeded only with all of its adapter stored.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmgw.server.store.values import Audit, Params

UPSERT = (
    "INSERT INTO finetunes (id, name, model, state, doc, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET name = excluded.name, "
    "model = excluded.model, state = excluded.state, doc = excluded.doc, "
    "updated_at = excluded.updated_at"
)


class Steps(Protocol):
    """What a backend runs (``statements.SQLStore``'s steps)."""

    async def _read(self, sql: str, params: Params = ()) -> list[dict[str, Any]]: ...

    async def _execute_many(self, sql: str, rows: Sequence[Params]) -> None: ...

    async def _audited(
        self, sql: str, params: Params, audit: Audit, *, if_changed: bool = False
    ) -> int: ...

    async def _audited_all(self, steps: Sequence[tuple[str, Params]], audit: Audit) -> None: ...


@dataclass(frozen=True)
class FinetuneRow:
    id: str
    name: str
    model: str
    state: str
    doc: str
    created_at: float
    updated_at: float

    def params(self) -> Params:
        return (
            self.id,
            self.name,
            self.model,
            self.state,
            self.doc,
            self.created_at,
            self.updated_at,
        )


class FinetuneRows:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    async def list(self) -> list[FinetuneRow]:
        rows = await self.steps._read("SELECT * FROM finetunes ORDER BY created_at, id")
        return [FinetuneRow(**r) for r in rows]

    async def put(self, row: FinetuneRow, audit: Audit) -> None:
        """A new job, or a change said in the audit log (created, cancelled, failed)."""
        await self.steps._audited(UPSERT, row.params(), audit)

    async def put_many(self, rows: Sequence[FinetuneRow]) -> None:
        """Progress of running jobs, all as one change (no audit entry: steps and loss)."""
        await self.steps._execute_many(UPSERT, [r.params() for r in rows])

    async def finish(self, row: FinetuneRow, adapter: bytes, piece: int, audit: Audit) -> None:
        """The job succeeded with ``adapter``: its pieces (``piece`` bytes each) and its
        row in one change with the audit entry."""
        steps: list[tuple[str, Params]] = [("DELETE FROM finetune_pieces WHERE id = ?", (row.id,))]
        for n, at in enumerate(range(0, len(adapter), piece)):
            text = base64.b64encode(adapter[at : at + piece]).decode("ascii")
            steps.append(
                (
                    "INSERT INTO finetune_pieces (id, piece, data) VALUES (?, ?, ?)",
                    (row.id, n, text),
                )
            )
        steps.append((UPSERT, row.params()))
        await self.steps._audited_all(steps, audit)

    async def adapter(self, job_id: str) -> bytes | None:
        """The adapter a job stored, whole; None when it stored none."""
        rows = await self.steps._read(
            "SELECT data FROM finetune_pieces WHERE id = ? ORDER BY piece", (job_id,)
        )
        if not rows:
            return None
        return b"".join(base64.b64decode(str(r["data"])) for r in rows)
