"""Replicas spanning nodes in the catalog and in placement: each node's share sized,
the workers' shard ids, the specs each node gets, and which set of nodes is chosen by
how they are wired (an NVLink domain first, one fabric under one leaf next, never
across fabrics, Ethernet-only nodes with a note)."""

from __future__ import annotations

import hashlib
import json

import pytest

from llmgw.server.catalog import scheduler, spanning
from llmgw.server.catalog.model import (
    GIB,
    CatalogError,
    Model,
    Profile,
    check_model,
    fingerprint,
    member_id,
    parse_member_id,
    parse_replica_id,
    start_specs,
)
from llmgw.server.catalog.placement import Card, NodeCapacity, Request
from llmgw.server.catalog.tracks import Start, StartMember
from tests.server.catalog.test_model import LLAMA_8B, model, profile


def test_one_node_keeps_the_fingerprint_it_had_before_nodes_existed() -> None:
    m = model(profile())
    parts = {
        "source": m.source,
        "engine": "llama.cpp",
        "args": [],
        "context": m.context,
        "slots": m.slots,
        "cards": 0,
        "cpu_cores": 0.0,
        "allow_pickle": False,
        "restart": 0,
    }
    before = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    assert fingerprint(m, m.profiles[0]) == before
    wide = model(profile(nodes=2))
    assert fingerprint(wide, wide.profiles[0]) != before


def test_each_node_holds_its_share_of_the_layers() -> None:
    one = check_model(model(profile()), LLAMA_8B).profiles[0]
    two = check_model(model(profile(nodes=2)), LLAMA_8B).profiles[0]
    assert 0.45 < two.memory / one.memory < 0.6
    cards = check_model(model(profile(engine="vllm", cards=2, nodes=2)), LLAMA_8B)
    single = check_model(model(profile(engine="vllm", cards=2)), LLAMA_8B)
    assert cards.profiles[0].card_memory < single.profiles[0].card_memory


@pytest.mark.parametrize(
    ("p", "words"),
    [
        (profile(nodes=0), "give 1 to 64 nodes"),
        (profile(nodes=65), "give 1 to 64 nodes"),
        (profile(engine="vllm", nodes=2), "vllm spans nodes only on cards"),
        (profile(engine="sglang", nodes=2), "give --gpus 1 or more per node"),
    ],
)
def test_a_spanning_profile_that_cannot_run_is_refused(p: Profile, words: str) -> None:
    with pytest.raises(CatalogError) as caught:
        check_model(model(p), LLAMA_8B)
    assert words in str(caught.value) and caught.value.field.endswith(".nodes")


def test_worker_ids_name_their_replica_and_are_no_replica_themselves() -> None:
    rid = "qwen.default.0123abcd"
    assert member_id(rid, 0) == rid
    assert member_id(rid, 3) == f"{rid}~3"
    assert parse_member_id(f"{rid}~3") == (rid, 3)
    assert parse_replica_id(f"{rid}~3") is None
    for other in (rid, f"{rid}~0", f"{rid}~x", "hand-started~1"):
        assert parse_member_id(other) is None


def test_each_node_gets_its_rank_the_workers_and_its_own_key() -> None:
    m = Model(
        name="m",
        source="/m.gguf",
        engine="llama.cpp",
        profiles=(Profile(name="default", engine="llama.cpp", nodes=3, cpu_cores=4),),
        context=512,
    )
    start = Start(
        "m.default.0123abcd",
        "m",
        "default",
        "a",
        42001,
        (),
        (StartMember(1, "b", 42002, ()), StartMember(2, "c", 42001, ())),
    )
    addresses = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}
    specs = start_specs(m, m.profiles[0], start, addresses, b"k" * 32)
    assert [(n, s.replica_id, s.port) for n, s in specs] == [
        ("a", "m.default.0123abcd", 42001),
        ("b", "m.default.0123abcd~1", 42002),
        ("c", "m.default.0123abcd~2", 42001),
    ]
    for rank, (node, spec) in enumerate(specs):
        group = spec.group
        assert group is not None
        assert (group.rank, group.size, group.leader) == (rank, 3, "10.0.0.1")
        assert group.workers == ["10.0.0.2:42002", "10.0.0.3:42001"]
        assert group.peers == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        assert group.bind == addresses[node]
    assert len({s.key for _, s in specs}) == 3


# ------------------------------------------------------------------------ placement


def cand(node: str, free: int = 0, **wiring: object) -> spanning.Candidate:
    return spanning.Candidate(node, (False, True, free, node), **wiring)  # type: ignore[arg-type]


def test_an_nvlink_domain_comes_before_any_fabric() -> None:
    found = spanning.spans(
        [
            cand("f1", fabric="0xa", leaves=("l1",)),
            cand("f2", fabric="0xa", leaves=("l1",)),
            cand("v1", nvlink_domain="u/1", fabric="0xa", leaves=("l2",)),
            cand("v2", nvlink_domain="u/1"),
        ],
        2,
    )
    assert [(s.kind, s.ok) for s in found][:2] == [("nvlink", True), ("fabric", True)]
    assert found[0].chosen == ("v1", "v2")
    assert "NCCL_MNNVL_ENABLE=1" in found[0].notes[0]


def test_one_leaf_is_preferred_and_crossing_the_spine_is_said() -> None:
    under = [cand(f"a{i}", free=i, fabric="0xa", leaves=("l1",)) for i in range(2)]
    apart = [cand(f"b{i}", fabric="0xb", leaves=(f"l{i}",)) for i in range(3)]
    found = spanning.spans([*apart, *under], 2)
    assert (found[0].id, found[0].chosen, found[0].leaf_sets) == ("0xa", ("a0", "a1"), 1)
    spine = found[1]
    assert spine.id == "0xb" and spine.ok and spine.leaf_sets == 2
    assert "crosses the spine" in spine.notes[0]


def test_a_set_never_mixes_fabrics_nor_a_fabric_with_ethernet() -> None:
    found = spanning.spans(
        [cand("a", fabric="0xa"), cand("b", fabric="0xb"), cand("e")],
        2,
    )
    assert not any(s.ok for s in found)
    reasons = {(s.kind, s.id): s.reason for s in found}
    assert reasons == {
        ("fabric", "0xa"): "1 node(s) fit, 2 needed",
        ("fabric", "0xb"): "1 node(s) fit, 2 needed",
        ("ethernet", ""): "1 node(s) fit, 2 needed",
    }


def test_nodes_without_infiniband_may_span_with_a_note() -> None:
    (only,) = spanning.spans([cand("a"), cand("b"), cand("c", free=-1)], 2)
    assert only.kind == "ethernet" and only.chosen == ("c", "a")
    assert "Ethernet" in only.notes[0]


def node(nid: str, memory: int, **wiring: object) -> NodeCapacity:
    card = Card(f"GPU-{nid}", 0, "H100", 80 * GIB, 80 * GIB)
    return NodeCapacity(
        nid,
        memory_total=memory * GIB,
        memory_available=memory * GIB,
        cpu_cores=32,
        engines_installed=frozenset({"vllm"}),
        cards=(card,),
        **wiring,  # type: ignore[arg-type]
    )


def test_place_many_reserves_every_node_and_refuses_with_every_set_judged() -> None:
    fleet = [
        node("a1", 64, fabric="0xa", leaves=("l1",)),
        node("a2", 64, fabric="0xa", leaves=("l1",)),
        node("b1", 64, fabric="0xb"),
        node("small", 4, fabric="0xb"),
    ]
    req = Request("m", "p", "vllm", "/m", memory=8 * GIB, cards=1, card_memory=60 * GIB, nodes=2)
    first, second = scheduler.place_many([req, req], fleet)
    assert isinstance(first, scheduler.Placement)
    assert (first.node, [n for n, _ in first.workers]) == ("a1", ["a2"])
    assert first.cards == ("GPU-a1",) and first.workers[0][1] == ("GPU-a2",)
    assert first.as_json()["nodes"] == ["a1", "a2"]
    assert isinstance(second, scheduler.Refusal)
    assert second.reason == (
        "no 2 nodes wired together fit (InfiniBand fabric 0xb: 1 node(s) fit, 2 needed); "
        "a set never mixes fabrics"
    )
    small = next(v for v in second.verdicts if v.node == "small")
    assert not small.ok and small.reasons[0].startswith("memory: needs 8.0 GiB")
    spans = scheduler.explain_spans(req, fleet)
    assert spans[0].ok and spans[0].chosen == ("a1", "a2")
