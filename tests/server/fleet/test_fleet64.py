"""The recorded 64-node fleet (``tests/support/fleet64.py``) through the control plane's
own code: FabricWatch finds its two InfiniBand fabrics with their SMs and the port
stuck in INIT; each fabric's ibnetdiscover map gives spine and leaf tiers, the hosts
under each leaf set and the degraded cable; the NVLink view gives one NVL72 domain of
18 trays of 4 cards with IMEX up; and the API routes answer the same."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest

from llmgw.server.api import fabrics as fabrics_api
from llmgw.server.api import nvlink as nvlink_api
from llmgw.server.api.routing import Call
from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.fabrics import FabricWatch, fabric_metrics
from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.fleet.ibtopology import hops, hosts, rails, same_leaf
from llmgw.server.fleet.nvlink import domains
from llmgw.server.refusal import Refusal
from llmgw.wire.fabricwords import switch_name
from llmgw.wire.states import NodeState
from tests.support import fleet64
from tests.support.fleet64 import (
    A_NODES,
    A_SU1,
    A_SU2,
    B_NODES,
    CLUSTER_UUID,
    FABRIC_A,
    FABRIC_A_STANDBY,
    FABRIC_B,
    FABRIC_B_STANDBY,
    MAP_AGE,
    MAP_READ_AT,
    NVLINK_DOMAIN,
    TRAYS,
    AgentSession,
)
from tests.support.wiring import ADMIN

MiB = 2**20


def handler(ops: list[Any], path: str) -> Any:
    return next(op.handler for op in ops if op.method == "GET" and op.path == path)


def call(**params: str) -> Call[None, None]:
    return Call(request=cast(Any, None), principal=ADMIN, params=params, body=None, query=None)


# --- the nodes ------------------------------------------------------------------------


def test_64_connected_ready_nodes_with_facts_and_live_figures() -> None:
    views = fleet64.views()
    assert list(views) == sorted(views) and len(views) == 64
    assert set(views) == set(TRAYS) | set(A_NODES) | set(B_NODES)
    assert (len(TRAYS), len(A_SU1), len(A_SU2), len(B_NODES)) == (18, 16, 14, 16)
    assert all(v.state == NodeState.READY and v.session is not None for v in views.values())

    tray = views["nvl-01"].figures()
    assert (tray.cpu_count, tray.memory_total) == (144, 884 * 2**30)
    assert [(g.index, g.name, g.memory_total) for g in tray.gpus] == [
        (i, "NVIDIA GB200", 189471 * MiB) for i in range(4)
    ]
    h100 = views["b-16"].figures()
    assert (h100.cpu_count, h100.memory_total) == (224, 2 * 2**40)
    assert [(g.name, g.memory_total) for g in h100.gpus] == [
        ("NVIDIA H100 80GB HBM3", 81559 * MiB)
    ] * 8
    assert h100.disks is not None and [d.path for d in h100.disks] == ["/", "/models"]
    uuids = [g.uuid for v in views.values() for g in v.figures().gpus]
    assert len(uuids) == len(set(uuids)) == 18 * 4 + 46 * 8
    assert all(u.startswith("GPU-") for u in uuids)
    # The facts' cards and the heartbeat's are the same cards.
    a01 = views["a-01"]
    assert a01.facts is not None and a01.live.gpus is not None
    assert [g.uuid for g in a01.facts.gpus] == [g.uuid for g in a01.live.gpus]
    assert views["a-01"].features == ["heartbeat.v1", "ibnetdiscover", "ib_write_bw"]
    assert views["nvl-01"].features == ["heartbeat.v1"]
    assert views["a-01"].engine_names() == {"vllm"}
    # The trays have no InfiniBand: an empty list, as the agent sends it.
    assert views["nvl-07"].live.ib_ports == []
    assert len(views["a-30"].live.ib_ports or ()) == 8


def test_the_same_fleet_every_time() -> None:
    one, two = fleet64.views(), fleet64.views()
    assert {n: (v.facts, v.live.ib_ports, v.live.gpu_health) for n, v in one.items()} == {
        n: (v.facts, v.live.ib_ports, v.live.gpu_health) for n, v in two.items()
    }


# --- fabrics --------------------------------------------------------------------------


def test_two_fabrics_their_nodes_sms_and_the_port_in_init() -> None:
    found = FabricWatch(fleet64.clock).fabrics(fleet64.views().values())
    a, b = found["fabrics"]
    assert (a["id"], a["master_sm"], a["masters"], a["subnet_managers"]) == (
        FABRIC_A,
        FABRIC_A,
        [FABRIC_A],
        [FABRIC_A],
    )
    assert (b["id"], b["master_sm"], b["subnet_managers"]) == (FABRIC_B, FABRIC_B, [FABRIC_B])
    assert a["nodes"] == list(A_NODES) and b["nodes"] == list(B_NODES)
    assert len(a["ports"]) == 30 * 8 and len(b["ports"]) == 16 * 8
    assert a["ports_by_state"] == {"ACTIVE": 239, "INIT": 1}
    # The degraded cable's port reports what it trained at.
    assert a["active_rates_gbps"] == {"200": 1, "400": 238}
    (slow,) = [p for p in a["ports"] if p["rate_gbps"] == 200.0]
    assert (slow["node"], slow["device"], slow["width_speed"]) == ("a-07", "mlx5_3", "4X HDR")
    assert b["ports_by_state"] == {"ACTIVE": 128} and b["active_rates_gbps"] == {"400": 128}
    (problem,) = a["problems"]
    assert problem.startswith("1 port(s) in INIT or ARMED (a-23 mlx5_5/1): the subnet manager")
    assert "Fix: check the SM (`sminfo`, its log)" in problem
    assert b["problems"] == []
    assert found["roce_networks"] == [] and found["unassigned_ports"] == []
    port = next(p for p in a["ports"] if (p["node"], p["device"]) == ("a-01", "mlx5_0"))
    assert port == {
        "node": "a-01",
        "device": "mlx5_0",
        "port": 1,
        "state": "ACTIVE",
        "phys_state": "LinkUp",
        "rate_gbps": 400.0,
        "width_speed": "4X NDR",
        "port_guid": fleet64.hca_guid("a-01", 0),
        "master_sm_guid": FABRIC_A,
    }

    text = "\n".join(fabric_metrics(found))
    assert f'llmgw_fabric_problems{{fabric="{FABRIC_A}"}} 1' in text
    assert f'llmgw_fabric_problems{{fabric="{FABRIC_B}"}} 0' in text


def test_without_problems_every_port_is_active_at_400() -> None:
    found = FabricWatch(fleet64.clock).fabrics(fleet64.views(problems=False).values())
    a, b = found["fabrics"]
    assert a["ports_by_state"] == {"ACTIVE": 240} and a["active_rates_gbps"] == {"400": 240}
    assert a["problems"] == b["problems"] == []


def test_each_fabrics_map_has_spines_over_rail_leaves_and_the_degraded_cable() -> None:
    maps = fleet64.topologies()
    assert list(maps) == [FABRIC_A, FABRIC_B]
    a, b = maps[FABRIC_A], maps[FABRIC_B]

    def tier_names(top: Any, tier: str) -> list[str]:
        return sorted(switch_name({"description": top.nodes[g].description})
                      for g, t in top.tiers.items() if t == tier)  # fmt: skip

    assert Counter(a.tiers.values()) == {"spine": 4, "leaf": 16}
    assert tier_names(a, "spine") == [f"a-spine-{k}" for k in range(1, 5)]
    assert tier_names(a, "leaf") == sorted(f"a-su{su}-rail{r}" for su in (1, 2) for r in range(8))
    assert Counter(b.tiers.values()) == {"spine": 2, "leaf": 8}
    assert tier_names(b, "leaf") == [f"b-su1-rail{r}" for r in range(8)]
    assert Counter(n.kind for n in a.nodes.values()) == {"switch": 20, "ca": 240}
    # 240 adapters, and two cables from each of 16 leaves to each of 4 spines.
    assert len(a.links) == 240 + 16 * 8 and len(b.links) == 128 + 8 * 8

    # Hosts map to node ids; each host's adapters are on its SU's leaves, in rail order.
    by_host = hosts(a)
    assert sorted(by_host) == list(A_NODES)
    leaf_guid = {s.name: s.guid for s in fleet64.switches("a")}
    for host in A_NODES:
        su = 1 if host in A_SU1 else 2
        port = A_SU1.index(host) + 1 if su == 1 else A_SU2.index(host) + 1
        assert by_host[host] == [(leaf_guid[f"a-su{su}-rail{r}"], port) for r in range(8)]
    assert sorted(hosts(b)) == list(B_NODES)
    assert rails(a) == {} and rails(b) == {}
    # One leaf versus across the spine.
    assert same_leaf(a, "a-01", "a-16") and same_leaf(a, "a-17", "a-30")
    assert not same_leaf(a, "a-16", "a-17") and hops(a, "a-01", "a-30") == 2
    assert same_leaf(b, "b-01", "b-16")
    assert hops(a, "a-01", "b-01") is None  # two fabrics: no path

    (bad,) = [link for link in a.links if link.degraded]
    ends = {a.nodes[bad.a[0]].description, a.nodes[bad.b[0]].description}
    assert ends == {"MF0;a-su1-rail3:MQM9700/U1", "a-07 mlx5_3"}
    assert (bad.width, bad.speed, bad.rate_gbps) == ("4x", "HDR", 200.0)
    assert bad.degraded == "trained at HDR, below the NDR of both ends"
    assert a.problems == [
        "degraded cable 'MF0;a-su1-rail3:MQM9700/U1' 0xb0cf0e0300a10103 port 7 - "
        "'a-07 mlx5_3' 0x946dae0300a00703 port 1: 4x HDR (200 Gb/s), trained at HDR, "
        "below the NDR of both ends"
    ]
    assert b.problems == []
    assert {(link.width, link.speed) for link in b.links} == {("4x", "NDR")}
    assert fleet64.topologies(problems=False)[FABRIC_A].problems == []


def test_the_generated_copies_are_current() -> None:
    for path, text in fleet64.fixture_files().items():
        assert path.read_text() == text, f"{path.name}: run fleet64.write_fixtures()"


def test_an_unknown_fabric_is_refused() -> None:
    with pytest.raises(ValueError, match="fabrics 'a' and 'b'"):
        fleet64.ibnetdiscover_text("c")


# --- the maps as the control plane reads them -------------------------------------------


async def test_a_pass_of_fabric_maps_asks_a_01_and_b_01_and_keeps_the_same_maps() -> None:
    registry = fleet64.registry()
    maps = FabricMaps(registry, FabricWatch(fleet64.clock), clock=lambda: MAP_READ_AT)
    await maps.poll()
    assert maps.errors == {}
    recorded = fleet64.fabric_maps(registry)
    assert {f: (at, by) for f, (at, by, _) in maps.maps.items()} == {
        FABRIC_A: (MAP_READ_AT, "a-01"),
        FABRIC_B: (MAP_READ_AT, "b-01"),
    }
    assert {f: (at, by) for f, (at, by, _) in recorded.maps.items()} == {
        f: (at, by) for f, (at, by, _) in maps.maps.items()
    }
    for fid, (_, _, topology) in maps.maps.items():
        assert topology == recorded.maps[fid][2]
    assert maps.managers == recorded.managers
    asked = {n: cast(AgentSession, v.session).asked for n, v in registry.nodes.items() if v.session}
    assert asked["a-01"] == [("fabric.discover", {"device": "mlx5_0", "port": 1})]
    assert asked["b-01"] == [("fabric.discover", {"device": "mlx5_0", "port": 1})]
    assert sum(1 for a in asked.values() if a) == 2


async def test_the_fabrics_api_shows_both_fabrics_their_sms_maps_and_problems() -> None:
    maps = fleet64.fabric_maps()
    ops = fabrics_api.routes(FabricService(maps.watch, maps, maps.registry))
    found = await handler(ops, "/api/v1/fabrics")(call())
    a, b = found["fabrics"]
    assert (a["id"], b["id"]) == (FABRIC_A, FABRIC_B)
    assert a["subnet_managers"] == [FABRIC_A, FABRIC_A_STANDBY]
    assert [(r["guid"], r["state"]) for r in a["subnet_manager_records"]] == [
        (FABRIC_A, "MASTER"),
        (FABRIC_A_STANDBY, "STANDBY"),
    ]
    assert a["topology_read_at"] == b["topology_read_at"] == MAP_READ_AT
    assert [p.split(":")[0] for p in a["problems"]] == [
        "1 port(s) in INIT or ARMED (a-23 mlx5_5/1)",
        "degraded cable 'MF0;a-su1-rail3",
    ]
    (no_standby,) = b["problems"]
    assert no_standby.startswith("no standby subnet manager (1 SM(s) known to the fabric")
    assert b["subnet_managers"] == [FABRIC_B]

    topology = handler(ops, "/api/v1/fabrics/{fabric_id}/topology")
    shown = await topology(call(fabric_id=FABRIC_A))
    assert (shown["fabric"], shown["read_by"], shown["read_at"]) == (FABRIC_A, "a-01", MAP_READ_AT)
    assert shown["age_seconds"] == MAP_AGE and shown["error"] is None
    assert Counter(shown["tiers"].values()) == {"spine": 4, "leaf": 16}
    assert shown["rail_misses"] == []
    assert [link["b"][0] for link in shown["links"] if link["degraded"]] == [
        fleet64.hca_guid("a-07", 3)
    ]
    assert len(shown["nodes"]) == 260
    shown_b = await topology(call(fabric_id=FABRIC_B))
    assert shown_b["read_by"] == "b-01" and shown_b["problems"] == []
    with pytest.raises(Refusal) as refused:
        await topology(call(fabric_id="0x0000000000000001"))
    assert refused.value.status == 404


async def test_without_problems_the_api_says_none() -> None:
    maps = fleet64.fabric_maps(problems=False)
    found = FabricService(maps.watch, maps, maps.registry).listing()
    assert [(f["id"], f["problems"]) for f in found["fabrics"]] == [(FABRIC_A, []), (FABRIC_B, [])]
    assert found["fabrics"][1]["subnet_managers"] == [FABRIC_B, FABRIC_B_STANDBY]


# --- NVLink ---------------------------------------------------------------------------


def test_one_nvl72_domain_of_18_trays_of_4_cards_with_imex_up() -> None:
    found = domains(fleet64.views().values())
    (rack,) = found["domains"]
    assert rack["id"] == NVLINK_DOMAIN and rack["cluster_uuid"] == CLUSTER_UUID
    assert rack["clique_id"] == fleet64.CLIQUE_ID
    assert [t["node"] for t in rack["trays"]] == list(TRAYS)  # no H100 board
    assert (rack["nodes"], rack["cards"], rack["joined"]) == (18, 72, 71)
    assert all(len(t["cards"]) == 4 and t["connected"] for t in rack["trays"])
    assert {(t["imex"]["running"], t["imex"]["channels"]) for t in rack["trays"]} == {(True, 1)}
    not_joined = [
        (t["node"], c["index"], c["state"]) for t in rack["trays"] for c in t["cards"]
        if not c["joined"]
    ]  # fmt: skip
    assert not_joined == [("nvl-13", 2, "In Progress")]
    assert rack["trays"][0]["cards"][0]["health"]["summary"] == "Healthy"
    (problem,) = rack["problems"]
    assert problem.startswith(
        f"nvl-13 card 2 has not joined NVLink domain {NVLINK_DOMAIN} (fabric state In "
        "Progress, no ClusterUUID/CliqueId). Fix: "
    )
    assert [(c["node"], c["index"]) for c in found["unjoined"]] == [("nvl-13", 2)]

    (healthy,) = domains(fleet64.views(problems=False).values())["domains"]
    assert (healthy["cards"], healthy["joined"], healthy["problems"]) == (72, 72, [])


async def test_the_nvlink_api_answers_the_same() -> None:
    registry = fleet64.registry()
    (op,) = nvlink_api.routes(registry)
    answer = await op.handler(call())
    assert answer == domains(registry.nodes.values())
    assert answer["domains"][0]["nodes"] == 18
