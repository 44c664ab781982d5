"""The fleet's InfiniBand fabrics, from what every node's ports see: a fabric is the
ports whose master subnet manager is the same, or was within ``RECENT`` (a failover moves
a whole fabric from one master to another; its ports are one fabric through it). A
fabric is named by the lowest SM GUID seen in it, and keeps that name through failovers
for as long as the control plane runs: each master is remembered with its fabric's
name, so a fabric that failed over to a higher GUID is not renamed once ``RECENT`` has
forgotten the old master (a lower one joining still names it).

Problems are said with their fix: ports stuck in INIT or ARMED (the SM has not brought
them up), ports of one fabric that see different masters at once, a master that changed
recently, and a node with active InfiniBand ports whose master could not be read.
RoCE ports are grouped by the RoCE v2 networks they carry.

``FabricWatch`` keeps, per port, the masters seen lately; it is fed the node views on
each call (the API, /metrics) and needs nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypedDict

from llmgw.server.fleet.exposition import Families, label_text
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.hardware import IbPort

RECENT = 900.0  # seconds a change of master is reported, and joins the fabrics it bridged
# A node label declaring the one fabric a node is cabled to (its id, as `ctl fabrics` shows).
DECLARED = "llmgw.fabric"
UNBROUGHT = ("INIT", "ARMED")


class PortJson(TypedDict):
    """A port as the API shows it."""

    node: str
    device: str
    port: int
    state: str | None
    phys_state: str | None
    rate_gbps: float | None
    width_speed: str | None
    port_guid: str | None
    master_sm_guid: str | None


class FabricJson(TypedDict):
    id: str
    # The one master SM its ports see; None while they disagree.
    master_sm: str | None
    masters: list[str]
    subnet_managers: list[str]
    nodes: list[str]
    ports: list[PortJson]
    ports_by_state: dict[str, int]
    # Active ports by their rate ("400": 8); a rate not read is not counted.
    active_rates_gbps: dict[str, int]
    problems: list[str]


class RoceJson(TypedDict):
    network: str
    nodes: list[str]
    ports: list[PortJson]


class FabricsJson(TypedDict):
    """``FabricWatch.fabrics``."""

    fabrics: list[FabricJson]
    roce_networks: list[RoceJson]
    unassigned_ports: list[PortJson]


@dataclass
class Fabric:
    id: str
    masters: set[str] = field(default_factory=set)
    managers: set[str] = field(default_factory=set)
    ports: list[tuple[str, IbPort]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_json(self) -> FabricJson:
        states: dict[str, int] = {}
        rates: dict[str, int] = {}
        for _, p in self.ports:
            state = p.state or "unknown"
            states[state] = states.get(state, 0) + 1
            if p.rate_gbps is not None and state == "ACTIVE":
                key = f"{p.rate_gbps:g}"
                rates[key] = rates.get(key, 0) + 1
        return {
            "id": self.id,
            "master_sm": sorted(self.masters)[0] if len(self.masters) == 1 else None,
            "masters": sorted(self.masters),
            "subnet_managers": sorted(self.managers),
            "nodes": sorted({n for n, _ in self.ports}),
            "ports": [port_json(n, p) for n, p in self.ports],
            "ports_by_state": dict(sorted(states.items())),
            "active_rates_gbps": dict(sorted(rates.items())),
            "problems": list(self.problems),
        }


def port_json(node: str, p: IbPort) -> PortJson:
    return {
        "node": node,
        "device": p.device,
        "port": p.port,
        "state": p.state,
        "phys_state": p.phys_state,
        "rate_gbps": p.rate_gbps,
        "width_speed": p.width_speed,
        "port_guid": p.port_guid,
        "master_sm_guid": p.master_sm_guid,
    }


def _where(node: str, p: IbPort) -> str:
    return f"{node} {p.device}/{p.port}"


class FabricWatch:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        # (node, device, port) -> [(master guid, first seen, last seen)], oldest first.
        self._seen: dict[tuple[str, str, int], list[tuple[str, float, float]]] = {}
        # Master SM GUID -> the name of the fabric it was master of, so a fabric keeps
        # its name (maps, labels, links) once the failover that moved it is forgotten.
        self._names: dict[str, str] = {}

    def _remember(self, key: tuple[str, str, int], master: str, now: float) -> None:
        seen = [s for s in self._seen.get(key, []) if now - s[2] < RECENT or s[0] == master]
        if seen and seen[-1][0] == master:
            seen[-1] = (master, seen[-1][1], now)
        else:
            seen.append((master, now, now))
        self._seen[key] = seen[-4:]

    def fabrics(self, views: Iterable[NodeView]) -> FabricsJson:
        """``GET /api/v1/fabrics``: the InfiniBand fabrics, the RoCE networks, and the
        active InfiniBand ports whose master is not known."""
        now = self.clock()
        parent: dict[str, str] = {}

        def find(g: str) -> str:
            while parent.setdefault(g, g) != g:
                parent[g] = parent[parent[g]]
                g = parent[g]
            return g

        declared: dict[str, str] = {}
        ib: list[tuple[str, IbPort, str, tuple[str, str, int]]] = []
        roce: dict[str, list[tuple[str, IbPort]]] = {}
        unknown: list[tuple[str, IbPort]] = []
        for view in sorted(views, key=lambda v: v.id):
            if view.labels.get(DECLARED):
                declared[view.id] = view.labels[DECLARED]
            for p in (view.live.ib_ports or ()) if view.session is not None else ():
                if p.link_layer == "Ethernet":
                    for net in p.roce_networks:
                        roce.setdefault(net, []).append((view.id, p))
                    continue
                key = (view.id, p.device, p.port)
                master = p.master_sm_guid
                if not master:
                    if p.state == "ACTIVE":
                        unknown.append((view.id, p))
                    continue
                self._remember(key, master, now)
                ib.append((view.id, p, master, key))
        for _, _, _, key in ib:
            guids = [s[0] for s in self._seen[key]]
            for g in guids[1:]:
                parent[find(g)] = find(guids[0])
        groups: dict[str, Fabric] = {}
        for node, p, master, key in ib:
            root = find(master)
            fabric = groups.setdefault(root, Fabric(root))
            fabric.ports.append((node, p))
            fabric.masters.add(master)
            fabric.managers.update(s[0] for s in self._seen[key])
        out = []
        for fabric in groups.values():
            known = [self._names[m] for m in fabric.managers if m in self._names]
            fabric.id = min([*fabric.managers, *known])
            for master in fabric.masters:
                self._names[master] = fabric.id
            self._judge(fabric, now)
            out.append(fabric)
        _declared(out, declared)
        return {
            "fabrics": [f.as_json() for f in sorted(out, key=lambda f: f.id)],
            "roce_networks": [
                {
                    "network": net,
                    "nodes": sorted({n for n, _ in ports}),
                    "ports": [port_json(n, p) for n, p in ports],
                }
                for net, ports in sorted(roce.items())
            ],
            "unassigned_ports": [port_json(n, p) for n, p in unknown],
        }

    def _judge(self, fabric: Fabric, now: float) -> None:
        stuck = [(n, p) for n, p in fabric.ports if p.state in UNBROUGHT]
        if stuck:
            shown = ", ".join(_where(n, p) for n, p in stuck[:8])
            fabric.problems.append(
                f"{len(stuck)} port(s) in INIT or ARMED ({shown}): the subnet manager has "
                "not brought them up. Fix: check the SM (`sminfo`, its log) and that it "
                "runs with these ports' partition"
            )
        if len(fabric.masters) > 1:
            fabric.problems.append(
                f"ports disagree on their master SM ({', '.join(sorted(fabric.masters))}): "
                "two managers each think they lead. Fix: give the SMs distinct priorities "
                "and keep one master (`sminfo` on each side)"
            )
        changes = []
        for node, p in fabric.ports:
            seen = self._seen.get((node, p.device, p.port), [])
            if len(seen) > 1 and now - seen[-1][1] < RECENT:
                changes.append((seen[-2][0], seen[-1][0], seen[-1][1]))
        if changes:
            old, new, at = max(changes, key=lambda c: c[2])
            fabric.problems.append(
                f"the master SM changed from {old} to {new} {now - at:.0f} s ago: a failover "
                "(or a flapping SM). Fix: read the old master's log; if it keeps changing, "
                "pin the SM priorities"
            )


def _declared(fabrics: list[Fabric], declared: dict[str, str]) -> None:
    """A node labelled with one fabric (``llmgw.fabric``) whose ports are on another."""
    for fabric in fabrics:
        stray = sorted({n for n, _ in fabric.ports if n in declared and declared[n] != fabric.id})
        for node in stray:
            fabric.problems.append(
                f"{node} is declared on fabric {declared[node]} ({DECLARED} label) but has "
                f"ports on this one. Fix: recable its adapters, or correct the label "
                f"(`llmgw ctl node label {node} {DECLARED}=FABRIC`)"
            )


def fabric_metrics(found: FabricsJson) -> list[str]:
    """``llmgw_fabric_*`` for /metrics, from ``FabricWatch.fabrics``."""
    f = Families()
    f.declare("llmgw_fabric_master_sm", "gauge", "1 for the master SM each fabric's ports see.")
    f.declare("llmgw_fabric_subnet_managers", "gauge", "Subnet managers seen in a fabric lately.")
    f.declare("llmgw_fabric_problems", "gauge", "Problems llmgw finds in a fabric now.")
    for fabric in found["fabrics"]:
        fid = fabric["id"]
        for master in fabric["masters"]:
            f.add("llmgw_fabric_master_sm", label_text({"fabric": fid, "sm_guid": master}), 1)
        f.add(
            "llmgw_fabric_subnet_managers",
            label_text({"fabric": fid}),
            len(fabric["subnet_managers"]),
        )
        f.add("llmgw_fabric_problems", label_text({"fabric": fid}), len(fabric["problems"]))
    return list(f.lines())
