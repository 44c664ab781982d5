"""The supervisor's judgement of an engine's start-up: a shard given cards must use them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.shard import Shard
from llmgw.agent.supervisor import Supervisor
from llmgw.wire.messages import Compute, GroupSpec, ShardSpec
from llmgw.wire.states import ShardState


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


def _member(engine: str, replica: str, peers: list[str], state: ShardState) -> Shard:
    group = GroupSpec(rank=1, size=2, leader=peers[0], rendezvous_port=41001, peers=peers)
    spec = ShardSpec(
        replica_id=replica,
        engine=engine,
        source="/m",
        port=41002,
        key="k",
        fingerprint="f",
        group=group,
    )
    return Shard(spec=spec, state=state)


def test_only_replicas_meeting_over_nccl_let_their_members_in_to_kernel_picked_ports(
    tmp_path: Path,
) -> None:
    sup = Supervisor(tmp_path, None, None, lambda msg: None)  # type: ignore[arg-type]
    shards = [
        _member("vllm", "a~1", ["10.0.0.1", "10.0.0.2"], ShardState.READY),
        _member("sglang", "b~1", ["10.0.0.3", "10.0.0.1"], ShardState.LOADING),
        # llama.cpp's RPC worker listens on its own port alone.
        _member("llama.cpp", "c~1", ["10.0.0.8", "10.0.0.9"], ShardState.READY),
        _member("vllm", "d~1", ["10.0.0.7"], ShardState.FAILED),
    ]
    sup.shards = {s.spec.replica_id: s for s in shards}
    assert sup.collective_peers() == ("10.0.0.1", "10.0.0.2", "10.0.0.3")
