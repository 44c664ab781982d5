"""The fleet's InfiniBand fabrics from what the nodes' ports see: grouped by master SM
(and through a failover), named by the lowest SM GUID, problems with their fix, RoCE
networks, and the metrics."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from llmgw.server.fleet.exposition import fleet_metrics
from llmgw.server.fleet.fabrics import RECENT, FabricWatch, fabric_metrics
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.hardware import IbPort

SM_A = "0x0c42a10300b5d800"
SM_B = "0x0c42a10300b5d8ff"
SM_C = "0xb8cef60300112233"


def port(
    device: str,
    n: int = 1,
    *,
    master: str | None = SM_A,
    state: str = "ACTIVE",
    layer: str = "InfiniBand",
    **more: Any,
) -> IbPort:
    fields: dict[str, Any] = {
        "device": device,
        "port": n,
        "state": state,
        "phys_state": "LinkUp" if state == "ACTIVE" else "Polling",
        "rate_gbps": 400.0,
        "link_layer": layer,
        "master_sm_guid": master,
        "roce_networks": [],
        "counters": {},
        **more,
    }
    return IbPort(**fields)


def node(node_id: str, *ports: IbPort, connected: bool = True) -> NodeView:
    view = NodeView(id=node_id, cert_serial=1)
    view.live.ib_ports = list(ports)
    if connected:
        view.session = cast(Any, object())  # a stream is up; nothing is sent in these tests
    return view


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_two_fabrics_by_master_each_named_by_its_lowest_sm() -> None:
    watch = FabricWatch(Clock())
    found = watch.fabrics(
        [
            node("g1", port("mlx5_0"), port("mlx5_1", master=SM_C)),
            node("g2", port("mlx5_0"), port("mlx5_1", master=SM_C)),
        ]
    )
    fabrics = found["fabrics"]
    assert [(f["id"], f["master_sm"], f["nodes"]) for f in fabrics] == [
        (SM_A, SM_A, ["g1", "g2"]),
        (SM_C, SM_C, ["g1", "g2"]),
    ]
    assert fabrics[0]["ports_by_state"] == {"ACTIVE": 2}
    assert fabrics[0]["active_rates_gbps"] == {"400": 2}
    assert fabrics[0]["problems"] == []
    assert found["roce_networks"] == [] and found["unassigned_ports"] == []


def test_a_failover_keeps_one_fabric_named_by_the_lowest_sm_and_is_reported() -> None:
    clock = Clock()
    watch = FabricWatch(clock)
    watch.fabrics(
        [node("g1", port("mlx5_0", master=SM_B)), node("g2", port("mlx5_0", master=SM_B))]
    )
    clock.now += 30
    # SM_A takes over: g1 has seen it already, g2 not yet.
    found = watch.fabrics(
        [node("g1", port("mlx5_0", master=SM_A)), node("g2", port("mlx5_0", master=SM_B))]
    )
    (fabric,) = found["fabrics"]
    assert fabric["id"] == SM_A and fabric["subnet_managers"] == [SM_A, SM_B]
    assert fabric["master_sm"] is None and fabric["masters"] == [SM_A, SM_B]
    problems = " | ".join(fabric["problems"])
    assert "ports disagree on their master SM" in problems
    assert f"the master SM changed from {SM_B} to {SM_A} 0 s ago" in problems
    # Settled: one master; the change is still said while recent, then no more.
    clock.now += 60
    found = watch.fabrics(
        [node("g1", port("mlx5_0", master=SM_A)), node("g2", port("mlx5_0", master=SM_A))]
    )
    (fabric,) = found["fabrics"]
    assert fabric["master_sm"] == SM_A
    assert [p for p in fabric["problems"] if "disagree" in p] == []
    assert any("changed from" in p for p in fabric["problems"])
    clock.now += RECENT + 1
    found = watch.fabrics(
        [node("g1", port("mlx5_0", master=SM_A)), node("g2", port("mlx5_0", master=SM_A))]
    )
    assert found["fabrics"][0]["problems"] == []
    assert found["fabrics"][0]["subnet_managers"] == [SM_A]


def test_ports_in_init_are_a_problem_with_its_fix() -> None:
    found = FabricWatch(Clock()).fabrics([node("g1", port("mlx5_0"), port("mlx5_1", state="INIT"))])
    (problem,) = found["fabrics"][0]["problems"]
    assert problem.startswith("1 port(s) in INIT or ARMED (g1 mlx5_1/1)")
    assert "Fix: check the SM" in problem


def test_roce_networks_unknown_masters_and_lost_nodes() -> None:
    roce = port("mlx5_4", master=None, layer="Ethernet", roce_networks=["10.20.0.0/16"])
    found = FabricWatch(Clock()).fabrics(
        [
            node("r1", roce),
            node("r2", replace(roce, device="mlx5_5")),
            node("g1", port("mlx5_0", master=None), port("mlx5_1", master=None, state="DOWN")),
            node("gone", port("mlx5_0"), connected=False),
        ]
    )
    assert found["fabrics"] == []  # the only master seen is on a node that is not connected
    assert [(n["network"], n["nodes"]) for n in found["roce_networks"]] == [
        ("10.20.0.0/16", ["r1", "r2"])
    ]
    # An active IB port whose master could not be read; a DOWN one says nothing.
    assert [(p["node"], p["device"]) for p in found["unassigned_ports"]] == [("g1", "mlx5_0")]


def test_the_metrics_of_ports_and_fabrics() -> None:
    g1 = node(
        "g1",
        port("mlx5_0", counters={"symbol_error": 3, "port_xmit_data": 1000}),
        port("mlx5_1", state="DOWN", rate_gbps=None),
    )
    g1.last_seen = g1.live.read_at["ib_ports"] = 10_000.0
    text = "\n".join(fleet_metrics([g1], now=10_001.0))
    where = 'node="g1",device="mlx5_0",port="1",link_layer="InfiniBand"'
    assert f"llmgw_ib_port_active{{{where}}} 1" in text
    assert f"llmgw_ib_port_rate_gbps{{{where}}} 400" in text
    assert f'llmgw_ib_port_counter_total{{{where},counter="symbol_error"}} 3' in text
    down = 'node="g1",device="mlx5_1",port="1",link_layer="InfiniBand"'
    assert f"llmgw_ib_port_active{{{down}}} 0" in text
    # A rate not read is absent, never 0.
    assert f"llmgw_ib_port_rate_gbps{{{down}}}" not in text
    assert "# TYPE llmgw_ib_port_counter_total counter" in text

    found = FabricWatch(Clock()).fabrics([g1])
    fabric = "\n".join(fabric_metrics(found))
    assert f'llmgw_fabric_master_sm{{fabric="{SM_A}",sm_guid="{SM_A}"}} 1' in fabric
    assert f'llmgw_fabric_subnet_managers{{fabric="{SM_A}"}} 1' in fabric
    assert f'llmgw_fabric_problems{{fabric="{SM_A}"}} 0' in fabric


def test_a_node_declared_on_one_fabric_with_ports_on_another() -> None:
    g1 = node("g1", port("mlx5_0"), port("mlx5_1", master=SM_C))
    g1.labels["llmgw.fabric"] = SM_A
    g2 = node("g2", port("mlx5_0"))
    g2.labels["llmgw.fabric"] = SM_A  # as declared: nothing to say
    found = FabricWatch(Clock()).fabrics([g1, g2])
    by_id = {f["id"]: f for f in found["fabrics"]}
    assert by_id[SM_A]["problems"] == []
    (problem,) = by_id[SM_C]["problems"]
    assert problem.startswith(f"g1 is declared on fabric {SM_A} (llmgw.fabric label)")
    assert "`llmgw ctl node label g1 llmgw.fabric=FABRIC`" in problem


def test_a_fabric_keeps_its_name_after_failing_over_to_a_higher_sm() -> None:
    clock = Clock()
    watch = FabricWatch(clock)
    seen = [node("g1", port("mlx5_0", master=SM_A)), node("g2", port("mlx5_0", master=SM_A))]
    assert watch.fabrics(seen)["fabrics"][0]["id"] == SM_A
    clock.now += 30
    moved = [node("g1", port("mlx5_0", master=SM_B)), node("g2", port("mlx5_0", master=SM_B))]
    assert watch.fabrics(moved)["fabrics"][0]["id"] == SM_A
    clock.now += RECENT + 1
    (fabric,) = watch.fabrics(moved)["fabrics"]
    # SM_A is forgotten as a manager, not as the name the fabric's maps and labels use.
    assert fabric["subnet_managers"] == [SM_B] and fabric["id"] == SM_A
    # A fresh watch (a restarted control plane) names it by what it sees.
    assert FabricWatch(clock).fabrics(moved)["fabrics"][0]["id"] == SM_B
