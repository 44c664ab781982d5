"""Gateway keys, their usage and the cluster's serving switch, as services.

``KeyService`` makes, lists, revokes and reprioritises the keys clients send to
``/v1``, and reads their usage and energy per token: a key is shown once, when made;
the store keeps its SHA-256 only. Its allowlist holds model name patterns (``qwen*``);
its limits are requests and tokens a minute and a token budget a month; its priority
orders the gateway's queue (higher first). After it is made its priority may change (the
cluster's operators'), and its limits, MCP tools and guard policies (``set_limits``, by
those who manage it: ``gateway/grants.py`` checks what is asked). ``ServingSwitch`` is
``llmgw stop`` and ``llmgw start``: ``/v1`` refuses and every model goes to zero, the
catalog unchanged.

A key belongs to a project (and so to its team and organisation) or to a person in an
organisation; a key made without saying whose goes to the default organisation's default
project, as every key made before organisations did. Who may make, see and revoke which
key is ``people/rights.py``'s: a project's keys by the cluster's operators and the
managers of its organisation or team, a personal key by its person. A key the caller
may not see is answered as not found.

Both take the caller as a ``Principal`` (its name goes into the audit log) and refuse
with ``Refusal``; the admin API's routes and the admin pages call them alike.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from llmgw.server.gateway.grants import (
    LimitsSet,
    asked,
    limits_detail,
    limits_of,
    policy_names,
    without,
)
from llmgw.server.gateway.limits import KeyBook, key_hash, new_key
from llmgw.server.people import rights
from llmgw.server.people.asks import SetKeyLimits
from llmgw.server.people.directory import Directory
from llmgw.server.people.records import DEFAULT_ORG, DEFAULT_PROJECT, Project
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import CreateKey, UpdateKey, UsageQuery
from llmgw.server.store import ApiKeyRecord, Audit, Store, StoreUnavailable
from llmgw.wire.admin import EnergyJson, KeyJson, KeyState

STOPPED_SETTING = "serving.stopped"
NO_SUCH_KEY = "no such key; see `llmgw ctl keys list`"


def key_json(record: ApiKeyRecord, now: float | None = None) -> KeyJson:
    """A key as the admin API shows it: never the key itself."""
    now = time.time() if now is None else now
    state: KeyState
    if record.revoked_at is not None:
        state = "revoked"
    elif record.expires_at is not None and now >= record.expires_at:
        state = "expired"
    else:
        state = "active"
    return {
        "id": record.id,
        "name": record.name,
        "state": state,
        "models": list(record.models),
        "rpm": record.rpm,
        "tpm": record.tpm,
        "budget": record.budget,
        "priority": record.priority,
        "expires_at": record.expires_at,
        "created_at": record.created_at,
        "revoked_at": record.revoked_at,
        "org_id": record.org_id,
        "project_id": record.project_id,
        "person_id": record.person_id,
        "tools": None if record.tools is None else list(record.tools),
        "guard": list(record.guard),
    }


def expiry(value: float | str | None) -> float | None:
    """Seconds since the epoch, or an ISO date (midnight UTC) or date and time."""
    if value is None or isinstance(value, float):
        return value
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise Refusal(
            400, "bad_request", f"expires: {value!r} is not a date (like 2027-01-31)", "expires"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def day(value: str | None, name: str) -> str | None:
    """An ISO date (2026-12-01) as the store writes its days, or a 400 naming the field."""
    if value is None:
        return None
    try:
        if len(value) == 10:
            return dt.date.fromisoformat(value).isoformat()
    except ValueError:
        pass
    raise Refusal(400, "bad_request", f"{name}: {value!r} is not a date (like 2026-12-01)", name)


class KeyService:
    def __init__(
        self,
        store: Store,
        keys: KeyBook,
        flush: Callable[[], Awaitable[None]],
        replica_tokens: Mapping[tuple[str, str], int],
        joules_of: Callable[[str], float],
        directory: Directory,
        clock: Callable[[], float] = time.time,
        policies: Callable[[], Awaitable[frozenset[str]]] | None = None,
    ) -> None:
        """``flush`` writes the usage counted so far; ``replica_tokens`` are the tokens
        each (model, replica) answered here, ``joules_of`` a replica's card energy;
        ``policies`` the names of the guard policies that exist (the store's ``"guard"``
        document by default)."""
        self.store = store
        self.policies = policies or (lambda: policy_names(store))
        self.directory = directory
        self.keys = keys
        self.flush = flush
        self.replica_tokens = replica_tokens
        self.joules_of = joules_of
        self.clock = clock

    def records(self, by: Principal) -> list[ApiKeyRecord]:
        """The keys the caller may see."""
        return [r for r in self.keys.records() if self.sees(by, r)]

    def find(self, key_id: str, by: Principal) -> ApiKeyRecord:
        record = self.keys.find(key_id)
        if record is None or not self.sees(by, record):
            raise Refusal(404, "not_found", NO_SUCH_KEY)
        return record

    def _project(self, record: ApiKeyRecord) -> Project | None:
        return self.directory.now.projects.get(record.project_id or "")

    def sees(self, by: Principal, record: ApiKeyRecord) -> bool:
        if by.may("viewer") or (record.person_id is not None and record.person_id == by.person):
            return True
        project = self._project(record)
        if project is not None:
            return rights.sees_keys(by, project)
        return rights.reads_org(by, record.org_id or "")

    def manages(self, by: Principal, record: ApiKeyRecord) -> bool:
        if by.may("operator") or (record.person_id is not None and record.person_id == by.person):
            return True
        project = self._project(record)
        if project is not None:
            return rights.manages_keys(by, project)
        return rights.manages_own_keys(by, record.org_id or "")

    def keys_in(self, scope_id: str) -> int:
        """Active keys of an organisation or project."""
        return sum(
            1
            for r in self.keys.records()
            if r.revoked_at is None and scope_id in (r.org_id, r.project_id)
        )

    def _owner(self, ask: CreateKey, by: Principal) -> tuple[str, str | None, str | None]:
        """(organisation, project, person) of a key asked for, checked against the caller."""
        org_id = DEFAULT_ORG
        if ask.org is not None:
            org = self.directory.find_org(ask.org)
            if org is None or not rights.sees_org(by, org.id):
                raise Refusal(404, "not_found", "no such organisation; see `llmgw ctl orgs list`")
            org_id = org.id
        if ask.personal:
            if by.person is None:
                raise Refusal(
                    400, "bad_request", "personal: only a signed-in person has keys of their own"
                )
            if ask.org is None and len(by.orgs) == 1:
                org_id = next(iter(by.orgs))
            if not rights.makes_personal_key(by, org_id):
                raise Refusal(
                    403, "forbidden", "a personal key is made in an organisation of yours"
                )
            return org_id, None, by.person
        project = self._find_project(org_id, ask.project or DEFAULT_PROJECT, ask.org is None)
        if not rights.sees_org(by, project.org_id):
            # Another organisation's project is not found, as an unknown one.
            ref = ask.project or DEFAULT_PROJECT
            raise Refusal(404, "not_found", f"project: no project {ref!r} there", "project")
        if not rights.manages_keys(by, project):
            raise Refusal(
                403,
                "forbidden",
                "making a project's key needs its team's or organisation's "
                "manager role, or the cluster's operator role",
            )
        return project.org_id, project.id, None

    def _find_project(self, org_id: str, ref: str, any_org: bool) -> Project:
        projects = self.directory.now.projects
        found = projects.get(ref)
        if found is not None and (any_org or found.org_id == org_id):
            return found
        teams = self.directory.now.teams
        for p in projects.values():
            full = f"{teams[p.team_id].name}/{p.name}" if p.team_id in teams else p.name
            if p.org_id == org_id and ref.casefold() in (p.name.casefold(), full.casefold()):
                return p
        raise Refusal(404, "not_found", f"project: no project {ref!r} there", "project")

    def month_tokens(self, key_id: str) -> int | None:
        """Tokens the key used this month, as far as this control plane counted."""
        return self.keys.usage.month.get(key_id)

    async def create(self, ask: CreateKey, by: Principal) -> tuple[ApiKeyRecord, str]:
        """A new key and the key itself, which is never shown again."""
        now = self.clock()
        expires = expiry(ask.expires)
        if expires is not None and expires <= now:
            raise Refusal(400, "bad_request", "expires: that date has passed", "expires")
        org_id, project_id, person_id = self._owner(ask, by)
        key = new_key()
        record = ApiKeyRecord(
            id=secrets.token_hex(6),
            name=ask.name.strip(),
            key_hash=key_hash(key),
            models=ask.models,
            rpm=ask.rpm,
            tpm=ask.tpm,
            budget=ask.budget,
            expires_at=expires,
            created_at=now,
            priority=ask.priority,
            org_id=org_id,
            project_id=project_id,
            person_id=person_id,
        )
        detail = f"{record.name}; models {', '.join(ask.models) or 'all'}"
        if ask.priority:
            detail += f"; priority {ask.priority}"
        audit = Audit(by.name, "key.create", record.id, detail, org_id)
        await self.store.add_api_key(record, audit)
        self.keys.changed(record)
        return record, key

    async def revoke(self, key_id: str, by: Principal) -> ApiKeyRecord:
        """Revoked at once; a key revoked before stays as it was."""
        record = self.find(key_id, by)
        if not self.manages(by, record):
            raise Refusal(403, "forbidden", "revoking this key needs its project's manager role")
        now = self.clock()
        audit = Audit(by.name, "key.revoke", record.id, record.name, record.org_id)
        if await self.store.revoke_api_key(record.id, now, audit):
            record = replace(record, revoked_at=now)
            self.keys.changed(record)
        return record

    async def update(self, key_id: str, ask: UpdateKey, by: Principal) -> ApiKeyRecord:
        """A key's priority: its place in the gateway's queue (the cluster's operators')."""
        record = self.find(key_id, by)
        if not by.may("operator"):
            raise Refusal(403, "forbidden", "a key's priority needs the cluster's operator role")
        audit = Audit(by.name, "key.update", record.id, f"priority {ask.priority}", record.org_id)
        if not await self.store.set_api_key_priority(record.id, ask.priority, audit):
            raise Refusal(404, "not_found", NO_SUCH_KEY)
        record = replace(record, priority=ask.priority)
        self.keys.changed(record)
        return record

    async def set_limits(self, key_id: str, ask: SetKeyLimits, by: Principal) -> LimitsSet:
        """A key's own limits, MCP tools and guard policies (its levels' bind it too), by
        those who manage it; fields left out stay, ``clear`` lifts, ``revoke_tools``
        takes what reaches that MCP server from its tools."""
        record = self.keys.find(key_id)
        if record is None or not self.sees(by, record):
            raise Refusal(404, "unknown_key", f"no key {key_id}: `llmgw ctl keys list` lists them")
        if not self.manages(by, record):
            raise Refusal(
                403, "forbidden", "changing this key's limits needs its project's manager role"
            )
        limits = asked(limits_of(record), ask, await self.policies())
        if ask.revoke_tools is not None:
            limits = replace(limits, tools=without(limits.tools, ask.revoke_tools))
        changed = replace(
            record,
            rpm=limits.rpm,
            tpm=limits.tpm,
            budget=limits.budget,
            models=limits.models,
            tools=limits.tools,
            guard=limits.guard,
        )
        detail = f"{record.name}; {limits_detail(limits)}"
        await self.store.set_limits(
            [(changed, Audit(by.name, "key.limits", record.id, detail, record.org_id))]
        )
        self.keys.changed(changed)
        return LimitsSet(limits)

    async def usage(self, ask: UsageQuery, by: Principal) -> list[dict[str, Any]]:
        """Requests and tokens per day, key, model and replica: ``days`` back, today
        included, or from ``since`` to ``until`` (both included); ``since`` alone runs to
        today, ``until`` alone is the ``days`` up to it. Only the keys the caller may
        see; with ``by``, summed over the period per organisation, team, project, key
        or person."""
        until = day(ask.until, "until")
        since = day(ask.since, "since")
        if since is None:  # `days` back from `until`, or from today
            last = dt.date.fromisoformat(until) if until else self._today()
            since = (last - dt.timedelta(days=ask.days - 1)).isoformat()
        if until is not None and since > until:
            raise Refusal(400, "bad_request", f"since: {since} is after until ({until})", "since")
        org_id = None
        if ask.org is not None:
            org = self.directory.find_org(ask.org)
            if org is None or not rights.sees_org(by, org.id):
                raise Refusal(404, "not_found", "org: no such organisation", "org")
            org_id = org.id
        try:
            await self.flush()
        except StoreUnavailable:
            pass  # what could not be written stays pending; the store's rows are shown
        keys = {r.id: r for r in self.keys.records()}
        rows = []
        for row in await self.store.usage(since):
            record = keys.get(row["key_id"])
            if until is not None and row["day"] > until:
                continue
            if record is None:
                if not by.may("viewer") or org_id is not None:
                    continue
            elif not self.sees(by, record) or (org_id is not None and record.org_id != org_id):
                continue
            row["key_name"] = record.name if record else None
            row["org_id"] = record.org_id if record else None
            row["project_id"] = record.project_id if record else None
            row["person_id"] = record.person_id if record else None
            rows.append(row)
        return rows if ask.by is None else self._summed(rows, ask.by)

    def _summed(self, rows: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
        """Rows summed per organisation, team, project, key or person, with its name."""
        now = self.directory.now
        out: dict[str | None, dict[str, Any]] = {}
        for row in rows:
            project = now.projects.get(row["project_id"] or "")
            if by == "team":
                ident = project.team_id if project else None
                team = now.teams.get(ident or "")
                name = team.name if team else None
            elif by == "org":
                ident = row["org_id"]
                org = now.orgs.get(ident or "")
                name = org.name if org else None
            elif by == "project":
                ident = row["project_id"]
                name = project.name if project else None
            elif by == "person":
                ident = row["person_id"]
                person = now.people.get(ident or "")
                name = person.login if person else None
            else:
                ident, name = row["key_id"], row["key_name"]
            entry = out.setdefault(
                ident,
                {
                    "by": by,
                    "id": ident,
                    "name": name,
                    "requests": 0,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                },
            )
            for field in ("requests", "prompt_tokens", "completion_tokens"):
                entry[field] += row[field]
        return sorted(out.values(), key=lambda e: (e["id"] is None, str(e["name"] or e["id"])))

    def energy(self) -> list[EnergyJson]:
        """Each replica's card energy and answered tokens since this control plane
        started, where its cards' power was read."""
        out: list[EnergyJson] = []
        for (model, replica), tokens in sorted(self.replica_tokens.items()):
            joules = self.joules_of(replica)
            if tokens > 0 and joules > 0:
                out.append(
                    {
                        "model": model,
                        "replica": replica,
                        "joules": round(joules, 3),
                        "tokens": tokens,
                        "joules_per_token": round(joules / tokens, 6),
                    }
                )
        return out

    def _today(self) -> dt.date:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC).date()


class ServingSwitch:
    """``llmgw stop`` / ``llmgw start``: kept in the store, so every control plane (and
    this one after a restart) serves or stops alike."""

    def __init__(self, store: Store, apply: Callable[[bool], None]) -> None:
        """``apply`` stops or starts ``/v1`` and the catalog's replicas in memory."""
        self.store = store
        self.apply = apply
        self.stopped = False
        self._loaded = False

    async def load(self) -> None:
        """What the store says, applied (again only when it changed: a standby's store
        changed under it)."""
        stopped = (await self.store.get_setting(STOPPED_SETTING)) == "true"
        if stopped != self.stopped or not self._loaded:
            self._loaded = True
            self.stopped = stopped
            self.apply(stopped)

    async def set(self, stopped: bool, by: Principal) -> bool:
        await self.store.put_setting(STOPPED_SETTING, "true" if stopped else "false")
        await self.store.audit(by.name, "serving.stop" if stopped else "serving.start", "/v1")
        self.stopped = stopped
        self.apply(stopped)
        return stopped
