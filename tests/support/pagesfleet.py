"""A recorded-looking fleet for the admin pages' tests and benchmark: ``n`` nodes as the
registry holds them (facts, live figures, warnings, shards), most with 8 cards, and a
Frame whose templates render them without a server."""

from __future__ import annotations

import random
import time
from dataclasses import replace

from starlette.requests import Request

from llmgw.server.access import Gate
from llmgw.server.fleet.figures import AGED_FIGURES, LiveFigures
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.pages.frame import Frame
from llmgw.server.sessions import Sessions
from llmgw.wire.hardware import GPU, Disk, HostFacts
from llmgw.wire.messages import EngineInfo, ShardStatus
from llmgw.wire.states import NodeState, ShardState

GIB = 2**30


def card(rng: random.Random, index: int, read: bool = True) -> GPU:
    uuid = f"GPU-{rng.getrandbits(64):016x}-{index:04d}"
    known = GPU(index=index, uuid=uuid, name="NVIDIA H100 80GB HBM3", memory_total=80 * GIB)
    if not read:
        return known
    return replace(
        known,
        memory_used=rng.randint(1, 79) * GIB,
        utilization=rng.randint(0, 100),
        sm_active=round(rng.random(), 3),
        temperature=rng.randint(30, 85),
        power=round(rng.uniform(80, 690), 1),
        power_limit=700.0,
    )


def fleet(n: int, seed: int = 1) -> list[NodeView]:
    """``n`` nodes: a tenth CPU-only, one in fifty NotReady, some cordoned or warned."""
    rng = random.Random(seed)
    views = []
    for i in range(n):
        cards = [] if i % 10 == 9 else [card(rng, c, read=i % 97 != 5) for c in range(8)]
        facts = HostFacts(
            hostname=f"gpu{i:05d}.example",
            os="Debian GNU/Linux 12 (bookworm)",
            arch="x86_64",
            cpu_count=192,
            memory_total=2048 * GIB,
            gpus=cards,
            disks=[Disk(path="/", fstype="ext4", total=4000 * GIB, free=900 * GIB)],
        )
        # Every figure read just now: live, as a heartbeat's are.
        live = LiveFigures(
            cpu_percent=round(rng.uniform(1, 95), 1),
            read_at=dict.fromkeys(AGED_FIGURES, time.time()),
        )
        live.memory_available = rng.randint(100, 2000) * GIB
        if i % 13 == 0:
            live.health_warnings = [
                f"pcie: card 3 runs at x8 Gen4: 15.8 GB/s of 31.5. Fix: reseat card 3 on gpu{i}"
            ]
        view = NodeView(
            id=f"gpu{i:05d}",
            cert_serial=i,
            state=NodeState.NOT_READY if i % 50 == 7 else NodeState.READY,
            facts=facts,
            live=live,
            last_seen=1.7e9,
            cordoned=i % 40 == 3,
            labels={"rack": f"r{i // 40}", "role": "inference"},
        )
        view.engines = [EngineInfo("llama.cpp", "/x"), EngineInfo("vllm", "/x")]
        view.engines_probed = True
        if cards:
            replica = f"m{i % 7}.default.{i:06x}"
            view.shards[replica] = ShardStatus(
                replica_id=replica, state=ShardState.READY, source="hf:org/model", port=41000
            )
        views.append(view)
    return views


def frame() -> Frame:
    gate = Gate(lambda token: False, lambda: None, Sessions(b"s" * 32, lambda: ["h"]))
    return Frame(gate, lambda: None)


def request(path: str = "/admin/nodes") -> Request:
    return Request(
        {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b""}
    )
