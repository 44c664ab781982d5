from __future__ import annotations

import random
import time
from dataclasses import replace
from typing import Any

import pytest

from llmgw.server.catalog import blocks
from llmgw.server.catalog.scheduler import (
    GIB,
    Card,
    NodeCapacity,
    Placement,
    Refusal,
    Request,
    Strategy,
    explain,
    place,
    place_many,
)
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.messages import EngineInfo
from llmgw.wire.states import NodeState
from tests.support.nodefacts import facts, live


def node(nid: str, free_gib: float = 64, **kw: Any) -> NodeCapacity:
    base = NodeCapacity(
        id=nid,
        cpu_cores=16,
        memory_total=128 * GIB,
        memory_available=int(free_gib * GIB),
        disk_free=500 * GIB,
        engines_installed=frozenset({"llama.cpp"}),
    )
    return replace(base, **kw)


def gpu_node(nid: str, frees_gib: list[float], **kw: Any) -> NodeCapacity:
    cards = tuple(
        Card(f"{nid}-gpu{i}", i, "H100", 80 * GIB, int(f * GIB)) for i, f in enumerate(frees_gib)
    )
    return node(nid, cards=cards, **kw)


def req(**kw: Any) -> Request:
    base = Request(model="m", profile="default", engine="llama.cpp", source="hf:m", memory=4 * GIB)
    return replace(base, **kw)


def placed(result: Placement | Refusal) -> Placement:
    assert isinstance(result, Placement), result
    return result


def refused(result: Placement | Refusal) -> Refusal:
    assert isinstance(result, Refusal), result
    return result


def only_reasons(r: Request, n: NodeCapacity) -> list[str]:
    (v,) = explain(r, [n])
    assert not v.ok
    return list(v.reasons)


def test_not_ready_and_cordoned() -> None:
    assert only_reasons(req(), node("a", ready=False)) == ["node not Ready"]
    assert only_reasons(req(), node("a", cordoned=True)) == ["node cordoned"]


def test_engine_installed_or_installable() -> None:
    r = req(engine="vllm")
    assert only_reasons(r, node("a")) == ["engine: vllm neither installed nor installable"]
    assert placed(place(r, [node("a", engines_installable=frozenset({"vllm"}))])).node == "a"


def test_memory_reason_names_figures() -> None:
    n = node("a", free_gib=10, memory_reserved=int(1.7 * GIB))
    assert only_reasons(req(memory=12 * GIB), n) == ["memory: needs 12.0 GiB, 8.3 GiB free"]


def test_disk_checked_and_skipped_when_weights_held() -> None:
    r = req(disk=40 * GIB)
    assert only_reasons(r, node("a", disk_free=24 * GIB)) == ["disk: needs 40.0 GiB, 24.0 GiB free"]
    holder = node("a", disk_free=1 * GIB, weights=frozenset({"hf:m"}))
    (v,) = explain(r, [holder])
    assert v.ok and "disk: weights already here" in v.notes
    # Unknown disk is not a full disk.
    assert placed(place(r, [node("b", disk_free=None)])).node == "b"


def test_cpu_reserved_like_memory() -> None:
    n = node("a", cpu_cores=16, cpu_reserved=14)
    assert only_reasons(req(cpu_cores=4), n) == ["cpu: needs 4 cores, 2 free of 16"]


def test_cards_per_card_memory_rule() -> None:
    n = gpu_node("a", [30, 10, 10])
    r = req(cards=2, card_memory=20 * GIB)
    (reason,) = only_reasons(r, n)
    assert reason.startswith("cards: needs 2 with 20.0 GiB free each, 1 have it")
    assert "card 1: 10.0 GiB free" in reason
    # Reserved memory on a card counts against it.
    n2 = gpu_node("b", [30, 30])
    n2 = replace(n2, cards=(n2.cards[0], replace(n2.cards[1], reserved=15 * GIB)))
    assert only_reasons(r, n2)[0].startswith("cards: needs 2 with 20.0 GiB free each, 1 have")


def test_cards_chosen_deterministically() -> None:
    n = gpu_node("a", [70, 30, 50, 30])
    r = req(cards=2, card_memory=25 * GIB)
    # Binpack fills the fullest cards that fit; ties by index.
    assert placed(place(r, [n])).cards == ("a-gpu1", "a-gpu3")
    assert placed(place(r, [n], strategy="spread")).cards == ("a-gpu0", "a-gpu2")
    assert all(placed(place(r, [n])).cards == ("a-gpu1", "a-gpu3") for _ in range(5))


def test_role_labels_both_ways() -> None:
    judge = node("j", labels={"llmgw.role": "judge"})
    plain = node("p")
    assert placed(place(req(), [judge, plain])).node == "p"
    assert only_reasons(req(), judge) == ["role: node is for role 'judge', request asks no role"]
    assert placed(place(req(role="judge"), [judge, plain])).node == "j"
    assert only_reasons(req(role="judge"), plain) == [
        "role: request asks role 'judge', node has none"
    ]
    # A selector naming the role label is the same ask.
    assert placed(place(req(selector={"llmgw.role": "judge"}), [judge, plain])).node == "j"


def test_selector_labels_must_all_match() -> None:
    n = node("a", labels={"gpu": "h100", "zone": "x"})
    assert placed(place(req(selector={"gpu": "h100", "zone": "x"}), [n])).node == "a"
    assert only_reasons(req(selector={"gpu": "h100", "zone": "y", "rack": "1"}), n) == [
        "selector: rack=1 wanted, node has rack=(none)",
        "selector: zone=y wanted, node has zone=x",
    ]


def test_avoid_passed_over_while_others_fit() -> None:
    nodes = [node("a", free_gib=10), node("b", free_gib=60)]
    r = req(avoid=frozenset({"a"}))
    p = placed(place(r, nodes))
    assert p.node == "b" and p.notes == ()
    va, vb = explain(r, nodes)
    assert not va.ok and va.reasons[0].startswith("passed over: model failed here recently")
    assert vb.ok and vb.rank == 1


def test_avoid_used_when_nothing_else_fits() -> None:
    nodes = [node("a", free_gib=10), node("b", free_gib=2)]
    r = req(avoid=frozenset({"a"}))
    p = placed(place(r, nodes))
    assert p.node == "a" and "no other node fits" in p.notes[0]
    va, _ = explain(r, nodes)
    assert va.ok and any("no other node fits" in n for n in va.notes)


def test_binpack_and_spread_choose_differently() -> None:
    nodes = [node("small", free_gib=8), node("big", free_gib=100)]
    assert placed(place(req(), nodes)).node == "small"
    assert placed(place(req(), nodes, strategy="spread")).node == "big"


def test_weights_on_node_come_first() -> None:
    nodes = [node("small", free_gib=8), node("big", free_gib=100, weights=frozenset({"hf:m"}))]
    assert placed(place(req(), nodes)).node == "big"
    (big, small) = explain(req(), nodes)
    assert big.rank == 1 and big.holds_weights and small.rank == 2


def test_determinism_and_node_order() -> None:
    rng = random.Random(7)
    nodes = [node(f"n{i:03}", free_gib=rng.choice([16, 32, 64])) for i in range(60)]
    reqs = [req(model=f"m{i % 5}", memory=rng.choice([2, 4, 8]) * GIB) for i in range(80)]
    first = [(p.node if isinstance(p, Placement) else None) for p in place_many(reqs, nodes)]
    for _ in range(3):
        shuffled = nodes[:]
        rng.shuffle(shuffled)
        again = place_many(reqs, shuffled)
        assert [(p.node if isinstance(p, Placement) else None) for p in again] == first
    # Ties in binpack go to the lowest node id.
    assert placed(place(req(), [node("b"), node("a")])).node == "a"


def test_explain_agrees_with_place() -> None:
    rng = random.Random(3)
    nodes = [
        gpu_node(f"g{i}", [rng.choice([10, 40, 80]) for _ in range(4)], free_gib=rng.randint(4, 64))
        for i in range(40)
    ]
    strategies: tuple[Strategy, ...] = ("binpack", "spread")
    for strategy in strategies:
        for r in (req(), req(cards=2, card_memory=30 * GIB), req(memory=50 * GIB)):
            verdicts = explain(r, nodes, strategy)
            best = [v for v in verdicts if v.rank == 1]
            result = place(r, nodes, strategy)
            if best:
                p = placed(result)
                assert (p.node, p.cards) == (best[0].node, best[0].cards)
            else:
                refused(result)
            assert all(set(v.as_json()) >= {"node", "ok", "reasons", "score"} for v in verdicts)


def test_place_many_reserves_as_it_goes() -> None:
    nodes = [node("a", free_gib=25), node("b", free_gib=25)]
    results = [placed(p) for p in place_many([req(memory=10 * GIB)] * 3, nodes)]
    assert [p.node for p in results] == ["a", "a", "b"]
    # Cards too: two one-card replicas on a node with one roomy card do not share it.
    g = gpu_node("g", [50, 50])
    cards = [placed(p).cards for p in place_many([req(cards=1, card_memory=40 * GIB)] * 2, [g])]
    assert cards == [("g-gpu0",), ("g-gpu1",)]


def test_place_many_disk_counted_once_per_source() -> None:
    nodes = [node("a", disk_free=50 * GIB)]
    results = place_many([req(disk=40 * GIB)] * 2 + [req(source="hf:other", disk=40 * GIB)], nodes)
    assert [type(p) for p in results] == [Placement, Placement, Refusal]
    assert refused(results[2]).verdicts[0].reasons == ("disk: needs 40.0 GiB, 10.0 GiB free",)


def test_refusal_carries_every_verdict() -> None:
    nodes = [node("a", free_gib=8), node("b", cordoned=True), node("c", ready=False)]
    r = refused(place(req(memory=40 * GIB), nodes))
    assert [v.node for v in r.verdicts] == ["a", "b", "c"]
    assert r.verdicts[0].reasons == ("memory: needs 40.0 GiB, 8.0 GiB free",)
    assert "a: memory" in r.reason
    assert r.as_json()["verdicts"][1]["reasons"] == ["node cordoned"]


def test_from_view_reads_typed_figures_never_the_api_json() -> None:
    view = NodeView(
        id="n1",
        cert_serial=1,
        state=NodeState.READY,
        facts=facts(
            cpu_count=32,
            memory_total=256 * GIB,
            memory_available=100 * GIB,
            disks=[
                {"path": "/", "fstype": "ext4", "total": 1, "free": 30 * GIB, "shared": False},
                {"path": "/m", "fstype": "nfs", "total": 1, "free": 900 * GIB, "shared": True},
            ],
            gpus=[
                {"index": 0, "uuid": "GPU-0", "name": "A100", "memory_total": 80, "memory_used": 1}
            ],
        ),
        # The latest heartbeat's figures win over the facts of registering.
        live=live(
            memory_available=200 * GIB,
            gpus=[
                {"index": 0, "uuid": "GPU-0", "name": "A100", "memory_total": 80, "memory_used": 5}
            ],
        ),
        engines=[EngineInfo(name="llama.cpp", path="/x")],
        engines_probed=True,
        installable=["vllm"],
        draining=True,
        labels={"zone": "a"},
    )
    n = NodeCapacity.from_view(view, memory_reserved=GIB, card_reserved={"GPU-0": 10})
    assert n.ready and n.cpu_cores == 32 and n.disk_free == 30 * GIB
    assert n.memory_available == 200 * GIB and n.memory_reserved == GIB
    assert n.cards[0].memory_free == 75 and n.cards[0].reserved == 10
    assert n.engines_installed == {"llama.cpp"} and n.engines_installable == {"vllm"}
    assert n.cordoned and n.labels == {"zone": "a"}  # draining takes nothing new
    # A figure never reported stays unknown: no disks is not a full disk.
    bare = NodeCapacity.from_view(NodeView(id="n2", cert_serial=1))
    assert not bare.ready and bare.disk_free is None and bare.cards == ()


def test_large_fleet_is_fast() -> None:
    rng = random.Random(11)
    nodes = []
    for i in range(2000):
        if i % 2:
            nodes.append(gpu_node(f"n{i:05}", [80.0] * rng.choice([2, 4, 8]), free_gib=512))
        else:
            nodes.append(node(f"n{i:05}", free_gib=rng.choice([64, 128, 256]), cpu_cores=64))
    reqs = []
    for i in range(10_000):
        if i % 3 == 0:
            reqs.append(
                req(model=f"g{i % 40}", source=f"hf:g{i % 40}", cards=1, card_memory=20 * GIB)
            )
        else:
            reqs.append(req(model=f"c{i % 200}", source=f"hf:c{i % 200}", cpu_cores=2))
    start = time.perf_counter()
    results = place_many(reqs, nodes)
    elapsed = time.perf_counter() - start
    ok = sum(isinstance(p, Placement) for p in results)
    print(f"\nplaced {ok}/{len(reqs)} replicas on {len(nodes)} nodes in {elapsed:.3f}s")
    assert ok == len(reqs)
    assert elapsed < 5


def _reference(
    requests: list[Request], nodes: list[NodeCapacity], strategy: Strategy
) -> list[tuple[str, tuple[str, ...], tuple[str, ...]] | None]:
    """Placement by brute force, as the module docstring states it: for each request,
    every node passing the filters, sorted by (avoided, lacks the weights, binpack or
    spread on the scored resource, node id), and the first one taken."""
    memory = {n.id: n.memory_available - n.memory_reserved for n in nodes}
    cpu = {n.id: n.cpu_cores - n.cpu_reserved for n in nodes}
    disk = {n.id: n.disk_free for n in nodes}
    cards = {n.id: [c.memory_free - c.reserved for c in n.cards] for n in nodes}
    arrived: dict[str, set[str]] = {n.id: set(n.weights) for n in nodes}
    out: list[tuple[str, tuple[str, ...], tuple[str, ...]] | None] = []
    for r in requests:
        role = r.role if r.role is not None else r.selector.get("llmgw.role")
        fitting: list[tuple[tuple[bool, bool, int, str], NodeCapacity, list[int]]] = []
        for n in nodes:
            if not n.ready or n.cordoned:
                continue
            if r.engine not in n.engines_installed | n.engines_installable:
                continue
            if n.labels.get("llmgw.role") != role:
                continue
            if any(n.labels.get(k) != v for k, v in r.selector.items() if k != "llmgw.role"):
                continue
            if r.memory > memory[n.id] or r.cpu_cores > cpu[n.id]:
                continue
            room = disk[n.id]
            if r.source not in arrived[n.id] and room is not None and r.disk > room:
                continue
            frees = cards[n.id]
            roomy = [i for i, f in enumerate(frees) if f >= r.card_memory]
            if len(roomy) < r.cards:
                continue
            # Binpack fills the fullest cards that fit, spread the emptiest; ties by index.
            sign = 1 if strategy == "binpack" else -1
            roomy.sort(key=lambda i: (sign * frees[i], n.cards[i].index))
            chosen = sorted(roomy[: r.cards], key=lambda i: n.cards[i].index)
            free = sum(f for f in frees if f > 0) if r.cards else memory[n.id]
            key = (n.id in r.avoid, r.source not in n.weights, sign * free, n.id)
            fitting.append((key, n, chosen))
        if not fitting:
            out.append(None)
            continue
        key, n, chosen = min(fitting, key=lambda f: f[0])
        notes = ("model failed here recently; used as no other node fits",) if key[0] else ()
        out.append((n.id, tuple(n.cards[i].uuid for i in chosen), notes))
        memory[n.id] -= r.memory
        cpu[n.id] -= r.cpu_cores
        room = disk[n.id]
        if r.source not in arrived[n.id] and room is not None:
            disk[n.id] = room - r.disk
        arrived[n.id].add(r.source)
        for i in chosen:
            cards[n.id][i] -= r.card_memory
    return out


def _overfull_fleet(seed: int) -> tuple[list[Request], list[NodeCapacity]]:
    """Many nodes, far more asked of them than they hold, in every resource at once."""
    rng = random.Random(seed)
    sources = [f"hf:s{i}" for i in range(12)]
    nodes: list[NodeCapacity] = []
    for i in range(rng.randint(60, 140)):
        kw: dict[str, Any] = {
            "cpu_cores": rng.choice([4, 8, 16, 32]),
            "cpu_reserved": rng.choice([0, 0, 1.5, 3]),
            "memory_reserved": rng.choice([0, 0, 2 * GIB]),
            "disk_free": rng.choice([None, 20 * GIB, 100 * GIB, 500 * GIB]),
            "weights": frozenset(rng.sample(sources, rng.choice([0, 0, 0, 1, 2]))),
            "ready": rng.random() > 0.05,
            "cordoned": rng.random() < 0.05,
            "labels": rng.choice([{}, {}, {"zone": "a"}, {"zone": "b"}, {"llmgw.role": "judge"}]),
            "engines_installable": frozenset(rng.choice([(), ("vllm",)])),
        }
        free = rng.choice([8, 16, 32, 64, 128])
        if rng.random() < 0.5:
            frees = [
                float(rng.choice([0, 10, 24, 40, 80])) for _ in range(rng.choice([1, 2, 4, 8]))
            ]
            nodes.append(gpu_node(f"n{i:03}", frees, free_gib=free, **kw))
        else:
            nodes.append(node(f"n{i:03}", free_gib=free, **kw))
    ids = [n.id for n in nodes]
    requests: list[Request] = []
    for i in range(len(nodes) * 6):
        uses_cards = rng.random() < 0.4
        requests.append(
            req(
                model=f"m{i % 7}",
                source=rng.choice(sources),
                engine=rng.choice(["llama.cpp", "llama.cpp", "vllm"]),
                memory=rng.choice([0, 1, 2, 4, 8, 16]) * GIB,
                disk=rng.choice([0, 10, 30]) * GIB,
                cpu_cores=rng.choice([0, 0.5, 1, 2, 4, 6]),
                cards=rng.choice([1, 2, 3]) if uses_cards else 0,
                card_memory=rng.choice([0, 8, 20, 30]) * GIB if uses_cards else 0,
                role=rng.choice([None, None, None, None, "judge"]),
                selector=rng.choice([{}, {}, {}, {"zone": "a"}, {"zone": "b"}]),
                avoid=frozenset(rng.sample(ids, rng.choice([0, 0, 1, 3, len(ids) // 2]))),
            )
        )
    return requests, nodes


@pytest.mark.parametrize("block", [2, 5, 48])
@pytest.mark.parametrize("strategy", ["binpack", "spread"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_place_many_matches_brute_force_on_overfull_fleets(
    seed: int, strategy: Strategy, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The index must change how many nodes a placement looks at, never which it picks;
    # small blocks make it split, empty and re-tighten its blocks often.
    monkeypatch.setattr(blocks.Order, "BLOCK", block)
    requests, nodes = _overfull_fleet(seed)
    results = place_many(requests, nodes, strategy)
    got = [(p.node, p.cards, p.notes) if isinstance(p, Placement) else None for p in results]
    want = _reference(requests, nodes, strategy)
    assert got == want
    # Overfull indeed: refusals as well as placements, some of them on avoided nodes.
    assert None in want
    assert any(w is not None and w[2] for w in want)
