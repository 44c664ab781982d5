"""``/api/v1/fabrics``: the InfiniBand fabrics the nodes' ports see, their subnet
managers and problems, and the RoCE networks."""

from __future__ import annotations

from typing import Any

from llmgw.server.api.routing import Call, Op
from llmgw.server.fleet.fabrics import FabricWatch
from llmgw.server.fleet.registry import NodeRegistry

DOC = {"type": "object", "required": ["fabrics", "roce_networks", "unassigned_ports"]}


def routes(watch: FabricWatch, registry: NodeRegistry) -> list[Op]:
    async def get(call: Call) -> Any:
        return watch.fabrics(registry.nodes.values())

    return [
        Op(
            "GET",
            "/api/v1/fabrics",
            get,
            "The InfiniBand fabrics (by the master SM their ports see), their problems, "
            "and the RoCE networks",
            answer=DOC,
        )
    ]
