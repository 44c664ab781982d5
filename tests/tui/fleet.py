"""A recorded admin API for the console: a fixed fleet of 40 nodes with 8 cards each,
made deterministically, with a NotReady node, a warned node and a failed replica, so
the screens that need a fleet run without one."""

from __future__ import annotations

import copy
import time
from typing import Any

from llmgw.client.admin import AdminClient, AdminError
from llmgw.tui.api import ConsoleApi, Snapshot

GiB = 2**30
NODES = 40
CARDS = 8
CARD_MEMORY = 80 * GiB
WARNING = (
    "the NVIDIA driver is older than the engine wants (535 < 550). "
    "Fix: install driver 550 or newer and restart the agent"
)


def utilization(node: int, card: int) -> int:
    """Spread over 0..99 so every shade shows; node 0 idle, node 1 all busy."""
    if node == 0:
        return 0
    if node == 1:
        return 99
    return (node * 37 + card * 11) % 100


def memory_used(node: int, card: int) -> int:
    """Memory runs against work on purpose, so the two modes colour differently."""
    if node == 0:
        return CARD_MEMORY - GiB
    if node == 1:
        return GiB
    return CARD_MEMORY * ((node * 13 + card * 29) % 100) // 100


def node(i: int) -> dict[str, Any]:
    node_id = f"gpu-{i:03d}"
    return {
        "id": node_id,
        "state": "NotReady" if i == 7 else "Ready",
        "reason": "no heartbeat for 45 s" if i == 7 else None,
        "connected": i != 7,
        "address": f"10.0.{i // 250}.{i % 250 + 1}",
        "hostname": node_id,
        "os": "Ubuntu 24.04",
        "cpu_model": "AMD EPYC 9654",
        "cpu_count": 192,
        "cpu_percent": float((i * 17) % 100),
        "memory_total": 1024 * GiB,
        "memory_available": (1024 - (i * 23) % 900) * GiB,
        "disks": [
            {"path": "/", "fstype": "ext4", "total": 500 * GiB, "free": 120 * GiB, "shared": False},
            {
                "path": "/models",
                "fstype": "nfs4",
                "total": 20000 * GiB,
                "free": 8000 * GiB,
                "shared": True,
            },
        ],
        "gpus": [
            {
                "index": c,
                "uuid": f"GPU-{i:03d}-{c}",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total": CARD_MEMORY,
                "memory_used": memory_used(i, c),
                "utilization": utilization(i, c),
                "compute_capability": "9.0",
                "driver": "550.54",
            }
            for c in range(CARDS)
        ],
        "engines": [{"name": "llama.cpp"}, {"name": "vllm"}],
        "warnings": [WARNING] if i == 3 else [],
        "cordoned": i == 5,
        "draining": False,
        "labels": {"rack": f"r{i // 8}"},
        "memory_read_gbs": 400.0,
    }


def replicas() -> list[dict[str, Any]]:
    out = []
    for i in range(0, NODES, 4):
        failed = i == 12
        out.append(
            {
                "replica_id": f"llama-70b-{i // 4}",
                "node": f"gpu-{i:03d}",
                "state": "failed" if failed else "ready",
                "reason": "engine exited with code 1 (CUDA out of memory)" if failed else None,
                "model": "llama-70b",
                "profile": "default",
                "port": 42100 + i,
                "pid": None if failed else 1000 + i,
                "backend": "CUDA",
                "cards": [f"GPU-{i:03d}-{c}" for c in range(4)],
                "download": None,
            }
        )
    return out


def model() -> dict[str, Any]:
    replicas = NODES // 4
    return {
        "name": "llama-70b",
        "source": "hf://meta-llama/Llama-3.3-70B-Instruct",
        "engine": "vllm",
        "state": "degraded",
        "replicas": replicas,
        "desired": replicas,
        "ready": replicas - 1,
        "starting": 0,
        "stale": 0,
        "context": 32768,
        "slots": 8,
        "max_output": 4096,
        "on_demand": False,
        "stopped": False,
        "parked": None,
        "profiles": [
            {
                "name": "default",
                "engine": "vllm",
                "cards": 4,
                "replicas": replicas,
                "status": {"desired": replicas, "ready": replicas - 1, "note": None},
            }
        ],
    }


def snapshot() -> Snapshot:
    nodes = [node(i) for i in range(NODES)]
    return Snapshot(
        at=time.time(),
        status={
            "version": "test",
            "leader": True,
            "serving": "serving",
            "nodes": {"total": NODES, "ready": NODES - 1, "not_ready": 1},
        },
        nodes=nodes,
        models=[model()],
        replicas=replicas(),
        keys=[],
    )


class FleetApi(ConsoleApi):
    """Answers from the recorded fleet; nothing goes on the wire for these paths."""

    def __init__(self, recorded: Snapshot | None = None) -> None:
        # A port nothing listens on: a followed log fails at once and says so.
        super().__init__(AdminClient("http://127.0.0.1:9", "recorded"))
        self.recorded = recorded or snapshot()

    async def snapshot(self) -> Snapshot:
        taken = copy.deepcopy(self.recorded)
        taken.at = time.time()
        return taken

    async def get(self, path: str) -> Any:
        if path == "/api/v1/replicas":
            return copy.deepcopy(self.recorded.replicas)
        if path.startswith("/api/v1/nodes/"):
            node_id = path.removeprefix("/api/v1/nodes/")
            for n in self.recorded.nodes:
                if n["id"] == node_id:
                    return copy.deepcopy(n)
        raise AdminError(f"{self.base_url}{path}: not recorded")
