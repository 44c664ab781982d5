"""The engine ports the reconciler hands out: per host address (two agents on one
machine share its ports), never one in use or one an engine just found taken."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llmgw.server.catalog import scheduler
from llmgw.server.catalog.tracks import Track
from llmgw.server.fleet.nodeview import NodeView

# A port an engine found taken on a host is not given there again for this long.
BAD_FOR = 600.0


def port_range(text: str) -> range:
    first, last = (int(x) for x in text.split("-"))
    return range(first, last + 1)


class EnginePorts:
    def __init__(self, text: str) -> None:
        self.ports = port_range(text)
        # Ports an engine could not use on a host, and when.
        self.bad: dict[tuple[str, int], float] = {}

    def used(self, nodes: Mapping[str, NodeView], tracks: Iterable[Track]) -> dict[str, set[int]]:
        """Ports in use per host address: what the agents report, and what the tracks
        hold (asked for, not reported yet)."""
        used: dict[str, set[int]] = {}
        for view in nodes.values():
            ports = used.setdefault(host(view), set())
            ports.update(s.port for s in view.shards.values() if s.port)
        for track in tracks:
            held = [(track.node, track.port), (track.node, track.rendezvous_port)]
            held += [(w.node, w.port) for w in track.workers]
            for node, port in held:
                home = nodes.get(node)
                if home is not None and port is not None:
                    used.setdefault(host(home), set()).add(port)
        return used

    def take(self, view: NodeView, used: dict[str, set[int]], now: float) -> int | None:
        taken = used.setdefault(host(view), set())
        for port in self.ports:
            if port in taken:
                continue
            bad = self.bad.get((view.id, port))
            if bad is not None and now - bad < BAD_FOR:
                continue
            taken.add(port)
            return port
        return None

    def for_placement(
        self,
        placed: scheduler.Placement,
        nodes: Mapping[str, NodeView],
        used: dict[str, set[int]],
        now: float,
    ) -> tuple[int, int | None, list[int]] | None:
        """The replica's port, its rendezvous port (vLLM and SGLang spanning nodes meet
        on the leader), and each worker's; None, taking none, when a node has none."""
        taken: list[tuple[str, int]] = []

        def one(node: str) -> int | None:
            port = self.take(nodes[node], used, now)
            if port is not None:
                taken.append((host(nodes[node]), port))
            return port

        meets = bool(placed.workers) and placed.request.engine != "llama.cpp"
        port = one(placed.node)
        rendezvous = one(placed.node) if meets else None
        workers = [one(node) for node, _ in placed.workers]
        if port is None or None in workers or (meets and rendezvous is None):
            for address, p in taken:
                used[address].discard(p)
            return None
        return port, rendezvous, [p for p in workers if p is not None]


def host(view: NodeView) -> str:
    return view.address or view.id
