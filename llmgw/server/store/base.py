"""What the control plane keeps, as records, and the interface every backend gives.

The interface is narrow and transactional per call, so a PostgreSQL backend under
Patroni can stand in for SQLite without the callers knowing.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from llmgw.server.people.records import Org, Project, Team
from llmgw.server.store.directory import DirectoryRows
from llmgw.server.store.finetunes import FinetuneRows
from llmgw.server.store.jobrows import JobRows
from llmgw.server.store.values import Audit, Params, SQLValue

__all__ = ["Audit", "DirectoryRows", "Params", "SQLValue"]

# (node id, address, version, facts, when) of a node that registered.
Registration: TypeAlias = tuple[str, str | None, str, Mapping[str, object], float]


@dataclass(frozen=True)
class ApiKeyRecord:
    """A gateway key as kept: its hash only, never the key."""

    id: str
    name: str
    key_hash: str
    models: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    budget: int | None = None
    expires_at: float | None = None
    created_at: float = 0.0
    revoked_at: float | None = None
    # Served first when a model's replicas are all busy: higher first (the gateway's
    # queue); keys of one priority take turns.
    priority: int = 0
    # Whose it is: a project's (its organisation's too), or a person's in an organisation.
    org_id: str | None = None
    project_id: str | None = None
    person_id: str | None = None
    # MCP tools granted to the key itself (``people.records.Limits.tools``: None says
    # nothing, () is closed) and the guard policies named on it.
    tools: tuple[str, ...] | None = None
    guard: tuple[str, ...] = ()


# What carries limits (and tool grants): a key, or a level above it.
Limited: TypeAlias = ApiKeyRecord | Org | Team | Project


class StoreError(RuntimeError):
    """The store cannot do what was asked."""


@dataclass(frozen=True)
class Writability:
    """Whether the store takes writes now, and if not, why and the fix, in words."""

    ok: bool
    problem: str = ""


class StoreUnavailable(StoreError):
    """The store cannot be written now (an unwritable file, a full disk, a lock held
    elsewhere; a database server out of reach, or read-only as a replica is): the message
    says what and how to fix it. Nothing was changed."""


class StoreTooNew(StoreError):
    """The store was migrated by a newer llmgw: this one must not read or write it, since
    its rows may mean what this version does not know."""


@dataclass(frozen=True)
class NodeRecord:
    id: str
    cert_serial: str
    state: str
    enrolled_at: float
    address: str | None = None
    state_reason: str = ""
    version: str = ""
    facts: dict[str, Any] | None = None
    registered_at: float | None = None
    last_seen: float | None = None
    cordoned: bool = False
    draining: bool = False
    labels: dict[str, str] | None = None
    # The replicas its agent last reported Ready, as the wire writes shard statuses.
    replicas: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ModelRecord:
    """A catalog entry; ``spec`` is the model as ``llmgw.server.catalog.model`` writes it."""

    name: str
    spec: dict[str, Any]
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class JoinTokenRecord:
    id: str
    secret_sealed: str
    created_at: float
    expires_at: float
    created_by: str
    used_at: float | None = None
    used_by: str | None = None


@dataclass(frozen=True)
class ServerRecord:
    """A control plane of the cluster: where it answers, and the certificate it uses on
    the control planes' link (a removed one stays, so that certificate stays refused)."""

    name: str
    cert_serial: str
    api_address: str
    agent_address: str
    peer_address: str
    joined_at: float
    removed_at: float | None = None


class Store(abc.ABC):
    @abc.abstractmethod
    async def close(self) -> None: ...

    # Every write raises StoreUnavailable when the store itself refuses it (nothing is
    # changed then); ``writable`` says so until a write works again, which ``watch``
    # tries on its own while the control plane runs.
    @abc.abstractmethod
    def writable(self) -> Writability: ...

    @abc.abstractmethod
    async def watch(self, stop: asyncio.Event) -> None: ...

    # settings
    @abc.abstractmethod
    async def get_setting(self, key: str) -> str | None: ...

    @abc.abstractmethod
    async def put_setting(self, key: str, value: str) -> None: ...

    # admin tokens (hashes only)
    @abc.abstractmethod
    async def add_admin_token(self, token_id: str, token_hash: str) -> None: ...

    @abc.abstractmethod
    async def replace_admin_tokens(self, token_id: str, token_hash: str, audit: Audit) -> None:
        """Make this the one admin token: every other goes, in one transaction with the
        audit entry (which names neither the token nor its hash)."""

    @abc.abstractmethod
    async def admin_token_hashes(self) -> list[str]: ...

    # join tokens
    @abc.abstractmethod
    async def add_join_token(self, record: JoinTokenRecord) -> None: ...

    @abc.abstractmethod
    async def get_join_token(self, token_id: str) -> JoinTokenRecord | None: ...

    @abc.abstractmethod
    async def use_join_token(self, token_id: str, node_id: str, at: float) -> bool:
        """Mark the token used; False when it already was (a second use loses the race)."""

    # nodes
    @abc.abstractmethod
    async def enroll_node(self, node_id: str, cert_serial: str, at: float) -> None:
        """Record a node's (new) certificate; a re-enrolled node's old one stops working."""

    @abc.abstractmethod
    async def list_nodes(self) -> list[NodeRecord]: ...

    @abc.abstractmethod
    async def get_node(self, node_id: str) -> NodeRecord | None: ...

    @abc.abstractmethod
    async def register_nodes(self, records: Sequence[Registration]) -> None:
        """Write (node id, address, version, facts, when) of nodes that registered, in one
        transaction: after a restart thousands register within seconds."""

    async def register_node(
        self,
        node_id: str,
        address: str | None,
        version: str,
        facts: Mapping[str, object],
        at: float,
    ) -> None:
        await self.register_nodes([(node_id, address, version, facts, at)])

    @abc.abstractmethod
    async def set_node_states(self, changes: list[tuple[str, str, str, float | None]]) -> None:
        """Write (node id, state, reason, last seen) for several nodes in one transaction."""

    @abc.abstractmethod
    async def set_node_replicas(
        self, changes: Sequence[tuple[str, Sequence[Mapping[str, object]]]]
    ) -> None:
        """Write (node id, the replicas its agent reports Ready) for several nodes in one
        transaction: what a control plane started again routes to until the agent speaks."""

    @abc.abstractmethod
    async def set_node_scheduling(
        self, node_id: str, cordoned: bool, draining: bool, labels: dict[str, str], audit: Audit
    ) -> None:
        """Write whether a node takes new replicas, is being emptied, and its labels."""

    # models: each change is written in one transaction with its audit entry
    @abc.abstractmethod
    async def list_models(self) -> list[ModelRecord]: ...

    @abc.abstractmethod
    async def put_model(self, name: str, spec: Mapping[str, object], audit: Audit) -> None:
        """Create or replace a model's spec."""

    @abc.abstractmethod
    async def delete_model(self, name: str, audit: Audit) -> bool:
        """Remove a model; False when there was none."""

    # gateway keys
    @abc.abstractmethod
    async def add_api_key(self, record: ApiKeyRecord, audit: Audit) -> None: ...

    @abc.abstractmethod
    async def list_api_keys(self) -> list[ApiKeyRecord]: ...

    @abc.abstractmethod
    async def revoke_api_key(self, key_id: str, at: float, audit: Audit) -> bool:
        """Mark a key revoked; False when there is no such key or it already was."""

    @abc.abstractmethod
    async def set_api_key_priority(self, key_id: str, priority: int, audit: Audit) -> bool:
        """Set a key's priority; False when there is no such key."""

    @abc.abstractmethod
    async def set_limits(self, changes: Sequence[tuple[Limited, Audit]]) -> None:
        """Write the limits (rpm, tpm, budget, models, tools, guard) of keys and of
        organisations, teams and projects as given, each with its audit entry, all in one
        transaction: a revoke of a server's tools from a level and everything beneath it
        is whole or not at all. A key's other columns are left as they are."""

    # usage: (day, key id, model, replica) -> (requests, prompt, completion tokens)
    @abc.abstractmethod
    async def add_usage(self, rows: list[tuple[str, str, str, str, int, int, int]]) -> None:
        """Add counts to each (day, key, model, replica), in one transaction."""

    @abc.abstractmethod
    async def usage(self, since_day: str) -> list[dict[str, Any]]:
        """Every row from ``since_day`` (YYYY-MM-DD) on."""

    # control planes
    @abc.abstractmethod
    async def put_server(self, record: ServerRecord, audit: Audit) -> None:
        """Add a control plane, or replace the one of that name (a rejoin)."""

    @abc.abstractmethod
    async def list_servers(self) -> list[ServerRecord]:
        """Every control plane, removed ones too, by name."""

    @abc.abstractmethod
    async def remove_server(self, name: str, at: float, audit: Audit) -> bool:
        """Mark a control plane removed; False when there is none or it already was."""

    # admin page sessions signed out before their end (server/sessions.py, Revocations)
    @abc.abstractmethod
    async def revoke_session(self, sid: str, expires_at: float, at: float, audit: Audit) -> bool:
        """Keep a signed-out session's id until ``expires_at`` (when it would have ended),
        with its audit entry, and drop those ended by ``at``; False when it already was."""

    @abc.abstractmethod
    async def revoked_sessions(self, now: float) -> dict[str, float]:
        """Each signed-out session not yet ended by ``now``: its id and when it ends."""

    # people, organisations, teams, projects, memberships, personal tokens
    @property
    @abc.abstractmethod
    def directory(self) -> DirectoryRows: ...

    # serve jobs (written by the leader as they go, read by any control plane)
    @property
    @abc.abstractmethod
    def jobs(self) -> JobRows: ...

    # fine-tune jobs and their adapters
    @property
    @abc.abstractmethod
    def finetunes(self) -> FinetuneRows: ...

    # audit
    @abc.abstractmethod
    async def audit(self, actor: str, action: str, target: str, detail: str = "") -> None: ...

    @abc.abstractmethod
    async def audit_many(self, entries: Sequence[Audit]) -> None:
        """Entries that describe no change of the store (calls, decisions), in one
        transaction: a second's worth at once."""

    @abc.abstractmethod
    async def audit_log(
        self,
        limit: int = 100,
        org_id: str | None = None,
        actor: str | None = None,
        since: float | None = None,
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` entries first; with ``org_id``, ``actor`` or ``since``
        (a time), only those made in that organisation, by that actor, from then on."""
