"""``GET /api/v1/plan``: the planner's figures for a source, per node (``Planner``)."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.catalog.planner import Planner
from llmgw.server.requests import PlanQuery


def routes(planner: Planner) -> Ops:
    async def get_plan(call: Call[None, PlanQuery]) -> object:
        return await planner.plan(call.query)

    return [
        Op(
            "GET",
            "/api/v1/plan",
            get_plan,
            "Memory per replica and card, and where a source fits",
            query=PlanQuery,
        )
    ]
