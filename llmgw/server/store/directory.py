"""The store's people, organisations, teams, projects, memberships and personal tokens
(``server/people/records.py``), and SCIM's users and groups (``server/scim/records.py``),
written once for both backends as ``statements.py`` is.

Each record goes to its table and comes back whole: ``Limits`` as six columns (the
models and guard policies JSON lists, the tools a JSON list or NULL when the level says
nothing of tools), flags as 0 or 1. Every change is one statement with its audit
entry, or several in one transaction (a person deactivated with their tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any, Protocol, TypeVar

from llmgw.server.people.records import (
    Limits,
    Membership,
    Org,
    Person,
    PersonToken,
    Project,
    Team,
)
from llmgw.server.scim.records import ScimGroup, ScimUser
from llmgw.server.store.values import Audit, Params, SQLValue


class Steps(Protocol):
    """What a backend runs (``statements.SQLStore``'s steps)."""

    async def _read(self, sql: str, params: Params = ()) -> list[dict[str, Any]]: ...

    async def _audited(
        self, sql: str, params: Params, audit: Audit, *, if_changed: bool = False
    ) -> int: ...

    async def _audited_all(self, steps: Sequence[tuple[str, Params]], audit: Audit) -> None: ...


R = TypeVar("R", Person, Org, Team, Project, Membership, PersonToken, ScimUser, ScimGroup)

TABLES: Mapping[type[Any], tuple[str, tuple[str, ...]]] = {
    Person: ("people", ("id",)),
    Org: ("orgs", ("id",)),
    Team: ("teams", ("id",)),
    Project: ("projects", ("id",)),
    Membership: ("memberships", ("person_id", "kind", "scope_id")),
    PersonToken: ("person_tokens", ("id",)),
    ScimUser: ("scim_users", ("person_id",)),
    ScimGroup: ("scim_groups", ("id",)),
}
ORDER = {
    "people": "login",
    "orgs": "name",
    "teams": "org_id, name",
    "projects": "org_id, team_id, name",
    "memberships": "kind, scope_id, person_id",
    "person_tokens": "created_at",
    "scim_users": "created_at",
    "scim_groups": "created_at, id",
}
_BOOLS = {"role_by_hand", "active", "by_hand"}
# Kept as a JSON list (a SCIM group's members).
_LISTS = {"members"}


def tools_column(tools: tuple[str, ...] | None) -> str | None:
    """A tool grant as its column holds it: NULL says nothing, a JSON list otherwise
    (``[]``: closed)."""
    return None if tools is None else json.dumps(list(tools))


def tools_of(column: str | None) -> tuple[str, ...] | None:
    return None if column is None else tuple(json.loads(column))


def _encode(record: object) -> dict[str, SQLValue]:
    row: dict[str, SQLValue] = {}
    for name, value in asdict(record).items():  # type: ignore[call-overload]
        if name == "limits":
            limits = Limits(**value) if isinstance(value, dict) else value
            row.update(
                rpm=limits.rpm,
                tpm=limits.tpm,
                budget=limits.budget,
                models=json.dumps(list(limits.models)),
                tools=tools_column(limits.tools),
                guard=json.dumps(list(limits.guard)),
            )
        elif name in _BOOLS:
            row[name] = int(bool(value))
        elif name in _LISTS:
            row[name] = json.dumps(list(value))
        else:
            row[name] = value
    return row


def _decode(kind: type[R], row: Mapping[str, Any]) -> R:
    data: dict[str, Any] = {}
    for f in fields(kind):
        if f.name == "limits":
            data["limits"] = Limits(
                rpm=row["rpm"],
                tpm=row["tpm"],
                budget=row["budget"],
                models=tuple(json.loads(row["models"] or "[]")),
                tools=tools_of(row["tools"]),
                guard=tuple(json.loads(row["guard"] or "[]")),
            )
        elif f.name in _BOOLS:
            data[f.name] = bool(row[f.name])
        elif f.name in _LISTS:
            data[f.name] = tuple(json.loads(row[f.name] or "[]"))
        else:
            data[f.name] = row[f.name]
    return kind(**data)


class DirectoryRows:
    """The directory's tables, over a store's steps (read, one audited change, several)."""

    def __init__(self, store: Steps) -> None:
        self.store = store

    async def all(self, kind: type[R]) -> list[R]:
        table, _ = TABLES[kind]
        rows = await self.store._read(f"SELECT * FROM {table} ORDER BY {ORDER[table]}")
        return [_decode(kind, r) for r in rows]

    @staticmethod
    def _upsert(record: object) -> tuple[str, Params]:
        table, key = TABLES[type(record)]
        row = _encode(record)
        names = list(row)
        rest = [n for n in names if n not in key] or list(key)
        sql = (
            f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET "
            + ", ".join(f"{n} = excluded.{n}" for n in rest)
        )
        return sql, tuple(row.values())

    @staticmethod
    def _delete(record: object) -> tuple[str, Params]:
        table, key = TABLES[type(record)]
        row = _encode(record)
        sql = f"DELETE FROM {table} WHERE " + " AND ".join(f"{k} = ?" for k in key)
        return sql, tuple(row[k] for k in key)

    async def put(self, record: object, audit: Audit) -> None:
        """Create or replace a record, with its audit entry."""
        sql, params = self._upsert(record)
        await self.store._audited(sql, params, audit)

    async def change(self, puts: Sequence[object], deletes: Sequence[object], audit: Audit) -> None:
        """Records created or replaced and records removed, in one transaction with the
        audit entry: all of them or none."""
        steps = [self._delete(r) for r in deletes] + [self._upsert(r) for r in puts]
        await self.store._audited_all(steps, audit)

    async def delete(self, record: object, audit: Audit) -> bool:
        """Remove a record; False when there was none."""
        sql, params = self._delete(record)
        return bool(await self.store._audited(sql, params, audit, if_changed=True))
