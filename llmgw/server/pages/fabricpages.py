"""The fabric pages: the InfiniBand fabrics (with each one's map drawn as tiers of
switches) and the RoCE networks, and the multi-node NVLink domains as racks of trays.

Both read in-process what the admin API shows: ``FabricService.listing`` (the fabrics the
ports see, joined with their maps' problems and SM records) with ``FabricMaps.topology``,
and ``fleet.nvlink.domains``. They change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.responses import Response

from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.fleet.nvlink import domains
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.pages.frame import Frame, Page, PageCall, ago
from llmgw.wire.fabricwords import end_name, natural, switch_name
from llmgw.wire.warnings import split_fix

TIERS = ("core", "spine", "leaf")


def _fixes(problems: Sequence[Any]) -> list[tuple[str, str | None]]:
    return [split_fix(str(p)) for p in problems]


def _rate(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{float(value):g}"
    return None


def topology_view(topology: dict[str, Any]) -> dict[str, Any]:
    """A map (``FabricMaps.topology``) as the page draws it: a row per tier of switches
    (each with its cables to other switches, degraded ones counted), each leaf with the
    host adapters cabled to it (a degraded cable with its reason, an adapter off its
    rail marked), then the degraded cables and the rail misses listed."""
    nodes = {str(n["guid"]): n for n in topology.get("nodes") or []}
    tiers: dict[str, str] = topology.get("tiers") or {}
    links = topology.get("links") or []
    misses = topology.get("rail_misses") or []
    off_rail = {
        (str(m["host"]), str(m["adapter"]).partition(" ")[0], str(m["leaf"])) for m in misses
    }
    uplinks: dict[str, list[str | None]] = {}
    hosts: dict[str, list[dict[str, Any]]] = {}
    for link in links:
        a, b = str(link["a"][0]), str(link["b"][0])
        for mine, theirs, port in ((a, b, link["a"][1]), (b, a, link["b"][1])):
            if nodes.get(mine, {}).get("kind") != "switch" or theirs not in nodes:
                continue
            other = nodes[theirs]
            if other.get("kind") == "switch":
                uplinks.setdefault(mine, []).append(link.get("degraded"))
            elif other.get("kind") == "ca":
                host = str(other.get("host") or other.get("description") or other["guid"])
                adapter = str(other.get("adapter") or "")
                missed = (host, adapter, mine) in off_rail
                look = ["degraded"] if link.get("degraded") else []
                hosts.setdefault(mine, []).append(
                    {
                        "host": host,
                        "adapter": adapter,
                        "port": port,
                        "degraded": link.get("degraded"),
                        "off_rail": missed,
                        "look": " ".join(look + (["offrail"] if missed else [])),
                    }
                )
    switches = sorted(
        (n for n in nodes.values() if n.get("kind") == "switch"),
        key=lambda n: natural(switch_name(n)),
    )
    rows = []
    for tier in (*TIERS, None):
        drawn = []
        for s in switches:
            guid = str(s["guid"])
            if tiers.get(guid) != tier:
                continue
            ups = uplinks.get(guid, [])
            drawn.append(
                {
                    "name": switch_name(s),
                    "guid": guid,
                    "uplinks": len(ups),
                    "degraded": [d for d in ups if d],
                    "hosts": sorted(
                        hosts.get(guid, []), key=lambda h: (natural(h["host"]), h["adapter"])
                    ),
                }
            )
        if drawn:
            rows.append({"tier": tier, "switches": drawn})
    cas = [n for n in nodes.values() if n.get("kind") == "ca"]
    degraded = [
        {
            "a": end_name(nodes, link["a"]),
            "b": end_name(nodes, link["b"]),
            "width": link.get("width"),
            "speed": link.get("speed"),
            # ibtopology's 0.0: the width or speed was not known.
            "rate": _rate(link.get("rate_gbps") or None),
            "reason": link["degraded"],
        }
        for link in links
        if link.get("degraded")
    ]
    rail = [
        {
            "host": m["host"],
            "adapter": m["adapter"],
            "leaf": switch_name(nodes.get(str(m["leaf"]), {"guid": m["leaf"]})),
            "leaf_port": m["leaf_port"],
            "leaf_rail": m["leaf_rail"],
            "expected": [
                switch_name(nodes.get(str(g), {"guid": g})) for g in m.get("expected") or []
            ],
        }
        for m in misses
    ]
    age = topology.get("age_seconds")
    return {
        "read_by": topology.get("read_by"),
        "read_at": topology.get("read_at"),
        "age": ago(0.0, float(age)) if isinstance(age, int | float) else None,
        "error": topology.get("error"),
        "rows": rows,
        "switches": len(switches),
        "adapters": len(cas),
        "hosts": len({n.get("host") for n in cas if n.get("host")}),
        "cables": len(links),
        "degraded": degraded,
        "rail_misses": rail,
    }


def fabric_view(fabric: dict[str, Any], maps: FabricMaps) -> dict[str, Any]:
    """One fabric of ``listing``: its SMs, ports by state and rate, problems with their
    fixes, and its map (or why there is none)."""
    masters = [str(m) for m in fabric.get("masters") or []]
    states: dict[str, int] = fabric.get("ports_by_state") or {}
    rates: dict[str, int] = fabric.get("active_rates_gbps") or {}
    fid = str(fabric["id"])
    topology = maps.topology(fid)
    return {
        "id": fid,
        "master_sm": fabric.get("master_sm"),
        "masters": masters,
        "other_sms": [str(g) for g in fabric.get("subnet_managers") or [] if g not in masters],
        "records": fabric.get("subnet_manager_records"),
        "nodes": fabric.get("nodes") or [],
        "ports": fabric.get("ports") or [],
        # ACTIVE first: the figure looked for; the rest as the control plane sorted them.
        "states": sorted(states.items(), key=lambda kv: kv[0] != "ACTIVE"),
        "rates": sorted(rates.items(), key=lambda kv: -float(kv[0])),
        # Active ports whose rate was not read: counted apart, never as 0 Gb/s.
        "unrated": max(0, states.get("ACTIVE", 0) - sum(rates.values())),
        "problems": _fixes(fabric.get("problems") or []),
        "map": topology_view(topology) if topology is not None else None,
        "no_map": None if topology is not None else maps.errors.get(fid),
    }


def fabrics_view(fabrics: FabricService) -> dict[str, Any]:
    found = fabrics.listing()
    maps = fabrics.maps

    def rated(ports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**p, "rate": _rate(p.get("rate_gbps"))} for p in ports]

    return {
        "fabrics": [fabric_view(f, maps) for f in found["fabrics"]],
        "roce": [{**n, "ports": rated(n["ports"])} for n in found["roce_networks"]],
        "unassigned": rated(found["unassigned_ports"]),
    }


def card_state(card: dict[str, Any]) -> str:
    """``joined``, ``unhealthy`` (joined, its fabric health not Healthy), ``notjoined``,
    or ``unknown`` (its fabric state not read: never drawn as joined, nor as not)."""
    if card.get("joined") is True:
        health = card.get("health")
        summary = health.get("summary") if isinstance(health, dict) else None
        return "joined" if summary in (None, "Healthy") else "unhealthy"
    if card.get("state") is None or card.get("joined") is None:
        return "unknown"
    return "notjoined"


def _card(card: dict[str, Any]) -> dict[str, Any]:
    health = card.get("health")
    return {
        **card,
        "look": card_state(card),
        "summary": health.get("summary") if isinstance(health, dict) else None,
    }


def nvlink_view(registry: NodeRegistry) -> dict[str, Any]:
    found = domains(registry.nodes.values())
    racks = []
    for domain in found.get("domains") or []:
        trays = []
        for tray in domain.get("trays") or []:
            imex = tray.get("imex") or {}
            running = imex.get("running")
            channels = imex.get("channels")
            trays.append(
                {
                    "node": tray.get("node"),
                    "connected": tray.get("connected"),
                    "cards": [_card(c) for c in tray.get("cards") or []],
                    "imex": "up" if running is True else "down" if running is False else "unknown",
                    "channels": channels
                    if isinstance(channels, int) and not isinstance(channels, bool)
                    else None,
                }
            )
        cards = [c for t in trays for c in t["cards"]]
        looks = [c["look"] for c in cards]
        imex = [t["imex"] for t in trays]
        racks.append(
            {
                "id": domain.get("id"),
                "cluster_uuid": domain.get("cluster_uuid"),
                "clique_id": domain.get("clique_id"),
                "trays": trays,
                "cards": len(cards),
                "joined": looks.count("joined") + looks.count("unhealthy"),
                "not_joined": looks.count("notjoined"),
                "unknown": looks.count("unknown"),
                "imex_up": imex.count("up"),
                "imex_down": imex.count("down"),
                "imex_unknown": imex.count("unknown"),
                "problems": _fixes(domain.get("problems") or []),
            }
        )
    unjoined = [_card(c) for c in found.get("unjoined") or [] if isinstance(c, dict)]
    return {"racks": racks, "unjoined": unjoined}


def pages(frame: Frame, fabrics_of: FabricService, registry: NodeRegistry) -> list[Page]:
    async def fabrics(call: PageCall) -> Response:
        template = "fabrics_body.html" if call.htmx else "fabrics.html"
        context = fabrics_view(fabrics_of)
        return frame.render(call.request, template, call.session, **context)

    async def nvlink(call: PageCall) -> Response:
        template = "nvlink_body.html" if call.htmx else "nvlink.html"
        return frame.render(call.request, template, call.session, **nvlink_view(registry))

    return [
        Page("GET", "/admin/fabrics", fabrics),
        Page("GET", "/admin/nvlink", nvlink),
    ]
