"""Gateway keys, usage and the cluster's serving switch, as admin API routes.

A key is shown once, when made; the store keeps its SHA-256 only. Its allowlist holds
model name patterns (``qwen*``); its limits are requests and tokens a minute and a
token budget a month; its priority orders the gateway's queue (higher first) and is the
one thing that may change after it is made (``POST /api/v1/keys/{key_id}``).
``POST /api/v1/serving`` is ``llmgw stop`` and ``llmgw start``.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from llmgw.server.api.routing import Call, Op
from llmgw.server.gateway import STOPPED_SETTING, Gateway, key_hash, new_key
from llmgw.server.refusal import Refusal
from llmgw.server.requests import CreateKey, Serving, UpdateKey, UsageQuery
from llmgw.server.store import ApiKeyRecord, Audit, Store, StoreUnavailable

KEY = {"type": "object", "required": ["id", "name", "state"]}


def key_json(record: ApiKeyRecord, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
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


def _today() -> dt.date:
    return dt.datetime.fromtimestamp(time.time(), dt.UTC).date()


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


def routes(
    gateway: Gateway,
    store: Store,
    set_stopped: Callable[[bool], None],
    joules_of: Callable[[str], float] = lambda replica: 0.0,
) -> list[Op]:
    """Keys, usage, energy per token and the serving switch; ``joules_of`` gives a
    replica's card energy so far."""
    keys = gateway.keys

    async def create(call: Call) -> Any:
        ask: CreateKey = call.body
        expires = expiry(ask.expires)
        if expires is not None and expires <= time.time():
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
            created_at=time.time(),
            priority=ask.priority,
        )
        detail = f"{record.name}; models {', '.join(ask.models) or 'all'}"
        if ask.priority:
            detail += f"; priority {ask.priority}"
        await store.add_api_key(record, Audit(call.actor, "key.create", record.id, detail))
        keys.changed(record)
        return {**key_json(record), "key": key}

    async def listing(call: Call) -> Any:
        return [key_json(r) for r in keys.records()]

    def find(key_id: str) -> ApiKeyRecord:
        record = keys.find(key_id)
        if record is None:
            raise Refusal(404, "not_found", "no such key; see `llmgw ctl keys list`")
        return record

    async def show(call: Call) -> Any:
        return key_json(find(call.params["key_id"]))

    async def revoke(call: Call) -> Any:
        record = find(call.params["key_id"])
        now = time.time()
        audit = Audit(call.actor, "key.revoke", record.id, record.name)
        if await store.revoke_api_key(record.id, now, audit):
            record = replace(record, revoked_at=now)
            keys.changed(record)
        return key_json(record)

    async def update(call: Call) -> Any:
        ask: UpdateKey = call.body
        record = find(call.params["key_id"])
        audit = Audit(call.actor, "key.update", record.id, f"priority {ask.priority}")
        if not await store.set_api_key_priority(record.id, ask.priority, audit):
            raise Refusal(404, "not_found", "no such key; see `llmgw ctl keys list`")
        record = replace(record, priority=ask.priority)
        keys.changed(record)
        return key_json(record)

    async def serving(call: Call) -> Any:
        return {"stopped": gateway.stopped}

    async def switch(call: Call) -> Any:
        stopped = call.body.stopped
        await store.put_setting(STOPPED_SETTING, "true" if stopped else "false")
        await store.audit(call.actor, "serving.stop" if stopped else "serving.start", "/v1")
        set_stopped(stopped)
        return {"stopped": stopped}

    async def usage(call: Call) -> Any:
        """Requests and tokens per day, key, model and replica: ``days`` back, today
        included, or from ``since`` to ``until`` (both included); ``since`` alone runs to
        today, ``until`` alone is the ``days`` up to it."""
        ask: UsageQuery = call.query
        until = day(ask.until, "until")
        since = day(ask.since, "since")
        if since is None:  # `days` back from `until`, or from today
            last = dt.date.fromisoformat(until) if until else _today()
            since = (last - dt.timedelta(days=ask.days - 1)).isoformat()
        if until is not None and since > until:
            raise Refusal(400, "bad_request", f"since: {since} is after until ({until})", "since")
        try:
            await gateway.flush()
        except StoreUnavailable:
            pass  # what could not be written stays pending; the store's rows are shown
        names = {r.id: r.name for r in keys.records()}
        rows = [r for r in await store.usage(since) if until is None or r["day"] <= until]
        for row in rows:
            row["key_name"] = names.get(row["key_id"])
        return rows

    async def energy(call: Call) -> Any:
        """Each replica's card energy and answered tokens since this control plane started."""
        return [
            {
                "model": model,
                "replica": replica,
                "joules": round(joules_of(replica), 3),
                "tokens": tokens,
                "joules_per_token": round(joules_of(replica) / tokens, 6),
            }
            for (model, replica), tokens in sorted(gateway.metrics.replica_tokens.items())
            if tokens > 0 and joules_of(replica) > 0
        ]

    switch_answer = {"type": "object", "required": ["stopped"]}
    return [
        Op(
            "GET",
            "/api/v1/usage",
            usage,
            "Requests and tokens per day, key, model and replica",
            query=UsageQuery,
            answer={"type": "array", "items": {"type": "object"}},
        ),
        Op(
            "GET",
            "/api/v1/energy",
            energy,
            "Each replica's card energy over the tokens it answered (where power is read)",
            answer={"type": "array", "items": {"type": "object"}},
        ),
        Op(
            "POST",
            "/api/v1/keys",
            create,
            "Create a gateway key (shown once)",
            body=CreateKey,
            status=201,
            answer=KEY,
        ),
        Op(
            "GET",
            "/api/v1/keys",
            listing,
            "Every key, never the key itself",
            answer={"type": "array", "items": KEY},
        ),
        Op("GET", "/api/v1/keys/{key_id}", show, "One key", answer=KEY, errors=(404,)),
        Op(
            "POST",
            "/api/v1/keys/{key_id}",
            update,
            "Change a key's priority (its place in the gateway's queue)",
            body=UpdateKey,
            answer=KEY,
            errors=(404,),
        ),
        Op(
            "DELETE",
            "/api/v1/keys/{key_id}",
            revoke,
            "Revoke a key at once",
            answer=KEY,
            errors=(404,),
        ),
        Op("GET", "/api/v1/serving", serving, "Whether /v1 is stopped", answer=switch_answer),
        Op(
            "POST",
            "/api/v1/serving",
            switch,
            "llmgw stop / llmgw start",
            body=Serving,
            answer=switch_answer,
        ),
    ]
