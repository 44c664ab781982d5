"""MIG in placement: a replica gets one instance, never more; a card in MIG mode with no
instance carved is out, with that reason; instances are cards of their own class."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from llmgw.server.catalog.placement import MIG_EMPTY
from llmgw.server.catalog.scheduler import (
    GIB,
    Card,
    NodeCapacity,
    Placement,
    Refusal,
    Request,
    explain,
    place,
)
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.hardware import GPU
from llmgw.wire.states import NodeState
from tests.support.nodefacts import facts

PARENT = "GPU-11111111-2222-3333-4444-555555555555"


def instance(n: int, gib: int = 40) -> GPU:
    return GPU(
        index=0,
        uuid=f"MIG-0000000{n}-aaaa-bbbb-cccc-dddddddddddd",
        name="NVIDIA A100-SXM4-80GB",
        memory_total=gib * GIB,
        memory_used=0,
        mig_mode=True,
        mig_parent=PARENT,
        mig_class="a100-80g-mig-3g.40gb",
    )


def capacity(*gpus: GPU) -> NodeCapacity:
    base = NodeCapacity(
        id="n1",
        cpu_cores=32,
        memory_total=256 * GIB,
        memory_available=200 * GIB,
        disk_free=500 * GIB,
        engines_installed=frozenset({"llama.cpp"}),
    )
    return replace(base, cards=tuple(Card.of(g, 0) for g in gpus))


def req(**kw: Any) -> Request:
    base = Request(model="m", profile="p", engine="llama.cpp", source="hf:m", memory=4 * GIB)
    return replace(base, **kw)


def test_a_replica_gets_exactly_one_instance() -> None:
    node = capacity(instance(1), instance(2))
    got = place(req(cards=1, card_memory=30 * GIB), [node])
    assert isinstance(got, Placement) and got.cards == (instance(1).uuid,)
    refused = place(req(cards=2, card_memory=10 * GIB), [node])
    assert isinstance(refused, Refusal)
    (verdict,) = explain(req(cards=2, card_memory=10 * GIB), [node])
    assert not verdict.ok
    (reason,) = verdict.reasons
    assert "one MIG instance at most" in reason and "0 have it" in reason


def test_a_mig_card_with_no_instance_is_out_with_the_reason() -> None:
    empty = GPU(
        index=1,
        uuid=PARENT,
        name="NVIDIA A100-SXM4-80GB",
        memory_total=80 * GIB,
        memory_used=0,
        mig_mode=True,
    )
    node = capacity(empty)
    assert node.cards[0].unusable == MIG_EMPTY
    (verdict,) = explain(req(cards=1, card_memory=1 * GIB), [node])
    assert not verdict.ok
    assert f"card 1: {MIG_EMPTY}" in verdict.reasons[0]
    # A whole card beside it is still used.
    whole = GPU(
        index=2,
        uuid="GPU-whole",
        name="NVIDIA A100-SXM4-80GB",
        memory_total=80 * GIB,
        memory_used=0,
        mig_mode=False,
    )
    got = place(req(cards=1, card_memory=1 * GIB), [capacity(empty, whole)])
    assert isinstance(got, Placement) and got.cards == ("GPU-whole",)


def test_instances_reach_placement_from_the_agents_report() -> None:
    view = NodeView(id="n1", cert_serial=1, state=NodeState.READY)
    view.facts = facts(
        cpu_count=8, memory_total=64 * GIB, memory_available=60 * GIB, gpus=[instance(1)]
    )
    cap = NodeCapacity.from_view(view)
    (card,) = cap.cards
    assert (card.mig_instance, card.name, card.memory_free) == (
        True,
        "a100-80g-mig-3g.40gb",
        40 * GIB,
    )


# --- a card class: the catalog refuses more than one MIG instance, placement filters ---


def test_the_catalog_refuses_more_than_one_mig_instance() -> None:
    from llmgw.server.catalog.model import CatalogError, Model, Profile, check_model
    from tests.server.catalog.test_model import LLAMA_8B

    def served(cards: int, card_class: str | None) -> Model:
        # vLLM: llama.cpp takes one card a replica until it can split layers.
        p = Profile(name="default", engine="vllm", cards=cards, card_class=card_class)
        return Model(
            name="m",
            source="hf:meta/Llama-3-8B",
            engine="vllm",
            profiles=(p,),
            context=4096,
        )

    mig = "a100-80g-mig-3g.40gb"
    kept = check_model(served(1, mig), LLAMA_8B)
    assert kept.profiles[0].card_class == mig
    with pytest.raises(CatalogError) as two:
        check_model(served(2, mig), LLAMA_8B)
    assert two.value.field == "profiles.default.card_class"
    assert "a replica gets exactly one" in str(two.value)
    with pytest.raises(CatalogError) as none:
        check_model(served(0, mig), LLAMA_8B)
    assert "needs cards" in str(none.value)
    # Whole cards of one product may be more than one.
    assert check_model(served(2, "NVIDIA H100 80GB HBM3"), LLAMA_8B).profiles[0].cards == 2


def test_placement_takes_only_cards_of_the_class() -> None:
    whole = GPU(
        index=1,
        uuid="GPU-whole",
        name="NVIDIA A100-SXM4-80GB",
        memory_total=80 * GIB,
        memory_used=0,
        mig_mode=False,
    )
    node = capacity(instance(1), whole)
    got = place(req(cards=1, card_memory=1 * GIB, card_class="A100-80G-MIG-3G.40GB"), [node])
    assert isinstance(got, Placement) and got.cards == (instance(1).uuid,)
    got = place(req(cards=1, card_memory=1 * GIB, card_class="NVIDIA A100-SXM4-80GB"), [node])
    assert isinstance(got, Placement) and got.cards == ("GPU-whole",)
    (verdict,) = explain(
        req(cards=1, card_memory=1 * GIB, card_class="h100-80g-mig-1g.10gb"), [node]
    )
    assert not verdict.ok and "of class h100-80g-mig-1g.10gb, 0 have it" in verdict.reasons[0]


def test_a_refusal_for_one_class_does_not_stand_for_another() -> None:
    from llmgw.server.catalog.scheduler import place_many

    node = capacity(instance(1))
    wrong = req(cards=1, card_memory=1 * GIB, card_class="h100-80g-mig-1g.10gb")
    right = req(cards=1, card_memory=1 * GIB, card_class="a100-80g-mig-3g.40gb", model="n")
    first, second = place_many([wrong, right], [node])
    assert isinstance(first, Refusal) and isinstance(second, Placement)
