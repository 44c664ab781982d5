"""An InfiniBand fabric as ``ibnetdiscover`` prints it: switches, adapters, cables, tiers.

One node per fabric runs ``ibnetdiscover`` (every 5 minutes); this module turns its text
into a ``Topology``. It is pure: text in, frozen dataclasses out, no IO.

Two formats are read:

* the topology format (``parse_ibnetdiscover``): ``vendid=``/``devid=``/``sysimgguid=``
  lines, then a ``Switch 41 "S-<guid>" # "<desc>" base|enhanced port 0 lid N lmc 0`` or
  ``Ca 1 "H-<guid>" # "<desc>"`` header, then one line per linked port:
  ``[p] "H-<guid>"[q](<port guid>) # "<desc>" lid N 4xHDR`` in a switch block and
  ``[p](<port guid>) "S-<guid>"[q] # lid N lmc 0 "<desc>" lid M 4xHDR`` in a CA block.
  ibdiagnet's ``.ibnetdiscover`` file adds labels such as ``[1](1/1/1)``; ``-g`` adds
  ``[ext N]``; ``-f`` adds `` s=4 w=2 v=3``; all are tolerated. Each cable is listed from
  both ends and kept once. Node ids are node GUIDs (``0x`` and 16 hex digits);
* the ports list (``parse_ibnetdiscover_ports``, ``ibnetdiscover -p``): one line per
  port, ``SW  1719 10 0x<guid> 4x EDR - CA   134  1 0x<guid> ( 'desc' - 'desc' )``, or
  the port alone with its description when nothing is plugged in. Here a CA's id is its
  *port* GUID (the node GUID is not printed) and ``ports`` is the highest port seen.

Width and speed words are ibnetdiscover's: 1x 2x 4x 8x 12x (``??`` unknown) and SDR DDR
QDR FDR10 FDR EDR HDR NDR XDR (``???`` unknown: infiniband-diags before XDR support print
XDR links as ``???``). ``rate_gbps`` is lanes x nominal per-lane rate; 0.0 when unknown.

A cable is **degraded** when it trained below what its ends are seen to do elsewhere: the
capability of an end is the best width and speed on any *other* cable of that node or of
a node of the same model (``devid``; the ports list has none, so there only the node's
own other ports count). Width: below every known end ("4x port running at 2x"; a lane
fault, or a split port beside unsplit ones). Speed: below both ends, and only when both
are known, since a slower adapter on a faster switch is a choice, not a fault.

Tiers: a **leaf** is a switch with a CA attached (a CA inside a switch, such as a SHARP
Aggregation Node, does not count); a **spine** is a switch linked to a leaf; a **core**
is a switch further up (linked only to spines or cores). A switch with no links, or no
path to a leaf, gets no tier and a line in ``problems``.

Hosts: a CA whose description reads ``<host> mlx5_<n>`` or ``<host> HCA-<n>`` is adapter
``n`` of ``host``. **Rails**: in a rail-optimised fabric each leaf carries one adapter
number (mlx5_0 of every host on leaf A, mlx5_1 on leaf B, or leaf A of each scalable
unit). A leaf's rail is the adapter number a strict majority of its adapters share; an
adapter on a leaf whose rail is another number, while its own number is some leaf's
rail, is off its rail. Fabrics that are not rail-optimised have no majorities and give
no misses.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["switch", "ca", "router"]
Tier = Literal["leaf", "spine", "core"]
End = tuple[str, int]  # (node guid, port number)

LANE_GBPS: dict[str, float] = {
    "SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0,
    "EDR": 25.0, "HDR": 50.0, "NDR": 100.0, "XDR": 200.0,
}  # fmt: skip
# FDR10 and QDR share a nominal lane rate; FDR10's 64/66 encoding makes it the faster.
SPEED_RANK = {s: i for i, s in enumerate(("SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR",
                                          "NDR", "XDR"))}  # fmt: skip
WIDTH_LANES = {"1x": 1, "2x": 2, "4x": 4, "8x": 8, "12x": 12}
_KINDS: dict[str, Kind] = {"S": "switch", "H": "ca", "R": "router", "SW": "switch",
                           "CA": "ca", "RT": "router", "Switch": "switch", "Ca": "ca",
                           "Rt": "router"}  # fmt: skip


@dataclass(frozen=True)
class Node:
    guid: str
    kind: Kind
    description: str
    ports: int | None  # None: seen only as the far end of a cable
    lid: int | None  # a switch's port-0 LID; a CA's first port's LID
    host: str | None = None  # from "<host> mlx5_0" / "<host> HCA-1"
    adapter: str | None = None  # "mlx5_0", "HCA-1"
    devid: str | None = None
    system: str | None = None  # sysimgguid: one chassis, one value


@dataclass(frozen=True)
class Link:
    a: End  # the end whose block (or line) listed the cable first
    b: End
    width: str
    speed: str
    rate_gbps: float
    degraded: str | None = None


@dataclass(frozen=True)
class Topology:
    nodes: dict[str, Node]
    links: list[Link]
    tiers: dict[str, Tier]
    problems: list[str]


@dataclass(frozen=True)
class Adapter:
    host: str
    name: str  # "mlx5_0"
    number: int  # 0 for mlx5_0, 1 for HCA-1
    guid: str
    port: int
    leaf: str
    leaf_port: int


@dataclass(frozen=True)
class RailMiss:
    host: str
    adapter: str  # "mlx5_1", or "HCA-1 port 2" for the second port of a dual-port CA
    leaf: str  # where it is cabled
    leaf_port: int
    leaf_rail: str  # the adapter the other hosts have on that leaf
    expected: tuple[str, ...]  # the leaves that carry this adapter's rail


@dataclass
class _Draft:
    kind: Kind
    description: str = ""
    ports: int | None = None
    lid: int | None = None
    devid: str | None = None
    system: str | None = None


@dataclass
class _Fabric:
    """What a parser has read so far; ``topology()`` judges it."""

    nodes: dict[str, _Draft] = field(default_factory=dict)
    cables: dict[frozenset[End], tuple[End, End, str, str]] = field(default_factory=dict)
    peer: dict[End, End] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)

    def node(self, guid: str, kind: Kind, description: str, lid: int | None) -> _Draft:
        draft = self.nodes.get(guid)
        if draft is None:
            draft = self.nodes[guid] = _Draft(kind, description)
        if not draft.description:
            draft.description = description
        if draft.lid is None:
            draft.lid = lid
        return draft

    def cable(self, x: End, y: End, width: str, speed: str) -> None:
        key = frozenset((x, y))
        if key in self.cables:
            return  # the same cable, listed from its other end
        for end, other in ((x, y), (y, x)):
            seen = self.peer.get(end)
            if seen is not None and seen != other:
                self.problems.append(
                    f"{_at(end)} is listed cabled to both {_at(seen)} and {_at(other)}"
                )
                return
        self.peer[x], self.peer[y] = y, x
        self.cables[key] = (x, y, width, speed)

    def topology(self) -> Topology:
        nodes = {g: _freeze(g, d) for g, d in self.nodes.items()}
        links = _judge(nodes, list(self.cables.values()))
        tiers, tier_problems = _tiers(nodes, links)
        problems = list(self.problems)
        if self.unread:
            problems.append(
                f"{len(self.unread)} line(s) not understood, the first: {self.unread[0]}"
            )
        problems += tier_problems
        problems += [
            f"degraded cable {_named(nodes, link.a)} - {_named(nodes, link.b)}: "
            f"{link.width} {link.speed} ({link.rate_gbps:g} Gb/s), {link.degraded}"
            for link in links
            if link.degraded
        ]
        partial = Topology(nodes, links, tiers, [])
        for misses in rails(partial).values():
            problems += [
                f"rail: {m.host} {m.adapter} is on leaf {_named(nodes, (m.leaf, m.leaf_port))}"
                f", which carries the other hosts' {m.leaf_rail}; their {m.adapter} is on "
                + ", ".join(_named(nodes, (leaf, None)) for leaf in m.expected)
                for m in misses
            ]
        return Topology(nodes, links, tiers, problems)


_HEADER = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR])-([0-9a-fA-F]+)"\s*#\s*"(.*)"(.*)$')
_ID = re.compile(r"^(devid|sysimgguid)=(0x[0-9a-fA-F]+)")
_PORT = re.compile(
    r"^\[(\d+)\](?:\[ext \d+\]|\([^)]*\))*\s*"  # [1], [1](1/1/1), [1](port guid)
    r'"([SHR])-([0-9a-fA-F]+)"\[(\d+)\](?:\[ext \d+\])?\s*(?:\([0-9a-fA-F]+\))?'
    r"\s*#\s*(?:lid (\d+) lmc \d+ )?"  # a CA block's line gives its own port's LID
    r'"(.*)" lid (\d+) (\d+x|\?\?)([A-Z]+[0-9]*|\?\?\?)(?:\s.*)?$'
)
_SWITCH_LID = re.compile(r"port 0 lid (\d+)")


def parse_ibnetdiscover(text: str) -> Topology:
    """The topology format (plain ``ibnetdiscover``, ``-g``, ``-f``, or ibdiagnet's)."""
    fabric = _Fabric()
    ids: dict[str, str] = {}
    block: str | None = None  # the guid whose port lines follow
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if m := _ID.match(line):
            ids[m[1]] = _guid(m[2]) if m[1] == "sysimgguid" else m[2].lower()
            block = None
            continue
        if line.startswith(("vendid=", "switchguid=", "caguid=", "rtguid=", "Chassis ")) or (
            line == "Non-Chassis Nodes"
        ):
            block = None
            continue
        if m := _HEADER.match(line):
            block = _guid(m[4])
            lid = _SWITCH_LID.search(m[6])
            draft = fabric.node(block, _KINDS[m[1]], m[5], int(lid[1]) if lid else None)
            draft.description, draft.ports = m[5], int(m[2])
            draft.devid, draft.system = ids.get("devid"), ids.get("sysimgguid")
            ids = {}
            continue
        m = _PORT.match(line)
        if m is None or block is None:
            fabric.unread.append(f"line {number}: {raw[:80]!r}")
            continue
        local = fabric.nodes[block]
        if m[5] and local.lid is None:
            local.lid = int(m[5])
        far = _guid(m[3])
        fabric.node(far, _KINDS[m[2]], m[6], int(m[7]))
        fabric.cable((block, int(m[1])), (far, int(m[4])), m[8], m[9])
    return fabric.topology()


_PORTS_LINE = re.compile(
    r"^(SW|CA|RT|\?\?)\s+(\d+)\s+(\d+)\s+0x([0-9a-fA-F]+)\s+(\S+)\s+(\S+)\s*"
    r"(?:-\s+(SW|CA|RT|\?\?)\s+(\d+)\s+(\d+)\s+0x([0-9a-fA-F]+)\s+\(\s*'(.*)'\s+-\s+'(.*)'\s*\)"
    r"|'(.*)')$"
)


def parse_ibnetdiscover_ports(text: str) -> Topology:
    """The ports list, ``ibnetdiscover -p``."""
    fabric = _Fabric()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        m = _PORTS_LINE.match(line)
        if m is None or m[1] == "??" or m[7] == "??":
            fabric.unread.append(f"line {number}: {raw[:80]!r}")
            continue
        _ports_node(fabric, m[1], m[4], m[2], m[3], m[11] if m[7] else m[13])
        if m[7]:
            _ports_node(fabric, m[7], m[10], m[8], m[9], m[12])
            fabric.cable((_guid(m[4]), int(m[3])), (_guid(m[10]), int(m[9])), m[5], m[6])
    return fabric.topology()


def _ports_node(fabric: _Fabric, kind: str, guid: str, lid: str, port: str, desc: str) -> None:
    draft = fabric.node(_guid(guid), _KINDS[kind], desc, int(lid))
    draft.ports = max(draft.ports or 0, int(port))


def adapters(topology: Topology) -> list[Adapter]:
    """Every host adapter port cabled to a switch, by host, adapter number and port."""
    out: list[Adapter] = []
    for link in topology.links:
        for mine, theirs in ((link.a, link.b), (link.b, link.a)):
            ca, switch = topology.nodes[mine[0]], topology.nodes[theirs[0]]
            if ca.host is None or ca.adapter is None or switch.kind != "switch":
                continue
            number = int(ca.adapter.rpartition("_" if "_" in ca.adapter else "-")[2])
            out.append(Adapter(ca.host, ca.adapter, number, ca.guid, mine[1], *theirs))
    return sorted(out, key=lambda a: (a.host, a.number, a.port, a.guid))


def hosts(topology: Topology) -> dict[str, list[tuple[str, int]]]:
    """Host name -> (leaf switch guid, leaf port) of each of its adapters, in adapter
    order (mlx5_0, mlx5_1, ...; ``adapters`` says which CA each one is)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for a in adapters(topology):
        out.setdefault(a.host, []).append((a.leaf, a.leaf_port))
    return out


def rails(topology: Topology) -> dict[str, list[RailMiss]]:
    """Host -> its adapters cabled off their rail; hosts on their rails are absent."""
    every = adapters(topology)
    on_leaf: dict[str, Counter[tuple[int, int]]] = {}
    label: dict[tuple[int, int], str] = {}
    for a in every:
        key = (a.number, a.port)
        on_leaf.setdefault(a.leaf, Counter())[key] += 1
        label.setdefault(key, a.name if a.port == 1 else f"{a.name} port {a.port}")
    rail_of: dict[str, tuple[int, int]] = {}
    for leaf, counts in on_leaf.items():
        key, n = counts.most_common(1)[0]
        if n * 2 > counts.total() and counts.total() >= 2:
            rail_of[leaf] = key
    out: dict[str, list[RailMiss]] = {}
    for a in every:
        key, rail = (a.number, a.port), rail_of.get(a.leaf)
        expected = tuple(sorted(leaf for leaf, k in rail_of.items() if k == key))
        if rail is None or rail == key or not expected:
            continue
        miss = RailMiss(a.host, label[key], a.leaf, a.leaf_port, label[rail], expected)
        out.setdefault(a.host, []).append(miss)
    return out


def same_leaf(topology: Topology, host_a: str, host_b: str) -> bool:
    """Whether the two hosts have an adapter on a common leaf."""
    return hops(topology, host_a, host_b) == 0


def hops(topology: Topology, host_a: str, host_b: str) -> int | None:
    """Switch-to-switch cables between the nearest leaves of the two hosts: 0 on a shared
    leaf, 2 through a spine, 4 through a core; None when either is not in the fabric or
    no path joins them."""
    leaves = hosts(topology)
    start = {leaf for leaf, _ in leaves.get(host_a, [])}
    goal = {leaf for leaf, _ in leaves.get(host_b, [])}
    if not start or not goal:
        return None
    graph = _switch_graph(topology.nodes, topology.links)
    distance = dict.fromkeys(start, 0)
    queue = deque(start)
    while queue:
        here = queue.popleft()
        if here in goal:
            return distance[here]
        for there in graph.get(here, ()):
            if there not in distance:
                distance[there] = distance[here] + 1
                queue.append(there)
    return None


def rate_gbps(width: str, speed: str) -> float:
    """Nominal data rate of a link: lanes x per-lane rate; 0.0 when either is unknown."""
    return WIDTH_LANES.get(width, 0) * LANE_GBPS.get(speed, 0.0)


_ADAPTER = re.compile(r"^(\S+)\s+((?:[A-Za-z][A-Za-z0-9]*_|HCA-)\d+)$")


def _freeze(guid: str, d: _Draft) -> Node:
    m = _ADAPTER.match(d.description.strip()) if d.kind == "ca" else None
    host, adapter = (m[1], m[2]) if m else (None, None)
    return Node(guid, d.kind, d.description, d.ports, d.lid, host, adapter, d.devid, d.system)


def _guid(text: str) -> str:
    return f"0x{int(text, 16):016x}"


def _at(end: End) -> str:
    return f"{end[0]} port {end[1]}"


def _named(nodes: dict[str, Node], end: tuple[str, int | None]) -> str:
    node = nodes[end[0]]
    where = f"{node.guid} port {end[1]}" if end[1] is not None else node.guid
    return f"'{node.description}' {where}" if node.description else where


def _judge(nodes: dict[str, Node], cables: list[tuple[End, End, str, str]]) -> list[Link]:
    """Links with ``degraded`` set where a cable trained below what its ends do elsewhere."""

    def model(guid: str) -> tuple[str, str]:
        node = nodes[guid]
        return (node.kind, node.devid) if node.devid else ("node", guid)

    widths: dict[tuple[str, str], Counter[int]] = {}
    speeds: dict[tuple[str, str], Counter[int]] = {}
    for x, y, width, speed in cables:
        for guid in (x[0], y[0]):
            if width in WIDTH_LANES:
                widths.setdefault(model(guid), Counter())[WIDTH_LANES[width]] += 1
            if speed in SPEED_RANK:
                speeds.setdefault(model(guid), Counter())[SPEED_RANK[speed]] += 1

    def best(
        seen: dict[tuple[str, str], Counter[int]], guid: str, own: int, other: str
    ) -> int | None:
        # The best on any other cable of this model: this cable counts once per end of it.
        counts = seen.get(model(guid), Counter())
        mine = 2 if model(other) == model(guid) else 1
        return max((v for v, n in counts.items() if n - (mine if v == own else 0) > 0),
                   default=None)  # fmt: skip

    speed_name = {rank: name for name, rank in SPEED_RANK.items()}
    links: list[Link] = []
    for x, y, width, speed in cables:
        why: list[str] = []
        if width in WIDTH_LANES:
            lanes = WIDTH_LANES[width]
            caps = [c for c in (best(widths, x[0], lanes, y[0]), best(widths, y[0], lanes, x[0]))
                    if c is not None]  # fmt: skip
            if caps and min(caps) > lanes:
                why.append(f"{min(caps)}x port running at {width}")
        if speed in SPEED_RANK:
            rank = SPEED_RANK[speed]
            sa, sb = best(speeds, x[0], rank, y[0]), best(speeds, y[0], rank, x[0])
            if sa is not None and sb is not None and min(sa, sb) > rank:
                why.append(f"trained at {speed}, below the {speed_name[min(sa, sb)]} of both ends")
        degraded = "; ".join(why) or None
        links.append(Link(x, y, width, speed, rate_gbps(width, speed), degraded))
    return links


def _inside(ca: Node, switch: Node) -> bool:
    """A CA in the switch's own chassis (a SHARP Aggregation Node) is not a host."""
    return (ca.system is not None and ca.system == switch.system) or (
        "Aggregation Node" in ca.description
    )


def _switch_graph(nodes: dict[str, Node], links: Iterable[Link]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {g: set() for g, n in nodes.items() if n.kind == "switch"}
    for link in links:
        x, y = link.a[0], link.b[0]
        if x != y and x in graph and y in graph:
            graph[x].add(y)
            graph[y].add(x)
    return graph


def _tiers(nodes: dict[str, Node], links: list[Link]) -> tuple[dict[str, Tier], list[str]]:
    graph = _switch_graph(nodes, links)
    leaves: set[str] = set()
    for link in links:
        for s, c in ((link.a[0], link.b[0]), (link.b[0], link.a[0])):
            if s in graph and nodes[c].kind == "ca" and not _inside(nodes[c], nodes[s]):
                leaves.add(s)
    level = dict.fromkeys(leaves, 0)
    queue = deque(sorted(leaves))
    while queue:
        here = queue.popleft()
        for there in graph[here]:
            if there not in level:
                level[there] = level[here] + 1
                queue.append(there)
    names: tuple[Tier, Tier, Tier] = ("leaf", "spine", "core")
    tiers = {g: names[min(n, 2)] for g, n in sorted(level.items())}
    problems = [
        f"switch {_named(nodes, (g, None))} "
        + ("is linked to no leaf" if graph[g] else "has no links")
        for g in sorted(graph)
        if g not in level
    ]
    return tiers, problems
