"""How each node is wired to the others, as placement of a replica spanning nodes reads it:
the NVLink domain its cards are in, the InfiniBand fabric its ports are on, and the leaf
switches its adapters are cabled to.

Read from what the fleet already knows (``nvlink.domains``, ``FabricWatch.fabrics`` and
the maps ``FabricMaps`` keeps); nothing here asks a node anything. A node whose cards
sit in two domains, or whose ports see two fabrics, is in neither; nor is a tray with
a card outside the domain or IMEX down: placement never counts on a wire that would
not carry the replica.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.server.fleet import nvlink
from llmgw.server.fleet.fabrics import FabricsJson
from llmgw.server.fleet.ibtopology import Topology, hosts
from llmgw.server.fleet.nodeview import NodeView


@dataclass(frozen=True)
class Wiring:
    # "CLUSTERUUID/CLIQUE" of the NVLink domain every card of the node is in.
    nvlink_domain: str | None = None
    # The InfiniBand fabric (its lowest SM GUID) every IB port of the node is on.
    fabric: str | None = None
    # The leaf switches (GUIDs) the node's adapters are cabled to, from the fabric's
    # map; empty while no map was read. Nodes with the same leaves need no spine.
    leaves: tuple[str, ...] = ()


def wiring(
    views: Iterable[NodeView],
    fabrics: FabricsJson,
    maps: Mapping[str, Topology],
) -> dict[str, Wiring]:
    """Node id -> its wiring, for every node that has any; ``fabrics`` is what
    ``FabricWatch.fabrics`` answered, ``maps`` each fabric's topology by fabric id."""
    views = list(views)
    domain_of: dict[str, set[str]] = {}
    for nvl in nvlink.domains(views)["domains"]:
        for tray in nvl["trays"]:
            # NCCL refuses the domain (no fallback) when a card has not joined or IMEX
            # is down; such a tray is placed as if it had no NVLink to the others.
            usable = tray["imex"]["running"] is not False and all(
                c["joined"] for c in tray["cards"]
            )
            if usable:
                domain_of.setdefault(tray["node"], set()).add(nvl["id"])
    fabric_of: dict[str, set[str]] = {}
    for seen in fabrics["fabrics"]:
        for node in seen["nodes"]:
            fabric_of.setdefault(node, set()).add(seen["id"])
    leaves_of: dict[tuple[str, str], tuple[str, ...]] = {}
    for fid, topology in maps.items():
        for host, ends in hosts(topology).items():
            leaves_of[(fid, host)] = tuple(sorted({leaf for leaf, _ in ends}))
    out: dict[str, Wiring] = {}
    for view in views:
        domains = domain_of.get(view.id, set())
        found = fabric_of.get(view.id, set())
        domain = next(iter(domains)) if len(domains) == 1 else None
        fabric = next(iter(found)) if len(found) == 1 else None
        leaves: tuple[str, ...] = ()
        if fabric is not None:
            name = view.facts.hostname if view.facts else ""
            leaves = leaves_of.get((fabric, view.id)) or leaves_of.get((fabric, name)) or ()
        if domain or fabric:
            out[view.id] = Wiring(domain, fabric, leaves)
    return out
