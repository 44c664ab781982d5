"""The InfiniBand fabrics as a service: what the admin API and the pages show of them,
and the bandwidth test between two nodes.

``FabricService`` joins what the nodes' ports see (``FabricWatch``) with what each
fabric's map adds (``FabricMaps``: the map's problems, when it was read, every SM the
fabric's SA knows), answers a fabric's map, and runs ``ib_write_bw`` between two nodes
rail by rail (``fabrictest.py``).
"""

from __future__ import annotations

from typing import TypedDict

from llmgw.server.fleet.fabricmap import FabricMaps, TopologyJson
from llmgw.server.fleet.fabrics import FabricJson, FabricWatch, PortJson, RoceJson
from llmgw.server.fleet.fabrictest import FabricTestJson, FabricTestRefused, fabric_test
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
from llmgw.server.requests import FabricTest


class ListedFabricJson(FabricJson):
    """A fabric as the ports see it, with what its map adds."""

    # When its map was last read; None: never.
    topology_read_at: float | None
    # Every SM the fabric's SA knows (saquery SMIR), when one of its nodes asked.
    subnet_manager_records: list[dict[str, object]] | None


class ListingJson(TypedDict):
    """``GET /api/v1/fabrics``."""

    fabrics: list[ListedFabricJson]
    roce_networks: list[RoceJson]
    unassigned_ports: list[PortJson]


class FabricService:
    def __init__(self, watch: FabricWatch, maps: FabricMaps, registry: NodeRegistry) -> None:
        self.watch = watch
        self.maps = maps
        self.registry = registry

    def listing(self) -> ListingJson:
        """The fabrics the ports see with what their maps add."""
        maps = self.maps
        found = self.watch.fabrics(self.registry.nodes.values())
        listed: list[ListedFabricJson] = []
        for fabric in found["fabrics"]:
            fid = fabric["id"]
            kept = maps.maps.get(fid)
            records = maps.managers.get(fid)
            managers = fabric["subnet_managers"]
            if records:
                known = {str(r.get("guid")) for r in records if r.get("guid")}
                managers = sorted(set(managers) | known)
            listed.append(
                {
                    **fabric,
                    "subnet_managers": managers,
                    "problems": fabric["problems"] + maps.problems(fid),
                    "topology_read_at": kept[0] if kept else None,
                    "subnet_manager_records": records,
                }
            )
        return {
            "fabrics": listed,
            "roce_networks": found["roce_networks"],
            "unassigned_ports": found["unassigned_ports"],
        }

    def topology(self, fabric_id: str) -> TopologyJson:
        shown = self.maps.topology(fabric_id)
        if shown is None:
            why = self.maps.errors.get(fabric_id) or "no map of it has been read yet"
            raise Refusal(404, "not_found", f"fabric {fabric_id!r}: {why}")
        return shown

    async def test(self, ask: FabricTest) -> FabricTestJson:
        try:
            return await fabric_test(self.registry, ask.a, ask.b, ask.seconds)
        except FabricTestRefused as exc:
            raise Refusal(409, "cannot_test", str(exc)) from None
