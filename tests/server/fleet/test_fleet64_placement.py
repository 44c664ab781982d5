"""Placement of replicas spanning nodes on the recorded 64-node fleet (two InfiniBand
fabrics, one NVL72 domain): the wiring read from what the fleet reports, the NVLink
domain chosen when the cards are there, one leaf set when it has room, the spine when it
must, never two fabrics, and `ctl explain`'s sets."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.server.catalog import scheduler
from llmgw.server.catalog.model import GIB, Model, Profile
from llmgw.server.catalog.reconciler import Reconciler
from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.registry import NodeRegistry
from tests.support import fleet64, wiring


@pytest.fixture(scope="module")
def registry() -> NodeRegistry:
    return fleet64.registry()


@pytest.fixture(scope="module")
def maps(registry: NodeRegistry) -> FabricMaps:
    return fleet64.fabric_maps(registry)


def test_each_node_is_wired_as_the_fleet_says(registry: NodeRegistry, maps: FabricMaps) -> None:
    wired = maps.wiring(registry.nodes)
    trays = [n for n, w in wired.items() if w.nvlink_domain == fleet64.NVLINK_DOMAIN]
    # nvl-13 has a card still joining: NCCL would refuse the domain, so it is left out.
    assert sorted(trays) == sorted(set(fleet64.TRAYS) - {"nvl-13"})
    assert "nvl-13" not in wired
    assert {n for n, w in wired.items() if w.fabric == fleet64.FABRIC_A} == set(fleet64.A_NODES)
    assert {n for n, w in wired.items() if w.fabric == fleet64.FABRIC_B} == set(fleet64.B_NODES)
    su1 = {wired[n].leaves for n in fleet64.A_SU1}
    su2 = {wired[n].leaves for n in fleet64.A_SU2}
    assert len(su1) == len(su2) == 1 and su1 != su2
    assert len(next(iter(su1))) == fleet64.RAILS  # one leaf per rail


def reconciler(registry: NodeRegistry, maps: FabricMaps) -> Reconciler:
    return wiring.reconciler(wiring=maps.wiring)


def wide(nodes: int, cards: int, replicas: int = 1) -> Model:
    profile = Profile(
        name="default",
        engine="vllm",
        cards=cards,
        nodes=nodes,
        replicas=replicas,
        memory=16 * GIB,
        card_memory=60 * GIB,
    )
    return Model(name="big", source="/models/big", engine="vllm", profiles=(profile,), context=4096)


def request(rec: Reconciler, model: Model) -> scheduler.Request:
    return rec.request(model, model.profiles[0], 0.0)


@pytest.mark.parametrize(
    ("nodes", "cards", "kind", "where"),
    [
        # Four cards a node: the NVL72 trays, over NVLink.
        (4, 4, "nvlink", set(fleet64.TRAYS)),
        # Eight cards a node: the H100 nodes; four fit under one leaf set of either fabric.
        (4, 8, "fabric", set(fleet64.H100_NODES)),
    ],
)
def test_the_best_wired_set_is_chosen(
    registry: NodeRegistry, maps: FabricMaps, nodes: int, cards: int, kind: str, where: set[str]
) -> None:
    rec = reconciler(registry, maps)
    caps = rec.capacities(registry.nodes)
    (placed,) = scheduler.place_many([request(rec, wide(nodes, cards))], caps)
    assert isinstance(placed, scheduler.Placement)
    chosen = {placed.node, *(n for n, _ in placed.workers)}
    assert len(chosen) == nodes and chosen <= where
    assert placed.nvlink == (kind == "nvlink")
    assert all(len(c) == cards for c in [placed.cards, *(c for _, c in placed.workers)])
    if kind == "fabric":
        wired = maps.wiring(registry.nodes)
        assert len({wired[n].leaves for n in chosen}) == 1  # no spine between them


def test_a_replica_too_wide_for_a_leaf_set_crosses_the_spine_within_one_fabric(
    registry: NodeRegistry, maps: FabricMaps
) -> None:
    rec = reconciler(registry, maps)
    spans = scheduler.explain_spans(request(rec, wide(20, 8)), rec.capacities(registry.nodes))
    best = spans[0]
    assert (best.kind, best.id, best.ok, best.leaf_sets) == ("fabric", fleet64.FABRIC_A, True, 2)
    assert set(best.chosen) <= set(fleet64.A_NODES)
    # All sixteen of SU1 first, then four of SU2: the fewest leaf sets.
    assert set(fleet64.A_SU1) <= set(best.chosen)
    assert "crosses the spine" in best.notes[0]
    b = next(s for s in spans if s.id == fleet64.FABRIC_B)
    assert not b.ok and b.reason == "16 node(s) fit, 20 needed"


def test_wider_than_any_fabric_is_refused_never_mixed(
    registry: NodeRegistry, maps: FabricMaps
) -> None:
    rec = reconciler(registry, maps)
    model = wide(40, 8)
    (refused,) = scheduler.place_many([request(rec, model)], rec.capacities(registry.nodes))
    assert isinstance(refused, scheduler.Refusal)
    assert refused.reason == (
        f"no 40 nodes wired together fit (InfiniBand fabric {fleet64.FABRIC_A}: 30 node(s) "
        f"fit, 40 needed; InfiniBand fabric {fleet64.FABRIC_B}: 16 node(s) fit, 40 needed); "
        "a set never mixes fabrics"
    )
    kinds = [s["kind"] for s in refused.as_json()["spans"]]
    assert kinds == ["fabric", "fabric"]  # the trays' 4 cards hold no 8-card share


def test_replicas_fill_the_domain_and_the_rest_say_why(
    registry: NodeRegistry, maps: FabricMaps
) -> None:
    rec = reconciler(registry, maps)
    # 100 GiB a card: only a GB200 holds a share. Each replica takes 4 trays over
    # NVLink; the 17 usable trays hold 4 replicas.
    profile = replace(wide(4, 4).profiles[0], card_memory=100 * GIB, replicas=5)
    model = replace(wide(4, 4), profiles=(profile,))
    plan = rec.plan([model], registry.nodes)
    assert len(plan.starts) == 4 and all(s.nvlink for s in plan.starts)
    used = [n for s in plan.starts for n in (s.node, *(w.node for w in s.workers))]
    assert len(used) == len(set(used)) == 16 and set(used) <= set(fleet64.TRAYS)
    assert "nvl-13" not in used
    # The last tray of the domain and nvl-13 (off NVLink, no InfiniBand) are no set.
    note = rec.status[("big", "default")].note
    assert note.startswith(
        f"no 4 nodes wired together fit (NVLink domain {fleet64.NVLINK_DOMAIN}: 1 node(s) "
        "fit, 4 needed; nodes without InfiniBand: 1 node(s) fit, 4 needed)"
    )
