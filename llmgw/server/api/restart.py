"""``/api/v1/restart``: ``llmgw restart``, the cluster's processes started again in place
(``server/restart.py``): asked, answered at once with the plan; its progress read."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.restart import ClusterRestart
from llmgw.wire.admin import RestartJson

DOC = {
    "type": "object",
    "required": ["stage", "asked_at", "by", "this", "agents", "control_planes", "error"],
}


def routes(restarts: ClusterRestart) -> Ops:
    async def status(call: Call[None, None]) -> RestartJson:
        return restarts.status()

    async def start(call: Call[None, None]) -> RestartJson:
        return await restarts.start(call.principal)

    return [
        Op(
            "GET",
            "/api/v1/restart",
            status,
            "How far `llmgw restart` got: each agent, each control plane, this one last",
            answer=DOC,
        ),
        Op(
            "POST",
            "/api/v1/restart",
            start,
            "Start every agent, then the other control planes, then this one again in "
            "place; engines keep serving (answers at once with the plan)",
            answer=DOC,
            access="admin",
            errors=(409,),
        ),
    ]
