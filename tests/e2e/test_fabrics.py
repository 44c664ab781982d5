"""The fabric path end to end, with the InfiniBand tools stood in by scripts that print
our own captures in the real formats (this machine has no adapters): two agents report
their ports and master SM, the control plane groups them into one fabric, has one of
them read its map (ibnetdiscover, saquery SMIR) and says its problems, and ``ctl
fabric-test`` runs ib_write_bw rail by rail over the agents' streams, graded against the
link rate; an agent without the tool is refused before anything starts."""

from __future__ import annotations

import json
import os
import stat
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.catalog import ctl, scheduled
from tests.e2e.cluster import Cluster, run, wait_for

pytestmark = pytest.mark.e2e

OWN = Path(__file__).resolve().parents[1] / "fixtures" / "infiniband"
SM = "0xb8cef60300112233"


def tools(root: Path, with_bw: bool = True) -> Path:
    """A directory of stand-ins for ibstat, sminfo, ibnetdiscover, saquery, ib_write_bw."""
    root.mkdir(parents=True)
    log = root / "calls"
    scripts = {
        "ibstat": f"cat '{OWN / 'ibstat_4xNDR-one-polling_gpu-node-07.txt'}'",
        "sminfo": (
            f"echo 'sminfo: sm lid 3 sm guid {SM}, activity count 77 priority 15 "
            "state 3 SMINFO_MASTER'"
        ),
        "ibnetdiscover": f"cat '{OWN / 'ibnetdiscover_2tier-rails_HDR_own.txt'}'",
        "saquery": f"cat '{OWN / 'saquery-SMIR_master-and-standby_own.txt'}'",
    }
    if with_bw:
        # A client names the server's address last; a server waits for its client.
        scripts["ib_write_bw"] = f"""echo "ib_write_bw $*" >> '{log}'
case "${{@: -1}}" in
  *.*) cat '{OWN / "ib_write_bw_-a_4qp_RoCE-200G_Gbps.txt"}' ;;
  *) echo 'Waiting for client to connect... *'; sleep 2 ;;
esac"""
    for name, body in scripts.items():
        path = root / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return root


def env_with(path: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{path}:{os.environ['PATH']}"}


def fabrics(cluster: Cluster) -> dict[str, Any]:
    return json.loads(run("ctl", "fabrics", "--json", "--data-dir", str(cluster.data_dir)).stdout)


def test_fabrics_maps_and_a_bandwidth_test_through_the_agents(tmp_path: Path) -> None:
    cluster = scheduled(tmp_path)
    try:
        bin_ab = tools(tmp_path / "tools")
        for node in ("a", "b"):
            cluster.start_agent(node, cluster.token(), env=env_with(bin_ab))
        cluster.start_agent("c", cluster.token(), env=env_with(tools(tmp_path / "c", False)))

        def one_fabric() -> dict[str, Any] | None:
            found = fabrics(cluster)["fabrics"]
            ok = len(found) == 1 and found[0]["nodes"] == ["a", "b", "c"]
            return found[0] if ok and found[0]["topology_read_at"] else None

        fabric = wait_for(one_fabric, 40, "one fabric of three nodes, its map read")
        assert fabric["id"] == SM and fabric["master_sm"] == SM
        # ibstat shows four adapters, one of them Polling (it sees no SM): three active
        # on each node.
        assert fabric["ports_by_state"] == {"ACTIVE": 9}
        assert fabric["active_rates_gbps"] == {"400": 9}
        assert {r["state"] for r in fabric["subnet_manager_records"]} == {"MASTER", "STANDBY"}
        problems = " | ".join(fabric["problems"])
        assert "gpu-05" in problems  # the map's rail miss, said with the fabric
        topology = cluster.api(f"/api/v1/fabrics/{SM}/topology")
        assert topology["read_by"] in ("a", "b", "c")
        assert sorted(set(topology["tiers"].values())) == ["leaf", "spine"]
        node = cluster.nodes()["a"]
        assert "ib_write_bw" in node["features"] and len(node["ib_ports"]) == 4

        out = ctl(cluster, "fabric-test", "a", "b", "--seconds", "1", "--json", check=False)
        doc = json.loads(out.stdout)
        assert [r["rail"] for r in doc["rails"]] == [0, 1, 2]
        for rail in doc["rails"]:
            assert rail["error"] is None and rail["rate_gbps"] == 400
            # The capture's largest message ran at about half the 400 Gb/s link.
            assert rail["gbps"] is not None and rail["ratio"] == round(rail["gbps"] / 400, 3)
            assert rail["grade"] == (
                "good" if rail["ratio"] >= 0.9 else "fair" if rail["ratio"] >= 0.7 else "poor"
            )
        assert out.returncode == (
            0 if all(r["grade"] in ("good", "fair") for r in doc["rails"]) else 1
        )
        calls = (tmp_path / "tools" / "calls").read_text().splitlines()
        servers = [c for c in calls if not c.split()[-1].count(".")]
        clients = [c for c in calls if c.split()[-1].count(".")]
        assert len(servers) == 3 and len(clients) == 3
        assert "-d mlx5_0 -i 1 -p 18515" in clients[0] and clients[0].endswith("127.0.0.1")

        refused = ctl(cluster, "fabric-test", "a", "c", check=False)
        assert refused.returncode != 0
        assert "c cannot run ib_write_bw (install perftest on it" in refused.stderr

        req = urllib.request.Request(
            f"http://{cluster.listen}/metrics",
            headers={"authorization": f"Bearer {cluster.admin_token}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            metrics = resp.read().decode()
        assert (
            'llmgw_ib_port_active{node="a",device="mlx5_0",port="1",link_layer="InfiniBand"} 1'
            in metrics
        )
        assert f'llmgw_fabric_master_sm{{fabric="{SM}",sm_guid="{SM}"}} 1' in metrics
    finally:
        cluster.stop()
