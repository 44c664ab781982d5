"""``GET /api/v1/plan``: the planner's figures for a source, per node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmgw.server.api.routing import Call, Op
from llmgw.server.catalog.inspector import Inspector, PlanError
from llmgw.server.catalog.plan import PlanNode, plan
from llmgw.server.refusal import Refusal
from llmgw.server.requests import PlanQuery


def routes(inspector: Inspector, fleet: Callable[[], list[PlanNode]]) -> list[Op]:
    async def get_plan(call: Call) -> Any:
        ask: PlanQuery = call.query
        try:
            inspection = await inspector.inspect(ask.source, allow_pickle=ask.allow_pickle)
            return plan(
                inspection,
                fleet(),
                context=ask.context,
                slots=1 if ask.slots is None else ask.slots,
                cards=ask.gpus,
                cpu_cores=ask.cpu_cores,
                engine=ask.engine,
            )
        except PlanError as exc:
            raise Refusal(400, "plan_refused", str(exc)) from None

    return [
        Op(
            "GET",
            "/api/v1/plan",
            get_plan,
            "Memory per replica and card, and where a source fits",
            query=PlanQuery,
        )
    ]
