"""What the replicas hold on each node: the reserve placement subtracts from what the
node reports free (CPU cores, memory, each card's memory), and the weights each node
has or is fetching. One pure function of the reconciler's tracks and the node views."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from llmgw.server.catalog import scheduler
from llmgw.server.catalog.model import Profile
from llmgw.server.catalog.tracks import LIVE, Track
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.wiring import Wiring
from llmgw.wire.states import ShardState


def capacities(
    tracks: Iterable[Track],
    profiles: Mapping[tuple[str, str], Profile],
    nodes: Mapping[str, NodeView],
    wired: Mapping[str, Wiring],
) -> list[scheduler.NodeCapacity]:
    """Each node's facts with what its replicas hold.

    A replica not yet loaded takes its whole figure from what the node reports
    free. A loaded one is already in that figure, as far as it has touched its
    memory; the catalog's promise to it still stands, so the reserve is the larger
    of the two readings: what loads next, or everything promised less what the
    node reports in use. CPU cores stay reserved while a replica runs."""
    cpu: dict[str, float] = {}
    memory: dict[str, int] = {}
    memory_all: dict[str, int] = {}
    cards: dict[str, dict[str, int]] = {}
    cards_all: dict[str, dict[str, int]] = {}
    weights: dict[str, set[str]] = {}
    for track in tracks:
        if track.stop_sent is not None or track.state not in LIVE:
            continue
        profile = profiles.get((track.model, track.profile))
        if profile is None:
            continue
        shares = [(track.node, track.cards), *((w.node, w.cards) for w in track.workers)]
        for node, held in shares:
            cpu[node] = cpu.get(node, 0.0) + profile.cpu_cores
            memory_all[node] = memory_all.get(node, 0) + profile.memory
            every_card = cards_all.setdefault(node, {})
            for uuid in held:
                every_card[uuid] = every_card.get(uuid, 0) + profile.card_memory
            if track.state != ShardState.READY:
                memory[node] = memory.get(node, 0) + profile.memory
                per_card = cards.setdefault(node, {})
                for uuid in held:
                    per_card[uuid] = per_card.get(uuid, 0) + profile.card_memory
    for view in nodes.values():
        holds = weights.setdefault(view.id, set())
        holds.update(s.source for s in view.shards.values() if s.source)
        holds.update(view.downloads)
    out = []
    for nid, view in sorted(nodes.items()):
        figures = view.figures()
        promised = memory_all.get(nid, 0)
        if figures.memory_total is not None and figures.memory_available is not None:
            promised -= figures.memory_total - figures.memory_available
        # Else what is in use was not read: everything promised stays reserved.
        memory[nid] = max(memory.get(nid, 0), promised)
        card_used = {g.uuid: g.memory_used or 0 for g in figures.gpus}
        for uuid, promised in cards_all.get(nid, {}).items():
            loading = cards.setdefault(nid, {}).get(uuid, 0)
            cards[nid][uuid] = max(loading, promised - card_used.get(uuid, 0))
        cap = scheduler.NodeCapacity.from_view(
            view,
            cpu_reserved=cpu.get(nid, 0.0),
            memory_reserved=memory.get(nid, 0),
            card_reserved=cards.get(nid),
            weights=weights.get(nid, ()),
            figures=figures,
        )
        wiring = wired.get(nid)
        if wiring is not None:
            cap = replace(
                cap,
                nvlink_domain=wiring.nvlink_domain,
                fabric=wiring.fabric,
                leaves=wiring.leaves,
            )
        out.append(cap)
    return out
