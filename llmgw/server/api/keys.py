"""Gateway keys, usage, energy per token and the cluster's serving switch, as admin API
routes over ``KeyService`` and ``ServingSwitch`` (``gateway/keyservice.py``), which own
them. ``POST /api/v1/serving`` is ``llmgw stop`` and ``llmgw start``.
"""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.gateway.grants import limits_set_json
from llmgw.server.gateway.keyservice import KeyService, ServingSwitch, key_json
from llmgw.server.people.asks import SetKeyLimits
from llmgw.server.requests import CreateKey, Serving, UpdateKey, UsageQuery
from llmgw.wire.admin import EnergyJson, KeyJson, LimitsSetJson, NewKeyJson, ServingJson

KEY = {"type": "object", "required": ["id", "name", "state"]}


def routes(keys: KeyService, switch: ServingSwitch) -> Ops:
    async def create(call: Call[CreateKey, None]) -> NewKeyJson:
        record, key = await keys.create(call.body, call.principal)
        return {**key_json(record), "key": key}

    async def listing(call: Call[None, None]) -> list[KeyJson]:
        return [key_json(r) for r in keys.records(call.principal)]

    async def show(call: Call[None, None]) -> KeyJson:
        return key_json(keys.find(call.params["key_id"], call.principal))

    async def revoke(call: Call[None, None]) -> KeyJson:
        return key_json(await keys.revoke(call.params["key_id"], call.principal))

    async def update(call: Call[UpdateKey, None]) -> KeyJson:
        return key_json(await keys.update(call.params["key_id"], call.body, call.principal))

    async def limits(call: Call[SetKeyLimits, None]) -> LimitsSetJson:
        set_ = await keys.set_limits(call.params["key_id"], call.body, call.principal)
        return limits_set_json(set_, keys.directory.now)

    async def serving(call: Call[None, None]) -> ServingJson:
        return {"stopped": switch.stopped}

    async def switch_serving(call: Call[Serving, None]) -> ServingJson:
        return {"stopped": await switch.set(call.body.stopped, call.principal)}

    async def usage(call: Call[None, UsageQuery]) -> object:
        return await keys.usage(call.query, call.principal)

    async def energy(call: Call[None, None]) -> list[EnergyJson]:
        return keys.energy()

    switch_answer = {"type": "object", "required": ["stopped"]}
    return [
        Op(
            "GET",
            "/api/v1/usage",
            usage,
            "Requests and tokens per day, key, model and replica",
            query=UsageQuery,
            answer={"type": "array", "items": {"type": "object"}},
            errors=(404,),  # an organisation not there (or not the caller's)
            access="member",
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
            errors=(404,),  # its organisation or project not there (or not the caller's)
            access="member",
        ),
        Op(
            "GET",
            "/api/v1/keys",
            listing,
            "Every key, never the key itself",
            answer={"type": "array", "items": KEY},
            access="member",
        ),
        Op(
            "GET",
            "/api/v1/keys/{key_id}",
            show,
            "One key",
            answer=KEY,
            errors=(404,),
            access="member",
        ),
        Op(
            "POST",
            "/api/v1/keys/{key_id}",
            update,
            "Change a key's priority (its place in the gateway's queue)",
            body=UpdateKey,
            answer=KEY,
            errors=(404,),
            access="member",
        ),
        Op(
            "POST",
            "/api/v1/keys/{key_id}/limits",
            limits,
            "A key's own limits, MCP tools and guard policies (its levels' bind it too)",
            body=SetKeyLimits,
            errors=(403, 404),
            access="member",
        ),
        Op(
            "DELETE",
            "/api/v1/keys/{key_id}",
            revoke,
            "Revoke a key at once",
            answer=KEY,
            errors=(404,),
            access="member",
        ),
        Op("GET", "/api/v1/serving", serving, "Whether /v1 is stopped", answer=switch_answer),
        Op(
            "POST",
            "/api/v1/serving",
            switch_serving,
            "llmgw stop / llmgw start",
            body=Serving,
            answer=switch_answer,
        ),
    ]
