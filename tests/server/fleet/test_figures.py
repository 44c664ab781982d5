"""A node's figures: what ``plain`` shows is what ``to_map`` would (the admin API's JSON
of every record a node reports), and facts and live figures read together."""

from __future__ import annotations

import pytest

from llmgw.server.fleet.figures import LiveFigures, NodeFigures, plain
from llmgw.wire.hardware import GPU, Disk
from llmgw.wire.messages import Compute, Heartbeat, ShardStatus, to_map
from llmgw.wire.states import ShardState
from tests.support import fleet64
from tests.support.nodefacts import facts


@pytest.mark.parametrize("node", ["nvl-04", "a-01", "b-16"])
def test_plain_is_to_map(node: str) -> None:
    view = fleet64.views()[node]
    live = view.live
    for record in (
        view.facts,
        live.gpus,
        live.gpu_health,
        live.vitals,
        live.ib_ports,
        view.engines,
        ShardStatus("r1", ShardState.READY, compute=Compute("cuda", ["GPU-0"]), cards=["GPU-0"]),
        (Disk("/", "ext4", 1, 0), {"k": [1, 2.5, None]}),
        None,
    ):
        assert plain(record) == to_map(record)


def test_facts_and_live_figures_read_together() -> None:
    card = GPU(index=0, uuid="GPU-0", name="H100", memory_total=80, memory_used=1)
    known = facts(cpu_count=8, memory_total=64, memory_available=60, cpu_percent=1.0, gpus=[card])
    assert NodeFigures.read(None, LiveFigures()) == NodeFigures()
    assert NodeFigures.read(known, LiveFigures()) == NodeFigures(
        cpu_count=8, memory_total=64, memory_available=60, cpu_percent=1.0, gpus=(card,)
    )
    live = LiveFigures()
    live.take(Heartbeat(seq=1, memory_available=7, load=[1.0, 2.0, 3.0], gpus=[], disks=[]))
    read = NodeFigures.read(known, live)
    # A live figure wins, even an empty list; one never sent leaves the fact.
    assert (read.memory_available, read.gpus, read.disks) == (7, (), ())
    assert (read.cpu_percent, read.load, read.memory_read_gbs) == (1.0, (1.0, 2.0, 3.0), None)
