"""The InfiniBand fabrics as a service: what the admin API and the pages show of them,
and the bandwidth test between two nodes.

``FabricService`` joins what the nodes' ports see (``FabricWatch``) with what each
fabric's map adds (``FabricMaps``: the map's problems, when it was read, every SM the
fabric's SA knows), answers a fabric's map, and runs ``ib_write_bw`` between two nodes
rail by rail (``fabrictest.py``).
"""

from __future__ import annotations

from typing import Any

from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.fabrics import FabricWatch
from llmgw.server.fleet.fabrictest import FabricTestRefused, fabric_test
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
from llmgw.server.requests import FabricTest


class FabricService:
    def __init__(self, watch: FabricWatch, maps: FabricMaps, registry: NodeRegistry) -> None:
        self.watch = watch
        self.maps = maps
        self.registry = registry

    def listing(self) -> dict[str, Any]:
        """The fabrics the ports see with what their maps add."""
        maps = self.maps
        found = self.watch.fabrics(self.registry.nodes.values())
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

    def topology(self, fabric_id: str) -> dict[str, Any]:
        shown = self.maps.topology(fabric_id)
        if shown is None:
            why = self.maps.errors.get(fabric_id) or "no map of it has been read yet"
            raise Refusal(404, "not_found", f"fabric {fabric_id!r}: {why}")
        return shown

    async def test(self, ask: FabricTest) -> dict[str, Any]:
        try:
            return await fabric_test(self.registry, ask.a, ask.b, ask.seconds)
        except FabricTestRefused as exc:
            raise Refusal(409, "cannot_test", str(exc)) from None
