"""The fabric pages: the InfiniBand fabrics (with each one's map drawn as tiers of
switches) and the RoCE networks, and the multi-node NVLink domains as racks of trays.

Both read in-process what the admin API shows: ``FabricService.listing`` (the fabrics the
ports see, joined with their maps' problems and SM records) with ``FabricMaps.topology``,
and ``fleet.nvlink.domains``. They change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypedDict

from starlette.responses import Response

from llmgw.server.fleet.fabricmap import FabricMaps, TopologyJson
from llmgw.server.fleet.fabrics import PortJson
from llmgw.server.fleet.fabricservice import FabricService, ListedFabricJson
from llmgw.server.fleet.nvlink import CardJson, domains
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.pages.frame import Frame, Page, PageCall, ago
from llmgw.wire.fabricwords import end_name, natural, switch_name
from llmgw.wire.warnings import split_fix

TIERS = ("core", "spine", "leaf")


def _fixes(problems: Sequence[str]) -> list[tuple[str, str | None]]:
    return [split_fix(p) for p in problems]


def _rate(value: float | None) -> str | None:
    return None if value is None else f"{float(value):g}"


class HostCable(TypedDict):
    """A host adapter cabled to a leaf."""

    host: str
    adapter: str
    port: int
    # Why the cable is degraded ("4x port running at 2x"); None when it is not.
    degraded: str | None
    off_rail: bool
    # CSS classes: "degraded", "offrail".
    look: str


class DrawnSwitch(TypedDict):
    name: str
    guid: str
    uplinks: int
    # The reasons of its degraded cables to other switches.
    degraded: list[str]
    hosts: list[HostCable]


class TierRow(TypedDict):
    # None: switches with no tier (no path to a leaf).
    tier: str | None
    switches: list[DrawnSwitch]


class DegradedCable(TypedDict):
    a: str
    b: str
    width: str
    speed: str
    rate: str | None
    reason: str


class ShownRailMiss(TypedDict):
    host: str
    adapter: str
    leaf: str
    leaf_port: int
    leaf_rail: str
    expected: list[str]


class MapView(TypedDict):
    """A fabric's map as its page draws it."""

    read_by: str
    read_at: float
    age: str
    error: str | None
    rows: list[TierRow]
    switches: int
    adapters: int
    hosts: int
    cables: int
    degraded: list[DegradedCable]
    rail_misses: list[ShownRailMiss]


def topology_view(topology: TopologyJson) -> MapView:
    """A map (``FabricMaps.topology``) as the page draws it: a row per tier of switches
    (each with its cables to other switches, degraded ones counted), each leaf with the
    host adapters cabled to it (a degraded cable with its reason, an adapter off its
    rail marked), then the degraded cables and the rail misses listed."""
    nodes = {str(n["guid"]): n for n in topology["nodes"]}
    tiers: dict[str, str] = dict(topology["tiers"])
    links = topology["links"]
    misses = topology["rail_misses"]
    off_rail = {
        (str(m["host"]), str(m["adapter"]).partition(" ")[0], str(m["leaf"])) for m in misses
    }
    uplinks: dict[str, list[str | None]] = {}
    hosts: dict[str, list[HostCable]] = {}
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
    rows: list[TierRow] = []
    for tier in (*TIERS, None):
        drawn: list[DrawnSwitch] = []
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
    degraded: list[DegradedCable] = [
        {
            "a": end_name(nodes, link["a"]),
            "b": end_name(nodes, link["b"]),
            "width": link["width"],
            "speed": link["speed"],
            # ibtopology's 0.0: the width or speed was not known.
            "rate": _rate(link.get("rate_gbps") or None),
            "reason": link["degraded"],
        }
        for link in links
        if link.get("degraded")
    ]
    rail: list[ShownRailMiss] = [
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
    return {
        "read_by": topology["read_by"],
        "read_at": topology["read_at"],
        "age": ago(0.0, topology["age_seconds"]),
        "error": topology["error"],
        "rows": rows,
        "switches": len(switches),
        "adapters": len(cas),
        "hosts": len({n.get("host") for n in cas if n.get("host")}),
        "cables": len(links),
        "degraded": degraded,
        "rail_misses": rail,
    }


class FabricView(TypedDict):
    """One fabric as its page shows it."""

    id: str
    master_sm: str | None
    masters: list[str]
    # SMs known besides the masters (standbys).
    other_sms: list[str]
    records: list[dict[str, object]] | None
    nodes: list[str]
    ports: list[PortJson]
    # (state, ports), ACTIVE first; (rate in Gb/s, active ports), fastest first.
    states: list[tuple[str, int]]
    rates: list[tuple[str, int]]
    unrated: int
    problems: list[tuple[str, str | None]]
    map: MapView | None
    # Why there is no map, when there is none.
    no_map: str | None


def fabric_view(fabric: ListedFabricJson, maps: FabricMaps) -> FabricView:
    """One fabric of ``listing``: its SMs, ports by state and rate, problems with their
    fixes, and its map (or why there is none)."""
    masters = fabric["masters"]
    states = fabric["ports_by_state"]
    rates = fabric["active_rates_gbps"]
    fid = fabric["id"]
    topology = maps.topology(fid)
    return {
        "id": fid,
        "master_sm": fabric["master_sm"],
        "masters": masters,
        "other_sms": [g for g in fabric["subnet_managers"] if g not in masters],
        "records": fabric["subnet_manager_records"],
        "nodes": fabric["nodes"],
        "ports": fabric["ports"],
        # ACTIVE first: the figure looked for; the rest as the control plane sorted them.
        "states": sorted(states.items(), key=lambda kv: kv[0] != "ACTIVE"),
        "rates": sorted(rates.items(), key=lambda kv: -float(kv[0])),
        # Active ports whose rate was not read: counted apart, never as 0 Gb/s.
        "unrated": max(0, states.get("ACTIVE", 0) - sum(rates.values())),
        "problems": _fixes(fabric["problems"]),
        "map": topology_view(topology) if topology is not None else None,
        "no_map": None if topology is not None else maps.errors.get(fid),
    }


class RatedPort(PortJson):
    # The link rate as shown ("400"); None: not read.
    rate: str | None


def _rated(ports: Sequence[PortJson]) -> list[RatedPort]:
    return [{**p, "rate": _rate(p["rate_gbps"])} for p in ports]


class RoceView(TypedDict):
    network: str
    nodes: list[str]
    ports: list[RatedPort]


class FabricsView(TypedDict):
    fabrics: list[FabricView]
    roce: list[RoceView]
    unassigned: list[RatedPort]


def fabrics_view(fabrics: FabricService) -> FabricsView:
    found = fabrics.listing()
    maps = fabrics.maps
    return {
        "fabrics": [fabric_view(f, maps) for f in found["fabrics"]],
        "roce": [{**n, "ports": _rated(n["ports"])} for n in found["roce_networks"]],
        "unassigned": _rated(found["unassigned_ports"]),
    }


CardLook = Literal["joined", "unhealthy", "notjoined", "unknown"]


def card_state(card: CardJson) -> CardLook:
    """``joined``, ``unhealthy`` (joined, its fabric health not Healthy), ``notjoined``,
    or ``unknown`` (its fabric state not read: never drawn as joined, nor as not)."""
    if card["joined"] is True:
        health = card["health"]
        summary = health.get("summary") if health is not None else None
        return "joined" if summary in (None, "Healthy") else "unhealthy"
    if card["state"] is None or card["joined"] is None:
        return "unknown"
    return "notjoined"


class ShownCard(CardJson):
    look: CardLook
    # Its fabric health's summary ("Healthy", "Degraded"); None: not read.
    summary: str | None


class ShownUnjoined(ShownCard):
    node: str


def _card(card: CardJson) -> ShownCard:
    health = card["health"]
    return {
        **card,
        "look": card_state(card),
        "summary": health.get("summary") if health is not None else None,
    }


ImexLook = Literal["up", "down", "unknown"]


class ShownTray(TypedDict):
    node: str
    connected: bool
    cards: list[ShownCard]
    imex: ImexLook
    channels: int | None


class Rack(TypedDict):
    """A multi-node NVLink domain drawn as a rack: its trays, cards by whether they
    joined, trays by whether IMEX runs, and its problems with their fixes."""

    id: str
    cluster_uuid: str
    clique_id: int
    trays: list[ShownTray]
    cards: int
    joined: int
    not_joined: int
    unknown: int
    imex_up: int
    imex_down: int
    imex_unknown: int
    problems: list[tuple[str, str | None]]


class NvlinkView(TypedDict):
    racks: list[Rack]
    unjoined: list[ShownUnjoined]


def nvlink_view(registry: NodeRegistry) -> NvlinkView:
    found = domains(registry.nodes.values())
    racks: list[Rack] = []
    for domain in found["domains"]:
        trays: list[ShownTray] = []
        for tray in domain["trays"]:
            running = tray["imex"]["running"]
            trays.append(
                {
                    "node": tray["node"],
                    "connected": tray["connected"],
                    "cards": [_card(c) for c in tray["cards"]],
                    "imex": "up" if running is True else "down" if running is False else "unknown",
                    "channels": tray["imex"]["channels"],
                }
            )
        looks = [c["look"] for t in trays for c in t["cards"]]
        imex = [t["imex"] for t in trays]
        racks.append(
            {
                "id": domain["id"],
                "cluster_uuid": domain["cluster_uuid"],
                "clique_id": domain["clique_id"],
                "trays": trays,
                "cards": len(looks),
                "joined": looks.count("joined") + looks.count("unhealthy"),
                "not_joined": looks.count("notjoined"),
                "unknown": looks.count("unknown"),
                "imex_up": imex.count("up"),
                "imex_down": imex.count("down"),
                "imex_unknown": imex.count("unknown"),
                "problems": _fixes(domain["problems"]),
            }
        )
    unjoined: list[ShownUnjoined] = [{"node": c["node"], **_card(c)} for c in found["unjoined"]]
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
