"""How each InfiniBand fabric is wired: every ``EVERY`` seconds the leading control plane
asks one node per fabric (the first, by id, whose agent has ``ibnetdiscover``: the
``ibnetdiscover`` feature in its Register) to run it over the port it has in that fabric,
and keeps the parsed topology (``ibtopology``): switch tiers, which adapter is which
node's, rails, cables trained below their kind, the problems they make.

A node that does not answer leaves the last map in place, said with its age; the next
pass asks again (another node, when that one is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, TypedDict

from llmgw.server.fleet.fabrics import FabricJson, FabricWatch
from llmgw.server.fleet.ibtopology import Tier, Topology, parse_ibnetdiscover, rails
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.fleet.wiring import Wiring, wiring

log = logging.getLogger("llmgw.fabrics")

EVERY = 300.0
TICK = 10.0  # how soon a fabric seen for the first time is mapped
ASK_TIMEOUT = 150.0
FEATURE = "ibnetdiscover"


class TopologyJson(TypedDict):
    """``GET /api/v1/fabrics/{id}/topology``: a fabric's map as ``ibtopology`` parsed
    it (its nodes, links and rail misses field by field), and when and by whom it was
    read."""

    fabric: str
    read_at: float
    age_seconds: float
    read_by: str
    nodes: list[dict[str, Any]]
    tiers: dict[str, Tier]
    links: list[dict[str, Any]]
    rail_misses: list[dict[str, Any]]
    problems: list[str]
    error: str | None


class FabricMaps:
    def __init__(
        self,
        registry: NodeRegistry,
        watch: FabricWatch,
        every: float = EVERY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.watch = watch
        self.every = every
        self.clock = clock
        # fabric id -> (when, which node read it, the topology)
        self.maps: dict[str, tuple[float, str, Topology]] = {}
        self.errors: dict[str, str] = {}
        # fabric id -> every SM its SA knows (``saquery SMIR``), when the node could ask:
        # the agent's records as it sent them ("guid", "lid", "priority", "state", ...).
        self.managers: dict[str, list[dict[str, object]]] = {}
        self._tried: dict[str, float] = {}
        self.tick = min(TICK, every)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.poll()
            except Exception:
                log.exception("reading the fabrics' wiring failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.tick)

    async def poll(self) -> None:
        """One pass: each fabric's map read again by one of its nodes, when due (every
        ``every`` seconds; at once for a fabric not tried yet)."""
        found = self.watch.fabrics(self.registry.nodes.values())
        now = self.clock()
        for fabric in found["fabrics"]:
            fid = fabric["id"]
            if fid in self._tried and now - self._tried[fid] < self.every:
                continue
            self._tried[fid] = now
            asker = self._asker(fabric)
            if asker is None:
                self.errors[fid] = "no node of this fabric has ibnetdiscover (infiniband-diags)"
                continue
            view, device, port = asker
            try:
                answer = await self._ask(view, device, port)
            except (ConnectionError, TimeoutError, RuntimeError) as exc:
                self.errors[fid] = f"{view.id} could not read the fabric: {exc}"
                continue
            topology = parse_ibnetdiscover(str(answer.get("text") or ""))
            smir = answer.get("smir")
            if isinstance(smir, list):
                self.managers[fid] = [m for m in smir if isinstance(m, dict)]
            self.maps[fid] = (self.clock(), view.id, topology)
            self.errors.pop(fid, None)

    def _asker(self, fabric: FabricJson) -> tuple[NodeView, str, int] | None:
        for port in fabric["ports"]:
            view = self.registry.nodes.get(port["node"])
            if view is None or view.session is None or FEATURE not in view.features:
                continue
            if port["state"] == "ACTIVE":
                return view, port["device"], port["port"]
        return None

    async def _ask(self, view: NodeView, device: str, port: int) -> dict[str, object]:
        assert view.session is not None
        args = {"device": device, "port": port}
        async for answer in view.session.ask("fabric.discover", args, timeout=ASK_TIMEOUT):
            if not answer.ok:
                raise RuntimeError(answer.error or "it said no")
            if isinstance(answer.result, dict):
                result: dict[str, object] = answer.result
                return result
        raise RuntimeError("no answer")

    def wiring(self, views: Mapping[str, NodeView]) -> dict[str, Wiring]:
        """How each node is wired, for placing a replica that spans nodes."""
        found = self.watch.fabrics(views.values())
        return wiring(views.values(), found, {f: kept[2] for f, kept in self.maps.items()})

    # --- for the API -------------------------------------------------------------------

    def problems(self, fabric_id: str) -> list[str]:
        """What the fabric's map says is wrong (degraded cables, rails), or why there is
        no map."""
        kept = self.maps.get(fabric_id)
        said = [self.errors[fabric_id]] if fabric_id in self.errors else []
        managers = self.managers.get(fabric_id)
        if managers is not None and not any(m.get("state") == "STANDBY" for m in managers):
            said.append(
                f"no standby subnet manager ({len(managers)} SM(s) known to the fabric, none "
                "STANDBY): if the master's host fails, nothing handles the fabric's changes. "
                "Fix: run a second opensm at a lower priority on another host"
            )
        return said + (list(kept[2].problems) if kept else [])

    def topology(self, fabric_id: str) -> TopologyJson | None:
        kept = self.maps.get(fabric_id)
        if kept is None:
            return None
        at, node, topology = kept
        misses = rails(topology)
        return {
            "fabric": fabric_id,
            "read_at": at,
            "age_seconds": round(self.clock() - at, 1),
            "read_by": node,
            "nodes": [asdict(n) for n in sorted(topology.nodes.values(), key=lambda n: n.guid)],
            "tiers": dict(sorted(topology.tiers.items())),
            "links": [asdict(link) for link in topology.links],
            "rail_misses": [asdict(m) for ms in misses.values() for m in ms],
            "problems": list(topology.problems),
            "error": self.errors.get(fabric_id),
        }
