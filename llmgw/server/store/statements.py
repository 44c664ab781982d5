"""The SQL both store backends run, written once, and the ``Store`` methods built on it.

SQLite and PostgreSQL take the same statements: both write an upsert as ``INSERT ...
ON CONFLICT (...) DO UPDATE SET ... excluded.column``, none needs RETURNING, and where
PostgreSQL's statement said more (an old value named with its table beside ``excluded``,
a cast) it is written the way both accept. What is left to differ is the placeholder:
sqlite3 takes ``?``, psycopg ``%s``, with ``%%`` for a ``%`` of the statement's own. So
statements are written with ``?``, as SQLite runs them, and ``pyformat`` gives
PostgreSQL's.

``SQLStore`` is the interface (``base.Store``) over five steps each backend gives: read
rows, run a statement as one change, run one for many rows as one change, run one with
its audit entry, and run several in order with their audit entry. Each backend keeps
how those run (its connection, transactions, retries, what it says when the store
cannot be written), its migrations, and what only it does: SQLite's change capture for
standbys, PostgreSQL's leader lease.
"""

from __future__ import annotations

import abc
import functools
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.server.store.base import (
    ApiKeyRecord,
    Audit,
    JoinTokenRecord,
    Limited,
    ModelRecord,
    NodeRecord,
    Params,
    Registration,
    ServerRecord,
    SQLValue,
    Store,
)
from llmgw.server.store.directory import DirectoryRows, tools_column, tools_of
from llmgw.server.store.finetunes import FinetuneRows
from llmgw.server.store.jobrows import JobRows

# Also the backends' proof, at open, that the store takes writes.
PUT_SETTING = (
    "INSERT INTO settings (key, value) VALUES (?, ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
# Written in the same transaction as the change it describes (``SQLStore._audited``).
INSERT_AUDIT = (
    "INSERT INTO audit (at, actor, action, target, detail, org_id) VALUES (?, ?, ?, ?, ?, ?)"
)


def audit_row(audit: Audit) -> Params:
    """``INSERT_AUDIT``'s values for an entry (written now, unless it says when)."""
    at = time.time() if audit.at is None else audit.at
    return (at, audit.actor, audit.action, audit.target, audit.detail, audit.org)


@functools.cache
def pyformat(statement: str) -> str:
    """A statement written with ``?`` placeholders as psycopg takes it: ``%s`` for each,
    and each ``%`` of its own doubled, since psycopg reads every ``%`` of a statement run
    with parameters (the backends always give some, if only ``()``). A ``?`` inside a
    string literal is text and stays. Statements here quote no identifiers and hold no
    comments, so a single quote always opens or closes a literal."""
    parts = statement.replace("%", "%%").split("'")
    # Every odd part is inside a literal. A quote doubled inside one ('it''s') leaves an
    # empty even part between the two, which holds nothing to replace.
    return "'".join(p if i % 2 else p.replace("?", "%s") for i, p in enumerate(parts))


def _node(row: dict[str, Any]) -> NodeRecord:
    data = dict(row)
    data["facts"] = json.loads(data["facts"] or "{}") or None
    data["labels"] = json.loads(data.get("labels") or "{}")
    data["cordoned"] = bool(data.get("cordoned"))
    data["draining"] = bool(data.get("draining"))
    data["replicas"] = json.loads(data.get("replicas") or "[]")
    return NodeRecord(**data)


def _api_key(row: dict[str, Any]) -> ApiKeyRecord:
    data = dict(row)
    data["models"] = tuple(json.loads(data["models"] or "[]"))
    data["tools"] = tools_of(data["tools"])
    data["guard"] = tuple(json.loads(data["guard"] or "[]"))
    return ApiKeyRecord(**data)


class SQLStore(Store):
    """The interface, each method one statement of SQL written here (with ``?``): what a
    backend adds is how a statement runs, in the five steps below."""

    @abc.abstractmethod
    async def _read(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """The rows a query gives, as {column: value}."""

    @abc.abstractmethod
    async def _execute(self, sql: str, params: Params) -> int:
        """One statement as one change; the rows it touched."""

    @abc.abstractmethod
    async def _execute_many(self, sql: str, rows: Sequence[Params]) -> None:
        """One statement for each of ``rows``, all as one change."""

    @abc.abstractmethod
    async def _audited(
        self, sql: str, params: Params, audit: Audit, *, if_changed: bool = False
    ) -> int:
        """One statement and its audit entry (``INSERT_AUDIT``) as one change; the rows it
        touched. With ``if_changed`` a statement that touched nothing is not audited."""

    @abc.abstractmethod
    async def _audited_all(self, steps: Sequence[tuple[str, Params]], audit: Audit) -> None:
        """Several statements, in order, and their audit entry as one change: all of
        them, or none when one fails."""

    @functools.cached_property
    def directory(self) -> DirectoryRows:
        return DirectoryRows(self)

    @functools.cached_property
    def jobs(self) -> JobRows:
        return JobRows(self)

    @functools.cached_property
    def finetunes(self) -> FinetuneRows:
        return FinetuneRows(self)

    # settings

    async def get_setting(self, key: str) -> str | None:
        rows = await self._read("SELECT value FROM settings WHERE key = ?", (key,))
        return str(rows[0]["value"]) if rows else None

    async def put_setting(self, key: str, value: str) -> None:
        await self._execute(PUT_SETTING, (key, value))

    # admin tokens

    async def add_admin_token(self, token_id: str, token_hash: str) -> None:
        await self._execute(
            "INSERT INTO admin_tokens (id, token_hash, created_at) VALUES (?, ?, ?)",
            (token_id, token_hash, time.time()),
        )

    async def replace_admin_tokens(self, token_id: str, token_hash: str, audit: Audit) -> None:
        await self._audited_all(
            [
                ("DELETE FROM admin_tokens", ()),
                (
                    "INSERT INTO admin_tokens (id, token_hash, created_at) VALUES (?, ?, ?)",
                    (token_id, token_hash, time.time()),
                ),
            ],
            audit,
        )

    async def admin_token_hashes(self) -> list[str]:
        return [
            str(r["token_hash"]) for r in await self._read("SELECT token_hash FROM admin_tokens")
        ]

    # join tokens

    async def add_join_token(self, record: JoinTokenRecord) -> None:
        await self._execute(
            "INSERT INTO join_tokens (id, secret_sealed, created_at, expires_at, created_by) "
            "VALUES (?, ?, ?, ?, ?)",
            (
                record.id,
                record.secret_sealed,
                record.created_at,
                record.expires_at,
                record.created_by,
            ),
        )

    async def get_join_token(self, token_id: str) -> JoinTokenRecord | None:
        rows = await self._read("SELECT * FROM join_tokens WHERE id = ?", (token_id,))
        return JoinTokenRecord(**rows[0]) if rows else None

    async def use_join_token(self, token_id: str, node_id: str, at: float) -> bool:
        touched = await self._execute(
            "UPDATE join_tokens SET used_at = ?, used_by = ? WHERE id = ? AND used_at IS NULL",
            (at, node_id, token_id),
        )
        return touched == 1

    # nodes

    async def enroll_node(self, node_id: str, cert_serial: str, at: float) -> None:
        await self._execute(
            "INSERT INTO nodes (id, state, state_reason, cert_serial, enrolled_at) "
            "VALUES (?, 'NotReady', 'enrolled, not yet connected', ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET cert_serial = excluded.cert_serial, "
            "enrolled_at = excluded.enrolled_at",
            (node_id, cert_serial, at),
        )

    async def list_nodes(self) -> list[NodeRecord]:
        return [_node(r) for r in await self._read("SELECT * FROM nodes ORDER BY id")]

    async def get_node(self, node_id: str) -> NodeRecord | None:
        rows = await self._read("SELECT * FROM nodes WHERE id = ?", (node_id,))
        return _node(rows[0]) if rows else None

    async def register_nodes(self, records: Sequence[Registration]) -> None:
        if not records:
            return
        await self._execute_many(
            "UPDATE nodes SET address = ?, version = ?, facts = ?, registered_at = ?, "
            "last_seen = ?, state = 'Ready', state_reason = '' WHERE id = ?",
            [
                (address, version, json.dumps(facts), at, at, node_id)
                for node_id, address, version, facts, at in records
            ],
        )

    async def set_node_states(self, changes: list[tuple[str, str, str, float | None]]) -> None:
        if not changes:
            return
        # The last seen, which may be NULL, is typed for PostgreSQL (as its statement long
        # was); to SQLite DOUBLE PRECISION is REAL, the column's own type, so what it
        # stores is what it stored uncast.
        await self._execute_many(
            "UPDATE nodes SET state = ?, state_reason = ?, "
            "last_seen = COALESCE(CAST(? AS DOUBLE PRECISION), last_seen) WHERE id = ?",
            [(state, reason, seen, node_id) for node_id, state, reason, seen in changes],
        )

    async def set_node_replicas(
        self, changes: Sequence[tuple[str, Sequence[Mapping[str, object]]]]
    ) -> None:
        if not changes:
            return
        await self._execute_many(
            "UPDATE nodes SET replicas = ? WHERE id = ?",
            [
                (json.dumps(list(replicas), sort_keys=True), node_id)
                for node_id, replicas in changes
            ],
        )

    async def set_node_scheduling(
        self, node_id: str, cordoned: bool, draining: bool, labels: dict[str, str], audit: Audit
    ) -> None:
        await self._audited(
            "UPDATE nodes SET cordoned = ?, draining = ?, labels = ? WHERE id = ?",
            (int(cordoned), int(draining), json.dumps(labels, sort_keys=True), node_id),
            audit,
        )

    # models

    async def list_models(self) -> list[ModelRecord]:
        rows = await self._read("SELECT * FROM models ORDER BY name")
        return [
            ModelRecord(r["name"], json.loads(r["spec"]), r["created_at"], r["updated_at"])
            for r in rows
        ]

    async def put_model(self, name: str, spec: Mapping[str, object], audit: Audit) -> None:
        now = time.time()
        await self._audited(
            "INSERT INTO models (name, spec, created_at, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, "
            "updated_at = excluded.updated_at",
            (name, json.dumps(spec, sort_keys=True), now, now),
            audit,
        )

    async def delete_model(self, name: str, audit: Audit) -> bool:
        sql = "DELETE FROM models WHERE name = ?"
        return bool(await self._audited(sql, (name,), audit, if_changed=True))

    # gateway keys

    async def add_api_key(self, record: ApiKeyRecord, audit: Audit) -> None:
        await self._audited(
            "INSERT INTO api_keys (id, name, key_hash, models, rpm, tpm, budget, expires_at, "
            "created_at, priority, org_id, project_id, person_id, tools, guard) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.id,
                record.name,
                record.key_hash,
                json.dumps(list(record.models)),
                record.rpm,
                record.tpm,
                record.budget,
                record.expires_at,
                record.created_at,
                record.priority,
                record.org_id,
                record.project_id,
                record.person_id,
                tools_column(record.tools),
                json.dumps(list(record.guard)),
            ),
            audit,
        )

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        return [_api_key(r) for r in await self._read("SELECT * FROM api_keys ORDER BY created_at")]

    async def revoke_api_key(self, key_id: str, at: float, audit: Audit) -> bool:
        sql = "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL"
        return bool(await self._audited(sql, (at, key_id), audit, if_changed=True))

    async def set_api_key_priority(self, key_id: str, priority: int, audit: Audit) -> bool:
        sql = "UPDATE api_keys SET priority = ? WHERE id = ?"
        return bool(await self._audited(sql, (priority, key_id), audit, if_changed=True))

    async def set_limits(self, changes: Sequence[tuple[Limited, Audit]]) -> None:
        # Several audit entries in one transaction: each but the last is a step of its own.
        steps: list[tuple[str, Params]] = []
        for i, (record, audit) in enumerate(changes):
            if isinstance(record, ApiKeyRecord):
                steps.append(
                    (
                        "UPDATE api_keys SET models = ?, rpm = ?, tpm = ?, budget = ?, "
                        "tools = ?, guard = ? WHERE id = ?",
                        (
                            json.dumps(list(record.models)),
                            record.rpm,
                            record.tpm,
                            record.budget,
                            tools_column(record.tools),
                            json.dumps(list(record.guard)),
                            record.id,
                        ),
                    )
                )
            else:
                steps.append(DirectoryRows._upsert(record))
            if i < len(changes) - 1:
                steps.append((INSERT_AUDIT, audit_row(audit)))
        if changes:
            await self._audited_all(steps, changes[-1][1])

    # usage

    async def add_usage(self, rows: list[tuple[str, str, str, str, int, int, int]]) -> None:
        if not rows:
            return
        # The old counts are named with their table: PostgreSQL finds a bare ``requests``
        # ambiguous beside ``excluded.requests`` (SQLite takes either).
        await self._execute_many(
            "INSERT INTO usage (day, key_id, model, replica, requests, prompt_tokens, "
            "completion_tokens) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (day, key_id, model, replica) DO UPDATE SET "
            "requests = usage.requests + excluded.requests, "
            "prompt_tokens = usage.prompt_tokens + excluded.prompt_tokens, "
            "completion_tokens = usage.completion_tokens + excluded.completion_tokens",
            rows,
        )

    async def usage(self, since_day: str) -> list[dict[str, Any]]:
        return await self._read(
            "SELECT * FROM usage WHERE day >= ? ORDER BY day, key_id, model, replica",
            (since_day,),
        )

    # control planes

    async def put_server(self, record: ServerRecord, audit: Audit) -> None:
        await self._audited(
            "INSERT INTO servers (name, cert_serial, api_address, agent_address, peer_address, "
            "joined_at, removed_at) VALUES (?, ?, ?, ?, ?, ?, NULL) "
            "ON CONFLICT (name) DO UPDATE SET cert_serial = excluded.cert_serial, "
            "api_address = excluded.api_address, agent_address = excluded.agent_address, "
            "peer_address = excluded.peer_address, joined_at = excluded.joined_at, "
            "removed_at = NULL",
            (
                record.name,
                record.cert_serial,
                record.api_address,
                record.agent_address,
                record.peer_address,
                record.joined_at,
            ),
            audit,
        )

    async def list_servers(self) -> list[ServerRecord]:
        return [ServerRecord(**r) for r in await self._read("SELECT * FROM servers ORDER BY name")]

    async def remove_server(self, name: str, at: float, audit: Audit) -> bool:
        sql = "UPDATE servers SET removed_at = ? WHERE name = ? AND removed_at IS NULL"
        return bool(await self._audited(sql, (at, name), audit, if_changed=True))

    # admin page sessions signed out

    async def revoke_session(self, sid: str, expires_at: float, at: float, audit: Audit) -> bool:
        sql = (
            "INSERT INTO session_revocations (sid, expires_at, revoked_at) VALUES (?, ?, ?) "
            "ON CONFLICT (sid) DO NOTHING"
        )
        added = await self._audited(sql, (sid, expires_at, at), audit, if_changed=True)
        await self._execute("DELETE FROM session_revocations WHERE expires_at <= ?", (at,))
        return bool(added)

    async def revoked_sessions(self, now: float) -> dict[str, float]:
        rows = await self._read(
            "SELECT sid, expires_at FROM session_revocations WHERE expires_at > ?", (now,)
        )
        return {str(r["sid"]): float(r["expires_at"]) for r in rows}

    # audit

    async def audit(self, actor: str, action: str, target: str, detail: str = "") -> None:
        await self._execute(INSERT_AUDIT, audit_row(Audit(actor, action, target, detail)))

    async def audit_many(self, entries: Sequence[Audit]) -> None:
        await self._execute_many(INSERT_AUDIT, [audit_row(a) for a in entries])

    async def audit_log(
        self,
        limit: int = 100,
        org_id: str | None = None,
        actor: str | None = None,
        since: float | None = None,
    ) -> list[dict[str, Any]]:
        where: list[str] = []
        params: list[SQLValue] = []
        for clause, value in (("org_id = ?", org_id), ("actor = ?", actor), ("at >= ?", since)):
            if value is not None:
                where.append(clause)
                params.append(value)
        sql = "SELECT * FROM audit"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return await self._read(sql + " ORDER BY id DESC LIMIT ?", (*params, limit))
