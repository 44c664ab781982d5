"""The fleet's NVLink domains from what the agents send: racks of trays, who joined, IMEX,
problems with their fix, the cards left out, and the two metrics."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from llmgw.server.api.nvlink import routes
from llmgw.server.api.routing import Call
from llmgw.server.fleet.exposition import fleet_metrics
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.nvlink import ZERO_UUID, card_joined, domains
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.store import SQLiteStore
from llmgw.wire import GPU, Heartbeat, HostFacts, Register
from llmgw.wire.framing import FrameDecoder
from llmgw.wire.hardware import GpuHealth, NodeVitals
from llmgw.wire.messages import decode_message, encode_message
from tests.support import wiring
from tests.support.wiring import ADMIN

CLUSTER = "7e3c0a52-18f4-4d2b-b6a9-3f0d8c21e945"
OTHER = "c41d9e07-5a2b-4f3c-8e61-0b7a2d9f13c8"
TRAYS = [f"gb-tray-{n:02d}" for n in range(1, 19)]


class FakeSession:
    def close(self, reason: str) -> None:
        pass

    async def send(self, msg: Any) -> None:
        pass


def card(node: str, i: int, **fabric: Any) -> GpuHealth:
    joined = {
        "fabric_state": "Completed",
        "fabric_status": "Success",
        "fabric_cluster_uuid": CLUSTER,
        "fabric_clique_id": 1,
        "fabric_health": {"summary": "Healthy", "bandwidth": "Full"},
    }
    return GpuHealth(uuid=f"GPU-{node}-{i}", index=i, **{**joined, **fabric})


def bare(node: str, i: int) -> GpuHealth:
    return GpuHealth(uuid=f"GPU-{node}-{i}", index=i, ecc_mode=True)


def gb200_tray(node: str) -> tuple[list[GpuHealth], NodeVitals]:
    cards = [card(node, i) for i in range(4)]
    imex = NodeVitals(imex_running=True, imex_channels=1)
    if node == "gb-tray-04":  # its last card never joined: no ids
        cards[3] = card(
            node,
            3,
            fabric_state="Not Started",
            fabric_status=None,
            fabric_cluster_uuid=None,
            fabric_clique_id=None,
            fabric_health=None,
        )
    if node == "gb-tray-07":  # one card failed to join its domain
        cards[2] = card(
            node,
            2,
            fabric_status="Failure",
            fabric_health={"summary": "Unhealthy", "bandwidth": "Degraded"},
        )
    if node == "gb-tray-09":  # joined, but its routes are degraded
        cards[0] = card(node, 0, fabric_health={"summary": "Limited Capacity"})
    if node == "gb-tray-11":
        imex = NodeVitals(imex_running=False, imex_channels=1)
    return cards, imex


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    yield store
    await store.close()


async def record(
    store: SQLiteStore, fleet: dict[str, tuple[list[GpuHealth], NodeVitals | None]]
) -> NodeRegistry:
    """The fleet through the registry, each heartbeat as a frame on the wire."""
    reg = wiring.registry(store)
    for n, (node, (health, vitals)) in enumerate(sorted(fleet.items())):
        await reg.enrolled(node, n + 1)
        gpus = [GPU(index=h.index, uuid=h.uuid, name="NVIDIA GB200") for h in health]
        host = HostFacts(hostname=node, os="linux", arch="aarch64", gpus=gpus)
        await reg.register(Register(node_id=node, version="0.1", host=host), FakeSession())
        beat = Heartbeat(seq=1, gpu_health=health, vitals=vitals)
        (payload,) = FrameDecoder().feed(encode_message(beat))
        msg = decode_message(payload)
        assert isinstance(msg, Heartbeat)
        reg.heartbeat(node, msg)
    return reg


def nvl72() -> dict[str, tuple[list[GpuHealth], NodeVitals | None]]:
    fleet: dict[str, tuple[list[GpuHealth], NodeVitals | None]] = {
        node: gb200_tray(node) for node in TRAYS
    }
    # A PCIe workstation: its cards' fabric is N/A, so nothing of it was sent.
    fleet["ws-a5000"] = ([bare("ws-a5000", 0), bare("ws-a5000", 1)], None)
    # An HGX H100: its own NVSwitch fabric, all-zero ClusterUUID, clique 0.
    fleet["hgx-h100"] = (
        [card("hgx-h100", i, fabric_cluster_uuid=ZERO_UUID, fabric_clique_id=0) for i in range(8)],
        NodeVitals(cpu_power={"package0": 210.0}),
    )
    return fleet


async def test_an_nvl72_rack_of_18_trays(store: SQLiteStore) -> None:
    reg = await record(store, nvl72())
    found = domains(reg.nodes.values())
    (rack,) = found["domains"]
    assert rack["id"] == f"{CLUSTER}/1"
    assert (rack["cluster_uuid"], rack["clique_id"]) == (CLUSTER, 1)
    assert [t["node"] for t in rack["trays"]] == TRAYS  # no workstation, no HGX
    assert (rack["nodes"], rack["cards"], rack["joined"]) == (18, 72, 70)
    tray = rack["trays"][0]
    assert tray["connected"] is True
    assert tray["imex"] == {"running": True, "channels": 1}
    assert tray["cards"][0] == {
        "index": 0,
        "uuid": "GPU-gb-tray-01-0",
        "state": "Completed",
        "status": "Success",
        "joined": True,
        "health": {"summary": "Healthy", "bandwidth": "Full"},
    }
    t4 = rack["trays"][3]
    assert [(c["index"], c["joined"]) for c in t4["cards"]] == [
        (0, True),
        (1, True),
        (2, True),
        (3, False),  # no ids, drawn in its node's tray all the same
    ]
    t7 = rack["trays"][6]
    assert [c["joined"] for c in t7["cards"]] == [True, True, False, True]
    assert t7["cards"][2]["status"] == "Failure"
    assert rack["trays"][10]["imex"] == {"running": False, "channels": 1}

    problems = rack["problems"]
    assert len(problems) == 4, problems
    assert problems[0].startswith(
        f"gb-tray-04 card 3 has not joined NVLink domain {CLUSTER}/1 (fabric state Not "
        "Started, no ClusterUUID/CliqueId). Fix: "
    )
    assert problems[1].startswith(
        f"gb-tray-07 card 2 has not joined NVLink domain {CLUSTER}/1 (fabric state "
        "Completed, status Failure). Fix: read the card's Fabric block (`nvidia-smi -q -i 2`)"
    )
    assert problems[2].startswith(
        "fabric health is not Healthy on gb-tray-09 card 0 (Limited Capacity)"
    )
    assert problems[3].startswith("IMEX is not running on gb-tray-11, in a domain of 18 nodes")
    assert "systemctl enable --now nvidia-imex" in problems[3]
    assert all(". Fix: " in p for p in problems)

    assert found["unjoined"] == [
        {
            "node": "gb-tray-04",
            "index": 3,
            "uuid": "GPU-gb-tray-04-3",
            "state": "Not Started",
            "status": None,
            "joined": False,
            "health": None,
        }
    ]


async def test_the_route_answers_the_same(store: SQLiteStore) -> None:
    reg = await record(store, nvl72())
    (op,) = routes(reg)
    assert (op.method, op.path, op.needs) == ("GET", "/api/v1/nvlink", "viewer")
    asked = Call(request=cast(Any, None), principal=ADMIN, params={}, body=None, query=None)
    answer = await op.handler(asked)
    assert answer == domains(reg.nodes.values())
    assert set(answer) == set(op.answer["required"])


async def test_metrics_joined_and_imex_up(store: SQLiteStore) -> None:
    reg = await record(store, nvl72())
    text = "\n".join(fleet_metrics(reg.nodes.values()))
    joined = {
        (node, int(gpu)): int(value)
        for node, gpu, value in re.findall(
            r'^llmgw_gpu_nvlink_joined\{node="([^"]+)",gpu="(\d)".*\} (\d)$', text, re.M
        )
    }
    assert len(joined) == 72  # the rack's cards only: none for the PCIe or HGX ones
    assert joined[("gb-tray-07", 2)] == 0 and joined[("gb-tray-04", 3)] == 0
    assert sum(joined.values()) == 70
    imex = dict(re.findall(r'^llmgw_imex_up\{node="([^"]+)"\} (\d)$', text, re.M))
    assert set(imex) == set(TRAYS)  # absent where not read
    assert imex["gb-tray-11"] == "0" and imex["gb-tray-01"] == "1"
    assert "# TYPE llmgw_gpu_nvlink_joined gauge" in text
    assert "# TYPE llmgw_imex_up gauge" in text


async def test_a_tray_in_two_cliques_and_imex_not_seen(store: SQLiteStore) -> None:
    fleet: dict[str, tuple[list[GpuHealth], NodeVitals | None]] = {
        "a": ([card("a", 0), card("a", 1, fabric_cluster_uuid=OTHER, fabric_clique_id=4)], None),
        "b": ([card("b", 0), card("b", 1)], NodeVitals(imex_running=True, imex_channels=0)),
    }
    found = domains((await record(store, fleet)).nodes.values())
    first, second = found["domains"]
    assert (first["id"], second["id"]) == (f"{CLUSTER}/1", f"{OTHER}/4")
    assert [t["node"] for t in first["trays"]] == ["a", "b"]
    assert [t["node"] for t in second["trays"]] == ["a"]
    split = f"a's cards are in 2 NVLink cliques ({CLUSTER}/1, {OTHER}/4)"
    assert any(p.startswith(split) for p in first["problems"])
    assert any(p.startswith(split) for p in second["problems"])
    # Two nodes in the first domain: a's IMEX was never seen; one node in the second: fine.
    assert any(p.startswith("no IMEX was seen on a, in a domain of 2") for p in first["problems"])
    assert not any("IMEX" in p for p in second["problems"])
    assert found["unjoined"] == []


def test_card_joined() -> None:
    def h(**f: Any) -> GpuHealth:
        return GpuHealth(uuid="GPU-x", index=0, **f)

    ok = {"fabric_state": "Completed", "fabric_status": "Success", "fabric_clique_id": 1}
    assert card_joined(h()) is None  # not read
    assert card_joined(h(**ok, fabric_cluster_uuid=CLUSTER)) is True
    assert card_joined(h(**ok, fabric_cluster_uuid=ZERO_UUID)) is None  # HGX: nothing to join
    assert (
        card_joined(h(**{**ok, "fabric_status": "Failure"}, fabric_cluster_uuid=ZERO_UUID)) is False
    )
    assert card_joined(h(fabric_state="In Progress")) is False
    assert card_joined(h(**{**ok, "fabric_clique_id": None}, fabric_cluster_uuid=CLUSTER)) is False


def test_a_node_not_connected_is_drawn_as_such() -> None:
    view = NodeView(id="gb-tray-01", cert_serial=1)
    view.live.gpu_health = [
        GpuHealth(
            uuid="GPU-1",
            index=0,
            fabric_state="Completed",
            fabric_status="Success",
            fabric_cluster_uuid=CLUSTER,
            fabric_clique_id=1,
        )
    ]
    (rack,) = domains([view])["domains"]
    (tray,) = rack["trays"]
    assert tray["connected"] is False and tray["imex"] == {"running": None, "channels": None}
    assert rack["problems"] == []  # a one-tray domain needs no IMEX
