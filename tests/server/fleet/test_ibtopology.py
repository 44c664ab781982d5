"""ibnetdiscover text -> fabric: real captures from ../shared/fixtures and our own."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from llmgw.server.fleet.ibtopology import (
    Topology,
    adapters,
    hops,
    hosts,
    parse_ibnetdiscover,
    parse_ibnetdiscover_ports,
    rails,
    rate_gbps,
    same_leaf,
)
from tests.support.shared import SHARED_FIXTURES

SHARED = SHARED_FIXTURES
OWN = Path(__file__).resolve().parents[2] / "fixtures" / "infiniband"
NDR = SHARED / "ibnetdiscover-format_NDR-QM9700-fabric_from-ibdiagnet2.txt"
EDR_PORTS = SHARED / "ibnetdiscover-p_EDR-ports-list.txt"
OWN_TOPOLOGY = OWN / "ibnetdiscover_2tier-rails_HDR_own.txt"
OWN_PORTS = OWN / "ibnetdiscover-p_EDR_degraded_own.txt"

SPINE_1, SPINE_2 = "0x0c42a10300aa0001", "0x0c42a10300aa0002"
LEAF_1, LEAF_2, LEAF_3 = "0x0c42a10300bb0001", "0x0c42a10300bb0002", "0x0c42a10300bb0003"


def _read(path: Path) -> str:
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return path.read_text()


def _kinds(topology: Topology) -> Counter[str]:
    return Counter(node.kind for node in topology.nodes.values())


def test_real_ndr_fabric_written_by_ibdiagnet() -> None:
    # Read by hand: 9 "Switch 65" blocks (1 MQM9700 spine, 8 leaves), 263 "Ca" blocks
    # (32 hosts x mlx5_0-3 and mlx5_8-11, plus 7 SHARP Aggregation Nodes), 542 port
    # lines = 271 cables each listed from both ends: 8 leaf uplinks, 256 HCAs, 7 ANs.
    top = parse_ibnetdiscover(_read(NDR))
    assert _kinds(top) == {"switch": 9, "ca": 263}
    assert len(top.links) == 271
    assert top.problems == []
    assert Counter(top.tiers.values()) == {"leaf": 8, "spine": 1}
    spine = top.nodes["0xb0cf0e0300d33fc0"]
    assert top.tiers[spine.guid] == "spine"
    assert (spine.ports, spine.lid, spine.devid) == (65, 180, "0xd2f2")
    assert spine.description == "MF0;ib-switch-sequoia:MQM9700/U1"
    assert {(link.width, link.speed, link.rate_gbps, link.degraded) for link in top.links} == {
        ("4x", "NDR", 400.0, None)
    }
    ca = top.nodes["0x5c25730300f3dda0"]
    assert (ca.kind, ca.host, ca.adapter, ca.lid, ca.ports) == (
        "ca", "is-north-7-compute-32", "mlx5_3", 37, 1
    )  # fmt: skip
    ans = [n for n in top.nodes.values() if n.description.endswith("Aggregation Node")]
    assert len(ans) == 7 and all(n.host is None for n in ans)

    by_host = hosts(top)
    assert len(by_host) == 32 and {len(v) for v in by_host.values()} == {8}
    # Rail-optimised: each leaf carries one adapter number of all 32 hosts.
    assert rails(top) == {}
    leaf_of = {(a.name, a.leaf) for a in adapters(top)}
    assert len(leaf_of) == 8 and len({name for name, _ in leaf_of}) == 8
    assert by_host["is-north-7-compute-1"][4] == ("0xfc6a1c030091cf00", 1)  # mlx5_8
    assert same_leaf(top, "is-north-7-compute-1", "is-north-7-compute-32")
    assert hops(top, "is-north-7-compute-1", "nobody") is None


def test_real_edr_ports_list() -> None:
    # 9 lines: 3 CAs, switches lid 1719, 2052, 1516 (only as a far end) and 1781 (one
    # unplugged port); 4 cables (two listed from both ends); 2 ports with nothing plugged.
    top = parse_ibnetdiscover_ports(_read(EDR_PORTS))
    assert _kinds(top) == {"switch": 4, "ca": 3}
    assert len(top.links) == 4
    assert top.tiers == {
        "0x7cfe9003009ce5b0": "leaf",
        "0x506b4b03005c2740": "leaf",
        "0x7cfe900300b07320": "spine",
    }
    assert top.problems == ["switch 'ib-i7l2s01' 0x08c0eb0300add20e has no links"]
    assert hosts(top) == {
        "o0001": [("0x7cfe9003009ce5b0", 10)],
        "o0002": [("0x7cfe9003009ce5b0", 11)],
        "p0001": [("0x506b4b03005c2740", 35)],
    }
    assert all(link.rate_gbps == 100.0 and link.degraded is None for link in top.links)
    assert top.nodes["0x7cfe9003003b4bde"].lid == 134
    assert same_leaf(top, "o0001", "o0002") and not same_leaf(top, "o0001", "p0001")
    assert hops(top, "o0001", "p0001") is None  # the trimmed file joins no path


def test_own_two_tier_fabric_tiers_hosts_rails_and_degraded() -> None:
    top = parse_ibnetdiscover(OWN_TOPOLOGY.read_text())
    assert _kinds(top) == {"switch": 5, "ca": 12}
    assert len(top.links) == 18  # 12 adapters + 3 leaves x 2 spines
    assert top.tiers == {
        SPINE_1: "spine", SPINE_2: "spine", LEAF_1: "leaf", LEAF_2: "leaf", LEAF_3: "leaf"
    }  # fmt: skip
    assert top.nodes[SPINE_1].lid == 1 and top.nodes[LEAF_3].ports == 41

    by_host = hosts(top)
    assert sorted(by_host) == [f"gpu-0{n}" for n in range(1, 7)]
    assert by_host["gpu-04"] == [(LEAF_1, 4), (LEAF_3, 1)]
    assert by_host["gpu-05"] == [(LEAF_1, 5), (LEAF_1, 7)]  # mlx5_1 on the mlx5_0 leaf

    misses = rails(top)
    assert list(misses) == ["gpu-05"]
    (miss,) = misses["gpu-05"]
    assert (miss.adapter, miss.leaf, miss.leaf_port, miss.leaf_rail, miss.expected) == (
        "mlx5_1", LEAF_1, 7, "mlx5_0", (LEAF_2, LEAF_3)
    )  # fmt: skip
    (rail_problem,) = [p for p in top.problems if p.startswith("rail:")]
    assert "gpu-05 mlx5_1" in rail_problem and "leaf-1" in rail_problem

    (bad,) = [link for link in top.links if link.degraded]
    assert {bad.a, bad.b} == {(LEAF_2, 2), ("0x1070fd0300cd0201", 1)}
    assert (bad.width, bad.speed, bad.rate_gbps) == ("2x", "HDR", 100.0)
    assert bad.degraded == "4x port running at 2x"
    (cable_problem,) = [p for p in top.problems if p.startswith("degraded")]
    assert "leaf-2" in cable_problem and "port 2" in cable_problem
    assert "'gpu-02 mlx5_1' 0x1070fd0300cd0201 port 1" in cable_problem
    assert len(top.problems) == 2

    assert same_leaf(top, "gpu-01", "gpu-06")  # every mlx5_0 is on leaf-1
    assert hops(top, "gpu-02", "gpu-04") == 0
    assert hops(top, "gpu-02", "gpu-99") is None and not same_leaf(top, "gpu-02", "gpu-99")


def test_own_ports_list_with_degraded_links() -> None:
    top = parse_ibnetdiscover_ports(OWN_PORTS.read_text())
    assert _kinds(top) == {"switch": 3, "ca": 4}
    assert len(top.links) == 6
    degraded = {frozenset((link.a, link.b)): link for link in top.links if link.degraded}
    spine_leaf = degraded[frozenset({("0x248a070300f10001", 2), ("0x248a070300f20002", 1)})]
    assert spine_leaf.degraded == "trained at FDR, below the EDR of both ends"
    assert spine_leaf.rate_gbps == 56.0
    lane = degraded[frozenset({("0x248a070300f20001", 3), ("0x98039b0300a10002", 1)})]
    assert lane.degraded == "4x port running at 1x" and lane.rate_gbps == 25.0
    assert len(degraded) == 2
    text = "\n".join(top.problems)
    assert "'ib-spine-a' 0x248a070300f10001 port 2 - 'ib-leaf-b' 0x248a070300f20002 port 1" in text
    assert "'ib-leaf-a' 0x248a070300f20001 port 3 - 'n02 HCA-1' 0x98039b0300a10002 port 1" in text
    assert same_leaf(top, "n01", "n02") and hops(top, "n01", "n02") == 0
    assert hops(top, "n01", "n03") == 2 and not same_leaf(top, "n01", "n03")


def test_a_truncated_or_garbled_file_is_read_as_far_as_it_goes() -> None:
    text = OWN_TOPOLOGY.read_text()
    cut = text[: text.index('"gpu-03 mlx5_0" lid 15') + 5]  # ends mid-line
    noisy = '[7]\t"H-nothex"[1]\t\t# "x" lid 1 4xHDR\n[2] before any block\n' + cut
    top = parse_ibnetdiscover(noisy + '\nSwitch\t41 "S-0c42\n[1]\t"S-0c42a103')
    assert top.tiers[LEAF_1] == "leaf" and top.tiers[SPINE_1] == "spine"
    assert sorted(hosts(top)) == ["gpu-01", "gpu-02"]
    unread = [p for p in top.problems if "not understood" in p]
    assert unread and unread[0].startswith("5 line(s) not understood, the first: line 1:")
    ports = parse_ibnetdiscover_ports("SW  1719 10 0x7cfe9003009ce5b0 4x EDR - CA   13\n\n")
    assert ports.links == [] and ports.nodes == {} and "not understood" in ports.problems[0]
    assert parse_ibnetdiscover("") == Topology({}, [], {}, [])


def test_grouping_and_full_forms_and_a_core_tier() -> None:
    text = """
vendid=0x2c9
devid=0xc738
sysimgguid=0x2c90200400000
switchguid=0x2c90200400001(2c90200400001)\t# ISR9288/ISR9096 Voltaire sLB-24D 1
Switch\t24 "S-0002c90200400001"\t\t# "leaf" base port 0 lid 7 lmc 0
[1][ext 1]\t"H-0002c90300000a00"[1](2c90300000a01) \t\t# "n1 HCA-1" lid 9 4xQDR s=4 w=2 v=3
[24]\t"S-0002c90200400002"[1]\t\t# "spine" lid 8 4xFDR10 s=4 w=2 v=3
"""
    top = parse_ibnetdiscover(text)
    assert top.problems == []
    assert top.tiers == {"0x0002c90200400001": "leaf", "0x0002c90200400002": "spine"}
    assert [(link.width, link.speed, link.rate_gbps) for link in top.links] == [
        ("4x", "QDR", 40.0), ("4x", "FDR10", 40.0)
    ]  # fmt: skip
    assert hosts(top) == {"n1": [("0x0002c90200400001", 1)]}
    three = "\n".join(
        f"SW {a:5d} {pa:2d} 0x{a:016x} 4x HDR - SW {b:5d} {pb:2d} 0x{b:016x} ( 'sw{a}' - 'sw{b}' )"
        for a, pa, b, pb in ((1, 1, 2, 1), (2, 2, 3, 1), (3, 2, 4, 1), (4, 2, 5, 1))
    )
    three += "\nCA    10  1 0x000000000000000a 4x HDR - SW     1  9 0x0000000000000001"
    three += " ( 'h1 mlx5_0' - 'sw1' )\nCA    11  1 0x000000000000000b 4x HDR - SW     5  9"
    three += " 0x0000000000000005 ( 'h2 mlx5_0' - 'sw5' )"
    top = parse_ibnetdiscover_ports(three)
    assert [top.tiers[f"0x{n:016x}"] for n in range(1, 6)] == [
        "leaf", "spine", "core", "spine", "leaf"
    ]  # fmt: skip
    assert hops(top, "h1", "h2") == 4


def test_two_peers_for_one_port_is_a_problem() -> None:
    text = (
        "SW 1 1 0x0000000000000001 4x NDR - CA 5 1 0x0000000000000005 ( 's' - 'a mlx5_0' )\n"
        "SW 1 1 0x0000000000000001 4x NDR - CA 6 1 0x0000000000000006 ( 's' - 'b mlx5_0' )\n"
    )
    top = parse_ibnetdiscover_ports(text)
    assert len(top.links) == 1
    assert top.problems == [
        "0x0000000000000001 port 1 is listed cabled to both 0x0000000000000005 port 1 "
        "and 0x0000000000000006 port 1"
    ]


@pytest.mark.parametrize(
    ("width", "speed", "gbps"),
    [
        ("4x", "NDR", 400.0), ("2x", "NDR", 200.0), ("4x", "HDR", 200.0), ("1x", "EDR", 25.0),
        ("4x", "FDR", 56.0), ("4x", "FDR10", 40.0), ("12x", "QDR", 120.0), ("8x", "DDR", 40.0),
        ("4x", "SDR", 10.0), ("4x", "XDR", 800.0), ("??", "NDR", 0.0), ("4x", "???", 0.0),
    ],
)  # fmt: skip
def test_rate(width: str, speed: str, gbps: float) -> None:
    assert rate_gbps(width, speed) == gbps
