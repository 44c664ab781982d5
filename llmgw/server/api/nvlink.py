"""``/api/v1/nvlink``: the multi-node NVLink domains (GB200 NVL72 racks and the like) as
racks of trays, whether each tray's cards joined and IMEX runs, and their problems."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.fleet.nvlink import domains
from llmgw.server.fleet.registry import NodeRegistry

DOC = {"type": "object", "required": ["domains", "unjoined"]}


def routes(registry: NodeRegistry) -> Ops:
    async def get(call: Call[None, None]) -> object:
        return domains(registry.nodes.values())

    return [
        Op(
            "GET",
            "/api/v1/nvlink",
            get,
            "The multi-node NVLink domains (cards with the same ClusterUUID and CliqueId), "
            "each node a tray, with IMEX and their problems, and the cards that have not "
            "joined one",
            answer=DOC,
        )
    ]
