"""InfiniBand and RoCE ports: the real captures in ../shared/fixtures (skipped where
that folder is not there), our own fixtures, and a fake sysfs tree under tmp_path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llmgw.agent.discovery.infiniband import (
    BandwidthRun,
    IbPort,
    SmInfo,
    normalise_guid,
    parse_ib_write_bw,
    parse_ibstat,
    parse_perfquery,
    parse_perfquery_ports,
    parse_sminfo,
    read_ports,
    read_sminfo,
    read_sysfs,
)
from llmgw.wire.codec import from_map, to_map
from tests.support.shared import SHARED_FIXTURES

OURS = Path(__file__).parents[1] / "fixtures" / "infiniband"
REAL = SHARED_FIXTURES


def real(name: str) -> str:
    path = REAL / name
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    return path.read_text()


def ours(name: str) -> str:
    return (OURS / name).read_text()


# --- real captures -----------------------------------------------------------------


def test_real_ibstat_eight_ib_ports_and_a_bond() -> None:
    ports = parse_ibstat(real("ibstat_8xCX7-IB-400G_H100-node.txt"))
    assert len(ports) == 9
    ib = [p for p in ports if p.link_layer == "InfiniBand"]
    assert len(ib) == 8
    assert all(p.state == "ACTIVE" and p.phys_state == "LinkUp" for p in ib)
    assert {p.rate_gbps for p in ib} == {400.0}
    assert ports[0] == IbPort(
        device="mlx5_0",
        port=1,
        state="ACTIVE",
        phys_state="LinkUp",
        rate_gbps=400.0,
        link_layer="InfiniBand",
        node_guid="0x58a2e10300a7820e",
        port_guid="0x58a2e10300a7820e",
        lid=128,
        sm_lid=1,
    )
    bond = ports[-1]
    assert (bond.device, bond.link_layer, bond.rate_gbps) == ("mlx5_bond_0", "Ethernet", 200.0)
    assert bond.port_guid == "0x201d97fffe0056cf"
    assert bond.lid is None and bond.sm_lid is None  # LIDs mean nothing on Ethernet
    assert all(p.counters == {} and p.roce_networks == [] for p in ports)


def test_real_ibstat_roce_twelve_ports_two_down() -> None:
    ports = parse_ibstat(real("ibstat_RoCE-12port-some-down_H100-node.txt"))
    assert len(ports) == 12
    assert {p.link_layer for p in ports} == {"Ethernet"}
    down = {p.device: p.phys_state for p in ports if p.state == "DOWN"}
    assert down == {"mlx5_11": "Polling", "mlx5_5": "Disabled"}
    assert {p.rate_gbps for p in ports} == {400.0, 100.0, 40.0}
    by_name = {p.device: p for p in ports}
    assert by_name["mlx5_1"].port_guid is None  # printed as 0x0000000000000000
    assert by_name["mlx5_0"].port_guid == "0xa288c2fffeadeab8"
    assert by_name["mlx5_0"].node_guid == "0xa088c20300adeab8"


def test_real_sminfo_master() -> None:
    assert parse_sminfo(real("sminfo_NDR-fabric_master.txt")) == SmInfo(
        sm_lid=2,
        sm_guid="0xfc6a1c030082db00",
        priority=0,
        state="SMINFO_MASTER",
        activity=1671874,
    )


def test_real_perfquery_hca() -> None:
    counts = parse_perfquery(real("perfquery-x_EDR-HCA-port1.txt"))
    assert len(counts) == 22
    assert counts["PortXmitData"] == 9049592493976
    assert counts["PortMulticastRcvPkts"] == 3732158589
    assert counts["SymbolErrorCounter"] == 0
    assert not {"PortSelect", "CounterSelect", "CounterSelect2"} & counts.keys()


def test_real_perfquery_switch_two_ports() -> None:
    text = real("perfquery-x_EDR-switch-2ports.txt")
    ports = parse_perfquery_ports(text)
    assert sorted(ports) == [1, 2]
    assert ports[1]["PortXmitWait"] == 22730501
    assert ports[2]["PortXmitWait"] == 36510964
    assert ports[2]["PortMulticastXmitPkts"] == 0
    assert parse_perfquery(text) == ports[1]  # the first port, not a sum


def test_real_perfquery_switch_errors() -> None:
    counts = parse_perfquery(real("perfquery-x_EDR-switch-port1-with-errors.txt"))
    data = {"PortXmitData", "PortRcvData", "PortXmitWait"}
    nonzero = {k: v for k, v in counts.items() if v and k not in data and "Pkts" not in k}
    assert nonzero == {
        "LinkDownedCounter": 1,
        "PortRcvSwitchRelayErrors": 7,
        "PortXmitDiscards": 20046,
    }


def test_real_ib_write_bw_between_cpufreq_warnings() -> None:
    rows = parse_ib_write_bw(real("ib_write_bw_-a_2node_HDR-CX6_MBps_with-cpufreq-warnings.txt"))
    assert [r.size_bytes for r in rows] == [2**k for k in range(1, 24)]
    assert {r.bw_unit for r in rows} == {"MB/sec"}
    assert {r.iterations for r in rows} == {5000}
    assert rows[11] == BandwidthRun(4096, 5000, 12938.64, 10281.32, "MB/sec", 2.632019)
    # MB/sec is MiB/s: 23317.65 x 2**20 x 8 bits is ~195.6 Gb/s, an HDR 200G link.
    assert rows[-1].bw_average_gbps == pytest.approx(195.6, abs=0.1)


def test_real_ib_write_bw_loopback_drops_the_servers_copy() -> None:
    rows = parse_ib_write_bw(real("ib_write_bw_loopback_all-sizes_MBps_superbench.txt"))
    assert len(rows) == 23
    assert rows[0] == BandwidthRun(2, 2000, 5.32, 5.30, "MB/sec", 2.778732)
    assert rows[-1] == BandwidthRun(8388608, 2000, 23240.68, 23240.68, "MB/sec", 0.002905)


# --- our fixtures --------------------------------------------------------------------


def test_ibstat_four_ndr_ports_one_polling() -> None:
    ports = parse_ibstat(ours("ibstat_4xNDR-one-polling_gpu-node-07.txt"))
    assert [p.device for p in ports] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert [p.lid for p in ports] == [211, 212, 0, 214]
    polling = ports[2]
    assert (polling.state, polling.phys_state, polling.rate_gbps) == ("DOWN", "Polling", 10.0)
    assert polling.sm_lid == 0
    assert polling.port_guid == "0x946dae0300f1c8e4"  # an IB GUID is burnt in, up or down


def test_ibstat_roce_node_disabled_port() -> None:
    ports = parse_ibstat(ours("ibstat_RoCE-4port-one-disabled_inference-node-12.txt"))
    assert [(p.device, p.rate_gbps) for p in ports] == [
        ("mlx5_0", 100.0),
        ("mlx5_1", 100.0),
        ("mlx5_2", 200.0),
        ("mlx5_3", 40.0),
    ]
    assert ports[3].state == "DOWN" and ports[3].phys_state == "Disabled"
    assert ports[3].port_guid is None
    assert all(p.lid is None and p.link_layer == "Ethernet" for p in ports)


def test_sminfo_standby() -> None:
    assert parse_sminfo(ours("sminfo_standby-sm_priority-14.txt")) == SmInfo(
        sm_lid=7,
        sm_guid="0xb83fd20300f7a3c1",
        priority=14,
        state="SMINFO_STANDBY",
        activity=40221,
    )


def test_perfquery_hca_with_errors() -> None:
    text = ours("perfquery-x_NDR-HCA-lid212-port1_errors.txt")
    counts = parse_perfquery(text)
    assert parse_perfquery_ports(text) == {1: counts}
    assert counts["SymbolErrorCounter"] == 1873
    assert counts["LinkErrorRecoveryCounter"] == 4
    assert counts["LinkDownedCounter"] == 2
    assert counts["PortRcvErrors"] == 61
    assert counts["PortXmitDiscards"] == 318
    assert counts["LocalLinkIntegrityErrors"] == 1
    assert counts["PortXmitData"] == 48213377016488


def test_ib_write_bw_gbits_roce() -> None:
    rows = parse_ib_write_bw(ours("ib_write_bw_-a_4qp_RoCE-200G_Gbps.txt"))
    assert len(rows) == 23
    assert {r.bw_unit for r in rows} == {"Gb/sec"}
    assert rows[0] == BandwidthRun(2, 5000, 0.51, 0.50, "Gb/sec", 31.25)
    assert rows[-1].bw_average_gbps == 194.41


# --- odd text ------------------------------------------------------------------------


def test_odd_text_gives_nothing() -> None:
    assert parse_ibstat("") == []
    assert parse_ibstat("ibpanic: [12] main: stat of IB device 'mlx5_0' failed\n") == []
    assert parse_sminfo("ibwarn: [3102] mad_rpc_open_port: can't open UMAD port\n") is None
    assert parse_perfquery("") == {}
    assert parse_ib_write_bw(" 65536      1000     96.43   96.40   0.18\n") == []  # no header


def test_sminfo_state_number_without_word() -> None:
    info = parse_sminfo("sminfo: sm lid 1 sm guid 0x2, activity count 5 priority 15 state 3\n")
    assert info is not None
    assert (info.state, info.sm_guid) == ("SMINFO_MASTER", "0x0000000000000002")


def test_perfquery_without_header_keys_by_port_select() -> None:
    text = "PortSelect:......................3\nPortXmitData:....................17\n"
    assert parse_perfquery_ports(text) == {3: {"PortXmitData": 17}}


def test_ib_write_bw_without_msgrate_column() -> None:
    text = (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]\n"
        " 65536      5000               188.42             186.97\n"
    )
    assert parse_ib_write_bw(text) == [BandwidthRun(65536, 5000, 188.42, 186.97, "Gb/sec")]


def test_normalise_guid() -> None:
    assert normalise_guid("0c42:a103:00b5:d8a2") == "0x0c42a10300b5d8a2"
    assert normalise_guid("0x58A2E10300A7820E") == "0x58a2e10300a7820e"
    assert normalise_guid("0x0000000000000000") is None
    assert normalise_guid("N/A") is None


# --- sysfs ---------------------------------------------------------------------------


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def device(root: Path, name: str, node_guid: str) -> Path:
    d = root / "sys/class/infiniband" / name
    write(d / "node_guid", node_guid)
    return d


def port(
    dev: Path,
    n: int,
    *,
    state: str,
    phys: str,
    rate: str,
    layer: str,
    lid: str = "0x0",
    sm_lid: str = "0x0",
) -> Path:
    p = dev / "ports" / str(n)
    for name, text in [
        ("state", state),
        ("phys_state", phys),
        ("rate", rate),
        ("link_layer", layer),
        ("lid", lid),
        ("sm_lid", sm_lid),
        ("lid_mask_count", "0"),
        ("cap_mask", "0xa751e848"),
    ]:
        write(p / name, text)
    return p


def gid(p: Path, i: int, value: str, kind: str | None = None, ndev: str | None = None) -> None:
    write(p / "gids" / str(i), value)
    if kind is not None:
        write(p / "gid_attrs/types" / str(i), kind)
    if ndev is not None:
        write(p / "gid_attrs/ndevs" / str(i), ndev)


def route_hex(address: str) -> str:
    """An IPv4 address as /proc/net/route prints it: the __be32 as a host-order number."""
    return f"{int.from_bytes(bytes(int(b) for b in address.split('.')), sys.byteorder):08X}"


ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> Path:
    ib = device(tmp_path, "mlx5_0", "0c42:a103:00b5:d8a2")
    p = port(
        ib,
        1,
        state="4: ACTIVE",
        phys="5: LinkUp",
        rate="400 Gb/sec (4X NDR)",
        layer="InfiniBand",
        lid="0x80",
        sm_lid="0x1",
    )
    gid(p, 0, "fe80:0000:0000:0000:0c42:a103:00b5:d8a2", "IB/RoCE v1")
    for name, value in [
        ("port_xmit_data", "1203344871"),
        ("port_rcv_data", "1187720042"),
        ("symbol_error", "3"),
        ("link_downed", "0"),
        ("port_xmit_wait", "N/A (no PMA)"),
    ]:
        write(p / "counters" / name, value)
    write(p / "hw_counters/lifespan", "10")
    write(p / "hw_counters/out_of_buffer", "12")

    roce = device(tmp_path, "mlx5_10", "a088:c203:00ad:eab8")
    p = port(
        roce, 1, state="4: ACTIVE", phys="5: LinkUp", rate="200 Gb/sec (4X HDR)", layer="Ethernet"
    )
    gid(p, 0, "fe80:0000:0000:0000:a288:c2ff:fead:eab8", "IB/RoCE v1", "eth2")
    gid(p, 1, "fe80:0000:0000:0000:a288:c2ff:fead:eab8", "RoCE v2", "eth2")
    gid(p, 2, "0000:0000:0000:0000:0000:ffff:0a14:0411", "IB/RoCE v1", "eth2")
    gid(p, 3, "0000:0000:0000:0000:0000:ffff:0a14:0411", "RoCE v2", "eth2")
    gid(p, 4, "2001:0db8:0020:0004:0000:0000:0000:0011", "RoCE v2", "eth2")
    gid(p, 5, ZERO_GID)  # an empty slot: its type file answers an error; here it is absent
    write(p / "counters/port_xmit_data", "77")
    write(p / "hw_counters/np_cnp_sent", "4410")

    down = device(tmp_path, "mlx5_2", "a088:c203:00bb:3514")
    p = port(
        down, 1, state="1: DOWN", phys="3: Disabled", rate="40 Gb/sec (4X QDR)", layer="Ethernet"
    )
    gid(p, 0, ZERO_GID)
    gid(p, 1, "0000:0000:0000:0000:0000:ffff:c0a8:6405", "RoCE v2", "eth5")  # no route

    header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"
    rows = [
        ("eth0", "0.0.0.0", "192.168.1.1", "0.0.0.0"),
        ("eth0", "192.168.1.0", "0.0.0.0", "255.255.255.0"),
        ("eth2", "10.20.4.0", "0.0.0.0", "255.255.252.0"),
        ("eth9", "10.20.0.0", "0.0.0.0", "255.255.0.0"),  # wider, and another device
    ]
    lines = [header] + [
        f"{dev}\t{route_hex(d)}\t{route_hex(g)}\t0001\t0\t0\t0\t{route_hex(m)}\t0\t0\t0"
        for dev, d, g, m in rows
    ]
    write(tmp_path / "proc/net/route", "\n".join(lines))
    write(
        tmp_path / "proc/net/if_inet6",
        "20010db8002000040000000000000011 05 40 00 80     eth2\n"
        "fe80000000000000a288c2fffeadeab8 05 40 20 80     eth2",
    )
    return tmp_path


def test_sysfs_ib_port(fake_sysfs: Path) -> None:
    ports = read_sysfs(fake_sysfs)
    assert [p.device for p in ports] == ["mlx5_0", "mlx5_2", "mlx5_10"]  # natural order
    assert ports[0] == IbPort(
        device="mlx5_0",
        port=1,
        state="ACTIVE",
        phys_state="LinkUp",
        rate_gbps=400.0,
        width_speed="4X NDR",
        link_layer="InfiniBand",
        node_guid="0x0c42a10300b5d8a2",
        port_guid="0x0c42a10300b5d8a2",
        lid=128,  # sysfs writes 0x80
        sm_lid=1,
        roce_networks=[],
        # port_xmit_wait said "N/A (no PMA)": absent, not 0; lifespan is not a counter.
        counters={
            "link_downed": 0,
            "out_of_buffer": 12,
            "port_rcv_data": 1187720042,
            "port_xmit_data": 1203344871,
            "symbol_error": 3,
        },
    )


def test_sysfs_roce_port_networks_from_roce_v2_gids(fake_sysfs: Path) -> None:
    roce = read_sysfs(fake_sysfs)[2]
    assert roce.link_layer == "Ethernet" and roce.rate_gbps == 200.0
    assert roce.port_guid == "0xa288c2fffeadeab8"
    assert roce.lid is None and roce.sm_lid is None
    # The IPv4-mapped GID takes eth2's /22, not eth9's wider /16; link-local is left out.
    assert roce.roce_networks == ["10.20.4.0/22", "2001:db8:20:4::/64"]
    assert roce.counters == {"port_xmit_data": 77, "np_cnp_sent": 4410}


def test_sysfs_down_port_without_counters(fake_sysfs: Path) -> None:
    down = read_sysfs(fake_sysfs)[1]
    assert (down.state, down.phys_state, down.width_speed) == ("DOWN", "Disabled", "4X QDR")
    assert down.port_guid is None  # GID 0 is empty
    assert down.counters == {}  # no counters dir: absent, never zeros
    assert down.roce_networks == ["192.168.100.5/32"]  # no route says its prefix


def test_ports_travel_on_the_wire(fake_sysfs: Path) -> None:
    for p in read_sysfs(fake_sysfs):
        assert from_map(IbPort, to_map(p)) == p


def test_no_infiniband_class_is_no_ports(tmp_path: Path) -> None:
    assert read_sysfs(tmp_path) == []
    (tmp_path / "sys/class/infiniband").mkdir(parents=True)
    assert read_sysfs(tmp_path) == []


# --- the tools -------------------------------------------------------------------------


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


async def test_read_ports_without_sysfs_or_ibstat(tmp_path: Path) -> None:
    assert await read_ports(tmp_path, ibstat=None) == []
    assert await read_ports(tmp_path, ibstat="llmgw-no-such-ibstat") == []


async def test_read_ports_prefers_sysfs(fake_sysfs: Path) -> None:
    ibstat = script(fake_sysfs, "ibstat", "exit 1")
    assert len(await read_ports(fake_sysfs, ibstat=ibstat)) == 3


async def test_read_ports_falls_back_to_ibstat(tmp_path: Path) -> None:
    fixture = OURS / "ibstat_4xNDR-one-polling_gpu-node-07.txt"
    ibstat = script(tmp_path, "ibstat", f"cat '{fixture}'")
    ports = await read_ports(tmp_path, ibstat=ibstat)
    assert ports == parse_ibstat(fixture.read_text())


async def test_read_ports_ibstat_fails_or_hangs(tmp_path: Path) -> None:
    failing = script(tmp_path, "ibstat", "echo 'ibpanic: no devices' >&2; exit 255")
    assert await read_ports(tmp_path, ibstat=failing) == []
    hanging = script(tmp_path, "ibstat-slow", "exec sleep 30")
    assert await read_ports(tmp_path, ibstat=hanging, timeout=0.2) == []


async def test_read_sminfo(tmp_path: Path) -> None:
    assert await read_sminfo("mlx5_0", 1, sminfo="llmgw-no-such-sminfo") is None
    args = tmp_path / "args"
    line = ours("sminfo_standby-sm_priority-14.txt").strip()
    sminfo = script(tmp_path, "sminfo", f"echo \"$@\" > '{args}'; echo '{line}'")
    info = await read_sminfo("mlx5_3", 1, sminfo=sminfo)
    assert info is not None and info.state == "SMINFO_STANDBY"
    assert args.read_text().split() == ["-C", "mlx5_3", "-P", "1"]


async def test_the_heartbeats_ports_carry_the_master_asked_once_a_minute(fake_sysfs: Path) -> None:
    from llmgw.agent.discovery.ibwatch import PortWatch

    calls = fake_sysfs / "sminfo-calls"
    line = (
        "sminfo: sm lid 1 sm guid 0xb8cef60300112233, activity count 9 priority 15 "
        "state 3 SMINFO_MASTER"
    )
    sminfo = script(fake_sysfs, "sminfo", f"echo \"$@\" >> '{calls}'; echo '{line}'")
    now = [0.0]
    watch = PortWatch(fake_sysfs, ibstat=None, sminfo=sminfo, clock=lambda: now[0])
    ports = await watch.read()
    active_ib = [p for p in ports if p.link_layer == "InfiniBand" and p.state == "ACTIVE"]
    assert active_ib and all(p.master_sm_guid == "0xb8cef60300112233" for p in active_ib)
    assert all(p.master_sm_lid == 1 for p in active_ib)
    # RoCE and down ports are not asked, and carry no master.
    assert all(p.master_sm_guid is None for p in ports if p not in active_ib)
    asked = calls.read_text().splitlines()
    assert len(asked) == len(active_ib)
    now[0] = 30.0  # within the minute: the master is carried, sminfo not run again
    again = await watch.read()
    assert [p.master_sm_guid for p in again] == [p.master_sm_guid for p in ports]
    assert calls.read_text().splitlines() == asked
    now[0] = 61.0
    await watch.read()
    assert len(calls.read_text().splitlines()) == 2 * len(asked)


async def test_ibnetdiscover_is_run_over_the_fabrics_port(tmp_path: Path) -> None:
    from llmgw.agent.discovery.ibwatch import run_ibnetdiscover

    fixture = OURS / "ibnetdiscover_2tier-rails_HDR_own.txt"
    args = tmp_path / "args"
    tool = script(tmp_path, "ibnetdiscover", f"echo \"$@\" > '{args}'; cat '{fixture}'")
    text = await run_ibnetdiscover("mlx5_1", 1, tool=tool)
    assert text == fixture.read_text()
    assert args.read_text().split() == ["-C", "mlx5_1", "-P", "1"]
    failing = script(tmp_path, "ibnetdiscover-bad", "echo 'ibwarn: no umad port' >&2; exit 3")
    with pytest.raises(RuntimeError, match=r"failed \(exit 3\): ibwarn: no umad port"):
        await run_ibnetdiscover(tool=failing)
    with pytest.raises(RuntimeError, match="cannot be run"):
        await run_ibnetdiscover(tool=str(tmp_path / "absent"))


def test_saquery_smir_lists_every_subnet_manager() -> None:
    from llmgw.agent.discovery.ibwatch import parse_smir

    found = parse_smir(ours("saquery-SMIR_master-and-standby_own.txt"))
    assert found == [
        {
            "guid": "0xb8cef60300112233",
            "lid": 1,
            "priority": 15,
            "state": "MASTER",
            "activity": 482113,
        },
        {
            "guid": "0xb8cef603001122f0",
            "lid": 7,
            "priority": 13,
            "state": "STANDBY",
            "activity": 90211,
        },
    ]
    assert parse_smir("ibwarn: no SA\n") == []
    # A record cut short (no state) is left out rather than guessed.
    assert parse_smir("SMInfoRecord dump:\n\t\tGUID..........0x1\n") == []
