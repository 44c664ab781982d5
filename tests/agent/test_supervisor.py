"""The supervisor's judgement of an engine's start-up: a shard given cards must use them."""

from __future__ import annotations

import pytest

from llmgw.agent.shard import Shard
from llmgw.agent.supervisor import Supervisor
from llmgw.wire.messages import Compute, ShardSpec


def _shard(cards: list[str], compute: Compute | None) -> Shard:
    spec = ShardSpec(
        replica_id="r",
        engine="llama.cpp",
        source="/m.gguf",
        port=1,
        key="k",
        fingerprint="f",
        cards=cards,
    )
    return Shard(spec=spec, compute=compute)


@pytest.mark.parametrize(
    ("cards", "compute", "problem"),
    [
        ([], Compute(backend="CPU"), None),
        ([], None, None),
        (
            ["GPU-1"],
            Compute(backend="CUDA", devices=["CUDA0 (H100)"], offloaded_layers=33, total_layers=33),
            None,
        ),
        (
            ["GPU-1"],
            Compute(backend="CUDA", devices=["CUDA0 (H100)"], offloaded_layers=0, total_layers=33),
            "offloaded no layer",
        ),
        (["GPU-1"], Compute(backend="CPU"), "found no usable GPU"),
    ],
)
def test_cards_given_must_be_used(
    cards: list[str], compute: Compute | None, problem: str | None
) -> None:
    found = Supervisor._compute_problem(_shard(cards, compute))
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
