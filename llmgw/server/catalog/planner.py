"""The planner as a service: ``GET /api/v1/plan`` and the serve form's estimate.

``Planner`` reads a source (the hub, the control plane's disk, or a node that holds
it) and answers the planner's figures (``plan.py``): memory per replica and card, and
each node's verdict, judged on the capacities placement uses, so the planner and
placement never disagree about fit.
"""

from __future__ import annotations

from llmgw.server.catalog.inspector import Inspector, PlanError
from llmgw.server.catalog.plan import PlanJson, plan, plan_nodes
from llmgw.server.catalog.room import Room
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
from llmgw.server.requests import PlanQuery


class Planner:
    def __init__(self, inspector: Inspector, room: Room, registry: NodeRegistry) -> None:
        self.inspector = inspector
        self.room = room
        self.registry = registry

    async def plan(self, ask: PlanQuery) -> PlanJson:
        """The figures for ``ask.source`` on every node as it is now."""
        try:
            inspection = await self.inspector.inspect(ask.source, allow_pickle=ask.allow_pickle)
            fleet = plan_nodes(self.registry.nodes, self.room.fleet(at_rest=False))
            return plan(
                inspection,
                fleet,
                context=ask.context,
                slots=1 if ask.slots is None else ask.slots,
                cards=ask.gpus,
                cpu_cores=ask.cpu_cores,
                engine=ask.engine,
                nodes_per_replica=ask.nodes or 1,
            )
        except PlanError as exc:
            raise Refusal(400, "plan_refused", str(exc)) from None
