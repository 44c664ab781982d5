"""Fabrics: the InfiniBand fabrics the nodes' ports see (``GET /api/v1/fabrics``), one row
each; under the table the highlighted fabric's subnet managers, ports by state and rate,
its problems each with its fix, and its map (``GET /api/v1/fabrics/{id}/topology``,
fetched when the fabric is highlighted and again when the control plane reads a newer
one) drawn as tiers: core and spine switches in rows, each leaf a column of the host
adapters cabled to it, degraded cables in red with their reason, adapters off their
rail in yellow. The RoCE networks and the ports of no fabric are listed last.

The pane reads both routes itself, only while it is shown: the other screens' snapshot
does not wait on them."""

from __future__ import annotations

import time
import urllib.error
from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.events import Resize, Show
from textual.widgets import DataTable, Static

from llmgw.client import routes
from llmgw.client.adminbase import AdminError
from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, append_problem, fill, highlighted
from llmgw.wire.admin import FabricJson, FabricMapJson, FabricsJson, MapNodeJson
from llmgw.wire.fabricwords import end_name, natural, switch_name

COLUMNS = ("FABRIC", "MASTER SM", "SMs", "NODES", "PORTS", "PROBLEMS", "MAP")
TIERS = ("core", "spine", "leaf")
DEGRADED = "red"
OFF_RAIL = "yellow"
GAP = 3
# A leaf's column is never wider than this; longer host names are cut.
MOST_COLUMN = 30


@dataclass
class Drawn:
    """A fabric's map as last fetched: the answer, or why there is none."""

    read_at: float | None
    fetched: float
    topology: FabricMapJson | None = None
    missing: str | None = None  # the control plane's 404: no map read yet
    error: str | None = None


def said(exc: AdminError, url: str) -> str:
    """The control plane's message, without the URL the client puts before it."""
    return str(exc).removeprefix(f"{url}: ")


def is_not_found(exc: AdminError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, urllib.error.HTTPError) and cause.code == 404


def by_state(states: dict[str, int]) -> str:
    # ACTIVE first: the figure looked for; the rest as the control plane sorted them.
    order = sorted(states, key=lambda s: s != "ACTIVE")
    return ", ".join(f"{states[s]} {s}" for s in order) or "0"


def rates(active: dict[str, int]) -> str:
    ordered = sorted(active.items(), key=lambda kv: -float(kv[0]))
    return ", ".join(f"{n} at {rate} Gb/s" for rate, n in ordered) or "none active"


def fabric_row(f: FabricJson) -> tuple[str, ...]:
    masters = f.get("masters") or []
    master = f.get("master_sm") or (f"{len(masters)} disagree" if masters else DASH)
    problems = f.get("problems") or []
    return (
        str(f["id"]),
        str(master),
        str(len(f.get("subnet_managers") or [])),
        str(len(f.get("nodes") or [])),
        by_state(f.get("ports_by_state") or {}),
        f"{len(problems)} ⚠" if problems else "",
        "read" if f.get("topology_read_at") is not None else "none",
    )


def fabric_detail(f: FabricJson) -> Text:
    """The fabric's subnet managers, ports and problems, each problem with its fix."""
    text = Text()
    text.append(f"Fabric {f['id']}", style="bold")
    masters = list(f.get("masters") or [])
    if f.get("master_sm"):
        text.append(f" · master SM {f['master_sm']}")
    elif masters:
        text.append(f" · ports disagree on the master SM: {', '.join(masters)}", style="red")
    else:
        text.append(" · master SM not read", style="dim")
    others = [g for g in f.get("subnet_managers") or [] if g not in masters]
    if others:
        text.append(f" · other SMs seen: {', '.join(others)}")
    ports = f.get("ports") or []
    text.append(
        f"\n{len(f.get('nodes') or [])} nodes · {len(ports)} ports: "
        f"{by_state(f.get('ports_by_state') or {})} · "
        f"{rates(f.get('active_rates_gbps') or {})}"
    )
    for problem in f.get("problems") or []:
        append_problem(text, problem)
    return text


def age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def columns(blocks: list[list[Text]], width: int, indent: int) -> Text:
    """Blocks of lines side by side, as many to a row as ``width`` holds."""
    text = Text()
    if not blocks:
        return text
    wide = min(MOST_COLUMN, max(len(line.plain) for b in blocks for line in b))
    per_row = max(1, (width - indent + GAP) // (wide + GAP))
    for start in range(0, len(blocks), per_row):
        row = blocks[start : start + per_row]
        for i in range(max(len(b) for b in row)):
            line = Text(" " * indent)
            for j, block in enumerate(row):
                cell = block[i].copy() if i < len(block) else Text()
                cell.truncate(wide, overflow="ellipsis")
                line.append_text(cell)
                if j < len(row) - 1:
                    line.append(" " * (wide - len(cell.plain) + GAP))
            line.rstrip()
            text.append_text(line)
            text.append("\n")
    return text


def named(nodes: dict[str, MapNodeJson], guid: str) -> str:
    """A switch by its name, or its GUID when the map does not hold it."""
    node = nodes.get(guid)
    return switch_name(dict(node)) if node else guid


def topology_text(topology: FabricMapJson, age_seconds: float, width: int) -> Text:
    """The map: a summary line, a row per tier of switches (leaves as columns of their
    hosts' adapters), then the degraded cables and the adapters off their rail."""
    nodes = {str(n["guid"]): n for n in topology.get("nodes") or []}
    tiers: dict[str, str] = dict(topology.get("tiers") or {})
    links = topology.get("links") or []
    misses = topology.get("rail_misses") or []
    # (host, adapter, leaf): "HCA-1 port 2" names a port; the leaf says which one.
    off_rail = {
        (str(m["host"]), str(m["adapter"]).partition(" ")[0], str(m["leaf"])) for m in misses
    }
    switches = sorted(
        (n for n in nodes.values() if n.get("kind") == "switch"),
        key=lambda n: natural(switch_name(dict(n))),
    )
    cas = [n for n in nodes.values() if n.get("kind") == "ca"]
    degraded = [link for link in links if link.get("degraded")]

    # Per switch: the adapters on it, and its cables to other switches.
    hosts: dict[str, list[tuple[str, str, bool]]] = {}  # guid -> (host, adapter, degraded)
    uplinks: dict[str, list[bool]] = {}
    for link in links:
        a, b = str(link["a"][0]), str(link["b"][0])
        for mine, theirs in ((a, b), (b, a)):
            if mine not in nodes or nodes[mine].get("kind") != "switch" or theirs not in nodes:
                continue
            other = nodes[theirs]
            if other.get("kind") == "switch":
                uplinks.setdefault(mine, []).append(bool(link.get("degraded")))
            elif other.get("kind") == "ca":
                host = str(other.get("host") or other.get("description") or other["guid"])
                hosts.setdefault(mine, []).append(
                    (host, str(other.get("adapter") or ""), bool(link.get("degraded")))
                )

    text = Text()
    read_by = topology.get("read_by") or "a node"
    n_hosts = len({n.get("host") for n in cas if n.get("host")})
    text.append(f"Map read {age(age_seconds)} ago by {read_by}", style="bold")
    text.append(
        f" · {len(switches)} switches · {len(cas)} adapters on {n_hosts} hosts · "
        f"{len(links)} cables"
    )
    text.append(f", {len(degraded)} degraded" if degraded else "", style=DEGRADED)
    text.append(f" · {len(misses)} off their rail" if misses else "", style=OFF_RAIL)
    if topology.get("error"):
        text.append(f"\n(the last read failed: {topology['error']})", style="dim")
    text.append("\n↕ cables to other switches · ", style="dim")
    text.append("✗ degraded", style=DEGRADED)
    text.append(" · ", style="dim")
    text.append("⚠ off its rail", style=OFF_RAIL)
    text.append("\n")

    label = 8
    for tier in (*TIERS, None):
        on_tier = [s for s in switches if tiers.get(str(s["guid"])) == tier]
        if not on_tier:
            continue
        blocks = []
        for s in on_tier:
            guid = str(s["guid"])
            ups = uplinks.get(guid, [])
            head = Text(switch_name(dict(s)), style="bold")
            head.append(f" ↕{len(ups)}")
            if any(ups):
                head.append(f" ✗{sum(ups)}", style=DEGRADED)
            block = [head]
            for host, adapter, bad in sorted(hosts.get(guid, [])) if tier == "leaf" else []:
                line = Text(f"{host} {adapter}".rstrip())
                if bad:
                    line.stylize(DEGRADED)
                    line.append(" ✗", style=DEGRADED)
                if (host, adapter, guid) in off_rail:
                    line.stylize(OFF_RAIL)
                    line.append(" ⚠", style=OFF_RAIL)
                block.append(line)
            blocks.append(block)
        drawn = columns(blocks, width, label)
        name = tier or "no tier"
        drawn = Text(f"{name:<{label}}") + drawn[label:]
        text.append_text(drawn)

    plain = {guid: dict(n) for guid, n in nodes.items()}
    for link in degraded:
        text.append("✗ degraded ", style=f"bold {DEGRADED}")
        text.append(
            f"{end_name(plain, link['a'])} ↔ {end_name(plain, link['b'])}: "
            f"{link.get('width')} {link.get('speed')} ({float(link.get('rate_gbps') or 0):g} "
            f"Gb/s), {link['degraded']}\n",
            style=DEGRADED,
        )
    for m in misses:
        leaf = named(nodes, str(m["leaf"]))
        rail = ", ".join(named(nodes, str(g)) for g in m.get("expected") or [])
        text.append("⚠ off rail ", style=f"bold {OFF_RAIL}")
        text.append(
            f"{m['host']} {m['adapter']} is on {leaf} port {m['leaf_port']}, which carries "
            f"{m['leaf_rail']}; its rail is on {rail}\n",
            style=OFF_RAIL,
        )
    text.rstrip()
    return text


def map_text(drawn: Drawn | None, width: int, now: float) -> Text:
    if drawn is None:
        return Text("Reading the fabric's map…", style="dim")
    if drawn.missing is not None:
        return Text(f"no map yet: {drawn.missing}", style="dim")
    if drawn.error is not None:
        return Text(f"Cannot read the map: {drawn.error}", style="red")
    assert drawn.topology is not None
    seen = float(drawn.topology.get("age_seconds") or 0.0) + max(0.0, now - drawn.fetched)
    return topology_text(drawn.topology, seen, width)


def others_text(found: FabricsJson) -> Text:
    """The RoCE networks, and the active InfiniBand ports whose master is not known."""
    text = Text()
    networks = found.get("roce_networks") or []
    text.append("RoCE networks", style="bold")
    if not networks:
        text.append("\n  none seen", style="dim")
    for net in networks:
        ports = net.get("ports") or []
        names = ", ".join(f"{p['node']} {p.get('device')}" for p in ports[:8])
        more = f" and {len(ports) - 8} more" if len(ports) > 8 else ""
        text.append(
            f"\n  {net['network']}: {len(net.get('nodes') or [])} nodes, "
            f"{len(ports)} ports ({names}{more})"
        )
    unassigned = found.get("unassigned_ports") or []
    if unassigned:
        text.append("\nPorts of no fabric", style="bold")
        text.append(" (active, their master SM not read)", style="dim")
        for p in unassigned:
            text.append(
                f"\n  {p['node']} {p.get('device')}/{p.get('port')} {p.get('state') or DASH}"
            )
    return text


class FabricsPane(Pane):
    TITLE = "Fabrics"
    ID = "fabrics"
    KEY = "7"

    DEFAULT_CSS = """
    FabricsPane #fabrics-table {
        height: auto;
        max-height: 8;
    }
    FabricsPane #fabrics-scroll {
        height: 1fr;
        border-top: solid $primary-lighten-2;
    }
    FabricsPane #fabrics-scroll > Static {
        width: 100%;
    }
    FabricsPane #fabrics-map {
        margin: 1 0;
    }
    """

    found: FabricsJson | None
    fabrics: dict[str, FabricJson]
    maps: dict[str, Drawn]
    error: str | None = None

    def compose(self) -> ComposeResult:
        self.found, self.fabrics, self.maps = None, {}, {}
        yield DataTable(id="fabrics-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="fabrics-scroll"):
            yield Static(id="fabrics-detail")
            yield Static(id="fabrics-map")
            yield Static(id="fabrics-others")

    def update_from(self, snapshot: Snapshot) -> None:
        if self.display:
            self.fetch()

    def on_show(self, event: Show) -> None:
        self.fetch()

    def on_resize(self, event: Resize) -> None:
        self.render_fabric()

    @work(exclusive=True, group="fabrics")
    async def fetch(self) -> None:
        api = self.console.api
        try:
            found = await api.fabrics()
        except AdminError as exc:
            self.error = said(exc, f"{api.base_url}/api/v1/fabrics")
        else:
            self.error = None
            self.found = found
            self.fabrics = {str(f["id"]): f for f in found.get("fabrics") or []}
            fill(
                self.query_one(DataTable),
                COLUMNS,
                {fid: fabric_row(f) for fid, f in self.fabrics.items()},
            )
            self.query_one("#fabrics-others", Static).update(others_text(found))
        self.render_fabric()
        self.want_map()

    @property
    def highlighted(self) -> str | None:
        return highlighted(self.query_one(DataTable))

    def want_map(self) -> None:
        """Fetch the highlighted fabric's map unless the one held is its newest."""
        fid = self.highlighted
        if fid is None or fid not in self.fabrics:
            return
        held = self.maps.get(fid)
        if held is None or held.error or held.read_at != self.fabrics[fid].get("topology_read_at"):
            self.fetch_map(fid)

    @work(exclusive=True, group="fabric-map")
    async def fetch_map(self, fid: str) -> None:
        api = self.console.api
        path = routes.FABRIC_MAP.at(fid)
        read_at = self.fabrics[fid].get("topology_read_at")
        try:
            topology = await api.fabric_map(fid)
        except AdminError as exc:
            why = said(exc, api.base_url + path)
            if is_not_found(exc):
                self.maps[fid] = Drawn(read_at, time.monotonic(), missing=why)
            else:
                self.maps[fid] = Drawn(read_at, time.monotonic(), error=why)
        else:
            self.maps[fid] = Drawn(read_at, time.monotonic(), topology)
        self.render_fabric()

    def render_fabric(self) -> None:
        fid = self.highlighted
        fabric = self.fabrics.get(fid) if fid else None
        detail = Text()
        if self.error:
            detail.append(f"Cannot read the fabrics: {self.error}\n", style="red")
        if fabric is None:
            detail.append(
                "No InfiniBand fabric seen: no node reports an InfiniBand port with its "
                "master subnet manager.",
                style="dim",
            )
            shown = Text()
        else:
            detail.append_text(fabric_detail(fabric))
            width = max(40, self.content_size.width - 2)
            drawn = self.maps.get(str(fid))
            shown = map_text(drawn, width, time.monotonic())
        self.query_one("#fabrics-detail", Static).update(detail)
        self.query_one("#fabrics-map", Static).update(shown)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.render_fabric()
        self.want_map()
