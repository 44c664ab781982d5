"""``/api/v1/fabrics``: the InfiniBand fabrics the nodes' ports see, their subnet
managers and problems (with what each fabric's map says: degraded cables, rails), and
the RoCE networks; ``/api/v1/fabrics/{id}/topology``: a fabric's map."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmgw.server.api.routing import Call, Op
from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.fabrics import FabricWatch
from llmgw.server.fleet.fabrictest import FabricTestRefused, fabric_test
from llmgw.server.fleet.registry import NodeRegistry, NodeView
from llmgw.server.refusal import Refusal
from llmgw.server.requests import FabricTest

DOC = {"type": "object", "required": ["fabrics", "roce_networks", "unassigned_ports"]}
TOPOLOGY = {
    "type": "object",
    "required": ["fabric", "read_at", "read_by", "nodes", "tiers", "links", "problems"],
}


def listing(watch: FabricWatch, maps: FabricMaps, views: Iterable[NodeView]) -> dict[str, Any]:
    """The fabrics the ports see with what their maps add: the map's problems, when it
    was read, and every SM the fabric's SA knows. ``GET /api/v1/fabrics`` and the admin
    pages' Fabrics page both show this."""
    found = watch.fabrics(views)
    for fabric in found["fabrics"]:
        fid = str(fabric["id"])
        fabric["problems"] += maps.problems(fid)
        kept = maps.maps.get(fid)
        fabric["topology_read_at"] = kept[0] if kept else None
        # Every SM the fabric's SA knows (saquery SMIR), when one of its nodes asked.
        records = maps.managers.get(fid)
        fabric["subnet_manager_records"] = records
        if records:
            known = {str(r.get("guid")) for r in records if r.get("guid")}
            fabric["subnet_managers"] = sorted(set(fabric["subnet_managers"]) | known)
    return found


def routes(watch: FabricWatch, maps: FabricMaps, registry: NodeRegistry) -> list[Op]:
    async def get(call: Call) -> Any:
        return listing(watch, maps, registry.nodes.values())

    async def topology(call: Call) -> Any:
        fabric_id = call.params["fabric_id"]
        shown = maps.topology(fabric_id)
        if shown is None:
            why = maps.errors.get(fabric_id) or "no map of it has been read yet"
            raise Refusal(404, "not_found", f"fabric {fabric_id!r}: {why}")
        return shown

    async def test(call: Call) -> Any:
        ask: FabricTest = call.body
        try:
            return await fabric_test(registry, ask.a, ask.b, ask.seconds)
        except FabricTestRefused as exc:
            raise Refusal(409, "cannot_test", str(exc)) from None

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
