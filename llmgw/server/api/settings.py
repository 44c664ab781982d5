"""``/api/v1/config``: the agents' settings the cluster decides (``ctl config``)."""

from __future__ import annotations

from typing import cast

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.fleet.agentsettings import AgentSettings, SettingsError
from llmgw.server.refusal import Refusal
from llmgw.server.requests import ConfigQuery, ConfigSet
from llmgw.wire.admin import NodeSettingsJson, SettingsJson, SettingValueJson

DOC = {"type": "object", "required": ["default", "nodes", "version"]}


def routes(settings: AgentSettings) -> Ops:
    def shown() -> SettingsJson:
        # AgentSettings writes the layers (fleet/agentsettings.py); the shape test holds
        # them to SettingsJson.
        return cast(SettingsJson, {**settings.document(), "version": settings.version})

    async def get(
        call: Call[None, ConfigQuery],
    ) -> SettingValueJson | NodeSettingsJson | SettingsJson:
        ask = call.query
        try:
            if ask.key is not None:
                return {"key": ask.key, "node": ask.node, "value": settings.get(ask.key, ask.node)}
        except SettingsError as exc:
            raise Refusal(400, "bad_request", str(exc), "key") from None
        if ask.node is not None:
            return {"node": ask.node, "settings": settings.for_node(ask.node)}
        return shown()

    async def put(call: Call[ConfigSet, None]) -> SettingsJson:
        await settings.ask(call.body, call.principal)
        return shown()

    async def history(call: Call[None, None]) -> object:
        return await settings.history()

    return [
        Op(
            "GET",
            "/api/v1/config",
            get,
            "The agents' settings: the default and each node's",
            query=ConfigQuery,
        ),
        Op(
            "POST",
            "/api/v1/config",
            put,
            "Set or unset one agent setting (checked, audited)",
            body=ConfigSet,
            answer=DOC,
            access="admin",
        ),
        Op(
            "GET",
            "/api/v1/config/history",
            history,
            "Every change of the agents' settings, newest first",
            answer={"type": "array", "items": {"type": "object"}},
        ),
    ]
