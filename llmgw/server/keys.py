"""Gateway keys and the cluster's serving switch, as admin API routes.

A key is shown once, when made; the store keeps its SHA-256 only. Its allowlist holds
model name patterns (``qwen*``); its limits are requests and tokens a minute and a
token budget a month. ``POST /api/v1/serving`` is ``llmgw stop`` and ``llmgw start``.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmgw.server.gateway import STOPPED_SETTING, key_hash, new_key
from llmgw.server.responses import error, json_body, unauthorised
from llmgw.server.store import ApiKeyRecord, Audit

if TYPE_CHECKING:
    from llmgw.server.controlplane import ControlPlane


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
        "expires_at": record.expires_at,
        "created_at": record.created_at,
        "revoked_at": record.revoked_at,
    }


def _limit(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of 1 or more")
    return value


def _expiry(value: Any) -> float | None:
    """Seconds since the epoch, or an ISO date (midnight UTC) or date and time."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.UTC)
            return when.timestamp()
    raise ValueError(f"expires: {value!r} is not a date (like 2027-01-31)")


def routes(cp: ControlPlane) -> list[Route]:
    def actor(request: Request) -> str:
        return f"admin@{request.client.host if request.client else '?'}"

    async def create(request: Request) -> Response:
        if not cp.authorised(request):
            return unauthorised()
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            return error(400, "bad_request", "name: say whose key it is (--name)")
        models = body.get("models") or []
        if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
            return error(400, "bad_request", "models: a list of model name patterns")
        try:
            rpm, tpm, budget = (_limit(body, n) for n in ("rpm", "tpm", "budget"))
            expires = _expiry(body.get("expires"))
        except ValueError as exc:
            return error(400, "bad_request", str(exc))
        if expires is not None and expires <= time.time():
            return error(400, "bad_request", "expires: that date has passed")
        key = new_key()
        record = ApiKeyRecord(
            id=secrets.token_hex(6),
            name=name.strip(),
            key_hash=key_hash(key),
            models=tuple(models),
            rpm=rpm,
            tpm=tpm,
            budget=budget,
            expires_at=expires,
            created_at=time.time(),
        )
        detail = f"{record.name}; models {', '.join(models) or 'all'}"
        await cp.store.add_api_key(record, Audit(actor(request), "key.create", record.id, detail))
        cp.gateway.key_changed(record)
        return JSONResponse({**key_json(record), "key": key}, status_code=201)

    async def listing(request: Request) -> Response:
        if not cp.authorised(request):
            return unauthorised()
        return JSONResponse([key_json(k.record) for k in cp.gateway.keys.values()])

    def find(key_id: str) -> ApiKeyRecord | None:
        return next((k.record for k in cp.gateway.keys.values() if k.record.id == key_id), None)

    async def show(request: Request) -> Response:
        if not cp.authorised(request):
            return unauthorised()
        record = find(request.path_params["key_id"])
        if record is None:
            return error(404, "not_found", "no such key; see `llmgw ctl keys list`")
        return JSONResponse(key_json(record))

    async def revoke(request: Request) -> Response:
        if not cp.authorised(request):
            return unauthorised()
        record = find(request.path_params["key_id"])
        if record is None:
            return error(404, "not_found", "no such key; see `llmgw ctl keys list`")
        now = time.time()
        audit = Audit(actor(request), "key.revoke", record.id, record.name)
        if await cp.store.revoke_api_key(record.id, now, audit):
            record = replace(record, revoked_at=now)
            cp.gateway.key_changed(record)
        return JSONResponse(key_json(record))

    async def serving(request: Request) -> Response:
        if not cp.authorised(request):
            return unauthorised()
        if request.method == "GET":
            return JSONResponse({"stopped": cp.gateway.stopped})
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        stopped = body.get("stopped")
        if not isinstance(stopped, bool):
            return error(400, "bad_request", "stopped: true (llmgw stop) or false (llmgw start)")
        await cp.store.put_setting(STOPPED_SETTING, "true" if stopped else "false")
        await cp.store.audit(actor(request), "serving.stop" if stopped else "serving.start", "/v1")
        cp.set_stopped(stopped)
        return JSONResponse({"stopped": stopped})

    async def usage(request: Request) -> Response:
        """Requests and tokens per day, key, model and replica, this many days back."""
        if not cp.authorised(request):
            return unauthorised()
        try:
            days = int(request.query_params.get("days", "30"))
        except ValueError:
            return error(400, "bad_request", "days must be a whole number")
        await cp.gateway.flush()
        since = time.strftime("%Y-%m-%d", time.gmtime(time.time() - max(0, days - 1) * 86400))
        names = {k.record.id: k.record.name for k in cp.gateway.keys.values()}
        rows = await cp.store.usage(since)
        for row in rows:
            row["key_name"] = names.get(row["key_id"])
        return JSONResponse(rows)

    return [
        Route("/api/v1/usage", usage),
        Route("/api/v1/keys", create, methods=["POST"]),
        Route("/api/v1/keys", listing),
        Route("/api/v1/keys/{key_id}", show),
        Route("/api/v1/keys/{key_id}", revoke, methods=["DELETE"]),
        Route("/api/v1/serving", serving, methods=["GET", "POST"]),
    ]
