"""Gateway keys, their usage and the cluster's serving switch, as services.

``KeyService`` makes, lists, revokes and reprioritises the keys clients send to
``/v1``, and reads their usage and energy per token: a key is shown once, when made;
the store keeps its SHA-256 only. Its allowlist holds model name patterns (``qwen*``);
its limits are requests and tokens a minute and a token budget a month; its priority
orders the gateway's queue (higher first) and is the one thing that may change after it
is made. ``ServingSwitch`` is ``llmgw stop`` and ``llmgw start``: ``/v1`` refuses and
every model goes to zero, the catalog unchanged.

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

from llmgw.server.gateway.limits import KeyBook, key_hash, new_key
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
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``flush`` writes the usage counted so far; ``replica_tokens`` are the tokens
        each (model, replica) answered here, ``joules_of`` a replica's card energy."""
        self.store = store
        self.keys = keys
        self.flush = flush
        self.replica_tokens = replica_tokens
        self.joules_of = joules_of
        self.clock = clock

    def records(self) -> list[ApiKeyRecord]:
        return self.keys.records()

    def find(self, key_id: str) -> ApiKeyRecord:
        record = self.keys.find(key_id)
        if record is None:
            raise Refusal(404, "not_found", NO_SUCH_KEY)
        return record

    def month_tokens(self, key_id: str) -> int | None:
        """Tokens the key used this month, as far as this control plane counted."""
        return self.keys.usage.month.get(key_id)

    async def create(self, ask: CreateKey, by: Principal) -> tuple[ApiKeyRecord, str]:
        """A new key and the key itself, which is never shown again."""
        now = self.clock()
        expires = expiry(ask.expires)
        if expires is not None and expires <= now:
            raise Refusal(400, "bad_request", "expires: that date has passed", "expires")
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
        )
        detail = f"{record.name}; models {', '.join(ask.models) or 'all'}"
        if ask.priority:
            detail += f"; priority {ask.priority}"
        await self.store.add_api_key(record, Audit(by.name, "key.create", record.id, detail))
        self.keys.changed(record)
        return record, key

    async def revoke(self, key_id: str, by: Principal) -> ApiKeyRecord:
        """Revoked at once; a key revoked before stays as it was."""
        record = self.find(key_id)
        now = self.clock()
        audit = Audit(by.name, "key.revoke", record.id, record.name)
        if await self.store.revoke_api_key(record.id, now, audit):
            record = replace(record, revoked_at=now)
            self.keys.changed(record)
        return record

    async def update(self, key_id: str, ask: UpdateKey, by: Principal) -> ApiKeyRecord:
        """A key's priority: its place in the gateway's queue."""
        record = self.find(key_id)
        audit = Audit(by.name, "key.update", record.id, f"priority {ask.priority}")
        if not await self.store.set_api_key_priority(record.id, ask.priority, audit):
            raise Refusal(404, "not_found", NO_SUCH_KEY)
        record = replace(record, priority=ask.priority)
        self.keys.changed(record)
        return record

    async def usage(self, ask: UsageQuery) -> list[dict[str, Any]]:
        """Requests and tokens per day, key, model and replica: ``days`` back, today
        included, or from ``since`` to ``until`` (both included); ``since`` alone runs to
        today, ``until`` alone is the ``days`` up to it."""
        until = day(ask.until, "until")
        since = day(ask.since, "since")
        if since is None:  # `days` back from `until`, or from today
            last = dt.date.fromisoformat(until) if until else self._today()
            since = (last - dt.timedelta(days=ask.days - 1)).isoformat()
        if until is not None and since > until:
            raise Refusal(400, "bad_request", f"since: {since} is after until ({until})", "since")
        try:
            await self.flush()
        except StoreUnavailable:
            pass  # what could not be written stays pending; the store's rows are shown
        names = {r.id: r.name for r in self.keys.records()}
        rows = [r for r in await self.store.usage(since) if until is None or r["day"] <= until]
        for row in rows:
            row["key_name"] = names.get(row["key_id"])
        return rows

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
