"""``/api/v1/fabrics``: the InfiniBand fabrics the nodes' ports see, their subnet
managers and problems (with what each fabric's map says: degraded cables, rails), and
the RoCE networks; ``/api/v1/fabrics/{id}/topology``: a fabric's map."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.requests import FabricTest

DOC = {"type": "object", "required": ["fabrics", "roce_networks", "unassigned_ports"]}
TOPOLOGY = {
    "type": "object",
    "required": ["fabric", "read_at", "read_by", "nodes", "tiers", "links", "problems"],
}


def routes(fabrics: FabricService) -> Ops:
    async def get(call: Call[None, None]) -> object:
        return fabrics.listing()

    async def topology(call: Call[None, None]) -> object:
        return fabrics.topology(call.params["fabric_id"])

    async def test(call: Call[FabricTest, None]) -> object:
        return await fabrics.test(call.body)

    return [
        Op(
            "POST",
            "/api/v1/fabric-tests",
            test,
            "ib_write_bw between two nodes, adapter by adapter, each rail graded against "
            "its link rate",
            body=FabricTest,
            answer={"type": "object", "required": ["a", "b", "rails"]},
            errors=(409,),
        ),
        Op(
            "GET",
            "/api/v1/fabrics",
            get,
            "The InfiniBand fabrics (by the master SM their ports see), their problems, "
            "and the RoCE networks",
            answer=DOC,
        ),
        Op(
            "GET",
            "/api/v1/fabrics/{fabric_id}/topology",
            topology,
            "A fabric's wiring (ibnetdiscover on one of its nodes every 5 minutes): switch "
            "tiers, links with their rates, degraded cables, rails",
            answer=TOPOLOGY,
            errors=(404,),
        ),
    ]
