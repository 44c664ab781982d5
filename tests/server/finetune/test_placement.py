"""Which node trains: a card with the memory free, else the CPU of a node without
cards; nothing else training there; --node pins it; refusals name every node."""

from __future__ import annotations

import pytest

from llmgw.server.finetune.placement import Candidate, Card, choose
from llmgw.server.refusal import Refusal


def node(
    name: str,
    cards: tuple[Card, ...] = (),
    ram: int | None = 64_000,
    ready: bool = True,
    training: str | None = None,
    schedulable: bool = True,
) -> Candidate:
    return Candidate(name, ready, schedulable, training, cards, ram)


def test_a_card_with_the_memory_goes_before_a_cpu_node() -> None:
    got = choose(
        [node("cpu1", ram=500_000), node("gpu1", (Card("GPU-a", 4000), Card("GPU-b", 20000)))],
        8000,
    )
    assert (got.node, got.device, got.cards) == ("gpu1", "cuda", ("GPU-b",))


def test_a_node_with_cards_but_none_free_enough_is_not_trained_on_its_cpu() -> None:
    with pytest.raises(Refusal) as caught:
        choose([node("gpu1", (Card("GPU-a", 4000),), ram=900_000)], 8000)
    assert "gpu1: its freest card has 4,000 MiB free; 8,000 MiB wanted" in caught.value.message
    assert caught.value.status == 409


def test_cpu_where_no_card() -> None:
    got = choose([node("cpu1", ram=16_000)], 8000)
    assert (got.node, got.device, got.cards) == ("cpu1", "cpu", ())


def test_one_fine_tune_a_node_and_unread_figures_are_no_room() -> None:
    with pytest.raises(Refusal) as caught:
        choose(
            [
                node("a", training="ft-000000000001"),
                node("b", ram=None),
                node("c", (Card("GPU-x", None),)),
                node("d", ready=False),
                node("e", schedulable=False),
            ],
            1000,
        )
    said = caught.value.message
    assert "a: already training ft-000000000001" in said
    assert "b: its available memory is not read yet" in said
    assert "c: its cards' free memory is not read yet" in said
    assert "d: not Ready" in said and "e: cordoned or draining" in said


def test_node_pins_the_choice() -> None:
    fleet = [node("big", ram=900_000), node("small", ram=9_000)]
    assert choose(fleet, 8000, pinned="small").node == "small"
    with pytest.raises(Refusal) as caught:
        choose(fleet, 8000, pinned="nope")
    assert caught.value.status == 404 and "no node 'nope'" in caught.value.message
