"""A recorded admin API for the console: a fixed fleet of 40 nodes with 8 cards each,
made deterministically, with a NotReady node, a warned node and a failed replica, so
the screens that need a fleet run without one. Its fabrics: one InfiniBand fabric with a
port stuck in INIT and no map, one whose map (our own ibnetdiscover fixture, read by the
control plane's own code) has a degraded cable and an adapter off its rail, a RoCE
network and a port of no fabric; its NVLink: one NVL72-like domain of 18 trays of 4
cards, one card not joined and one tray with IMEX down, and a card of no domain."""

from __future__ import annotations

import copy
import json
import re
import time
import urllib.error
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote

from llmgw.client.admin import AdminClient
from llmgw.client.adminbase import AdminError
from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.ibtopology import parse_ibnetdiscover
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


# --- fabrics and NVLink ------------------------------------------------------------

IB_MAP = (
    Path(__file__).resolve().parents[1] / "fixtures" / "infiniband"
) / "ibnetdiscover_2tier-rails_HDR_own.txt"
# Fabric A: its SM on a host, a standby beside it; no node can read its map.
FABRIC_A = "0x0002c90300a10001"
FABRIC_A_STANDBY = "0x0002c90300a10002"
FABRIC_A_NO_MAP = "no node of this fabric has ibnetdiscover (infiniband-diags)"
# Fabric B: its SM on spine-1 of the fixture's map.
FABRIC_B = "0x0c42a10300aa0001"
MAP_READ_AT = 1_700_000_000.0
MAP_AGE = 120.0
NVLINK_CLUSTER = "5f3c6a2e-8b1d-4e7a-9c0f-2d4b6e8a1c3e"
NVLINK_DOMAIN = f"{NVLINK_CLUSTER}/32766"
NOT_JOINED = ("gpu-025", 2)
IMEX_DOWN = "gpu-030"


def ib_port(
    node: str, device: str, master: str | None, state: str = "ACTIVE", rate: float = 200.0
) -> dict[str, Any]:
    return {
        "node": node,
        "device": device,
        "port": 1,
        "state": state,
        "phys_state": "LinkUp" if state == "ACTIVE" else "Polling",
        "rate_gbps": rate if state == "ACTIVE" else None,
        "width_speed": "4xHDR" if rate == 200.0 else "2xHDR",
        "port_guid": f"0x1070fd03{int(node[-3:]):04x}{int(device[-1]):04x}",
        "master_sm_guid": master,
    }


def fabric_map() -> dict[str, Any]:
    """Fabric B's map as ``GET /api/v1/fabrics/{id}/topology`` answers it: the fixture's
    hosts gpu-01..06 renamed gpu-011..016, parsed and shaped by the control plane's own
    code, through JSON."""
    text = re.sub(r"gpu-0(\d)", r"gpu-01\1", IB_MAP.read_text())
    maps = FabricMaps(cast(Any, None), cast(Any, None), clock=lambda: MAP_READ_AT + MAP_AGE)
    maps.maps[FABRIC_B] = (MAP_READ_AT, "gpu-011", parse_ibnetdiscover(text))
    shown = maps.topology(FABRIC_B)
    assert shown is not None
    answer: dict[str, Any] = json.loads(json.dumps(shown))
    return answer


def fabrics() -> dict[str, Any]:
    """``GET /api/v1/fabrics``: fabric A with gpu-003's second port stuck in INIT, fabric
    B with its map's problems; a RoCE network, and a port whose master was not read."""
    a_ports = [
        ib_port(f"gpu-{i:03d}", f"mlx5_{d}", FABRIC_A, "INIT" if (i, d) == (3, 1) else "ACTIVE")
        for i in range(8)
        for d in range(2)
    ]
    b_ports = [
        ib_port(f"gpu-{i:03d}", f"mlx5_{d}", FABRIC_B, rate=100.0 if (i, d) == (12, 1) else 200.0)
        for i in range(11, 17)
        for d in range(2)
    ]
    roce = [{**ib_port(f"gpu-{i:03d}", "mlx5_2", None), "width_speed": None} for i in (20, 21)]
    return {
        "fabrics": [
            {
                "id": FABRIC_A,
                "master_sm": FABRIC_A,
                "masters": [FABRIC_A],
                "subnet_managers": [FABRIC_A, FABRIC_A_STANDBY],
                "nodes": [f"gpu-{i:03d}" for i in range(8)],
                "ports": a_ports,
                "ports_by_state": {"ACTIVE": 15, "INIT": 1},
                "active_rates_gbps": {"200": 15},
                "problems": [
                    "1 port(s) in INIT or ARMED (gpu-003 mlx5_1/1): the subnet manager has "
                    "not brought them up. Fix: check the SM (`sminfo`, its log) and that it "
                    "runs with these ports' partition",
                    FABRIC_A_NO_MAP,
                ],
                "topology_read_at": None,
            },
            {
                "id": FABRIC_B,
                "master_sm": FABRIC_B,
                "masters": [FABRIC_B],
                "subnet_managers": [FABRIC_B],
                "nodes": [f"gpu-{i:03d}" for i in range(11, 17)],
                "ports": b_ports,
                "ports_by_state": {"ACTIVE": 12},
                "active_rates_gbps": {"100": 1, "200": 11},
                "problems": fabric_map()["problems"],
                "topology_read_at": MAP_READ_AT,
            },
        ],
        "roce_networks": [
            {"network": "10.200.0.0/16", "nodes": ["gpu-020", "gpu-021"], "ports": roce}
        ],
        "unassigned_ports": [ib_port("gpu-030", "mlx5_0", None)],
    }


def nvlink() -> dict[str, Any]:
    """``GET /api/v1/nvlink`` (``server/fleet/nvlink.py``'s shape and words): one domain
    of 18 trays (gpu-020..037) of 4 cards, gpu-025's card 2 not joined, gpu-030's IMEX
    down; gpu-038's card with a fabric but no domain."""
    trays = []
    for i in range(20, 38):
        node_id = f"gpu-{i:03d}"
        cards = []
        for c in range(4):
            joined = (node_id, c) != NOT_JOINED
            cards.append(
                {
                    "index": c,
                    "uuid": f"GPU-{i:03d}-{c}",
                    "state": "Completed" if joined else "In Progress",
                    "status": "Success" if joined else "N/A",
                    "joined": joined,
                    "health": {"summary": "Healthy", "bandwidth": "Full"},
                }
            )
        trays.append(
            {
                "node": node_id,
                "connected": True,
                "cards": cards,
                "imex": {"running": node_id != IMEX_DOWN, "channels": 1},
            }
        )
    return {
        "domains": [
            {
                "id": NVLINK_DOMAIN,
                "cluster_uuid": NVLINK_CLUSTER,
                "clique_id": 32766,
                "nodes": 18,
                "cards": 72,
                "joined": 71,
                "trays": trays,
                "problems": [
                    f"gpu-025 card 2 has not joined NVLink domain {NVLINK_DOMAIN} (fabric state "
                    "In Progress, status N/A). Fix: read the card's Fabric block (`nvidia-smi "
                    "-q -i 2`); check the NVLink switch trays' fabric manager (NMX) for this "
                    "tray and its partition, then reset the card (`nvidia-smi -r -i 2`) or "
                    "reboot the tray",
                    f"IMEX is not running on {IMEX_DOWN}, in a domain of 18 nodes: jobs spanning "
                    "trays cannot share memory over NVLink there. Fix: start it (`systemctl "
                    "enable --now nvidia-imex`) and list every tray of the domain in "
                    "/etc/nvidia-imex/nodes_config.cfg; its log is /var/log/nvidia-imex.log",
                ],
            }
        ],
        "unjoined": [
            {
                "node": "gpu-038",
                "index": 0,
                "uuid": "GPU-038-0",
                "state": "Not Started",
                "status": "N/A",
                "joined": False,
                "health": None,
            }
        ],
    }


def not_found(url: str, message: str) -> AdminError:
    """What ``AdminClient`` raises on a 404 with the control plane's message."""
    cause = urllib.error.HTTPError(url, 404, "Not Found", cast(Any, None), None)
    error = AdminError(f"{url}: {message}")
    error.__cause__ = cause
    return error


class FleetApi(ConsoleApi):
    """Answers from the recorded fleet; nothing goes on the wire for these paths."""

    def __init__(self, recorded: Snapshot | None = None) -> None:
        # A port nothing listens on: a followed log fails at once and says so.
        super().__init__(AdminClient("http://127.0.0.1:9", "recorded"))
        self.recorded = recorded or snapshot()
        self.recorded_fabrics = fabrics()
        self.fabric_maps = {FABRIC_B: fabric_map()}
        self.recorded_nvlink = nvlink()
        self.gets: list[str] = []

    async def snapshot(self) -> Snapshot:
        taken = copy.deepcopy(self.recorded)
        taken.at = time.time()
        return taken

    async def get(self, path: str) -> Any:
        self.gets.append(path)
        if path == "/api/v1/replicas":
            return copy.deepcopy(self.recorded.replicas)
        if path == "/api/v1/fabrics":
            return copy.deepcopy(self.recorded_fabrics)
        if path.startswith("/api/v1/fabrics/") and path.endswith("/topology"):
            fabric_id = unquote(path.removeprefix("/api/v1/fabrics/").removesuffix("/topology"))
            if fabric_id in self.fabric_maps:
                return copy.deepcopy(self.fabric_maps[fabric_id])
            why = FABRIC_A_NO_MAP if fabric_id == FABRIC_A else "no map of it has been read yet"
            raise not_found(self.base_url + path, f"fabric {fabric_id!r}: {why}")
        if path == "/api/v1/nvlink":
            return copy.deepcopy(self.recorded_nvlink)
        if path.startswith("/api/v1/nodes/"):
            node_id = path.removeprefix("/api/v1/nodes/")
            for n in self.recorded.nodes:
                if n["id"] == node_id:
                    return copy.deepcopy(n)
        raise AdminError(f"{self.base_url}{path}: not recorded")
