"""Health telemetry end to end: an agent whose ``nvidia-smi`` (first on its PATH) answers
from a capture shows its cards, their figures and warnings on the control plane, in
``ctl nodes --json``, in the node's history and on ``/metrics``, which ``promtool check
metrics`` finds clean, which names every metric the shipped dashboard and alerts use,
and which a real Prometheus scrapes with the admin token.

NVML is absent on this machine (no driver), so the agent falls back to nvidia-smi, as
on a node whose NVML is broken: the path under test is the real one from there on.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.cluster import Cluster, run, wait_for
from tests.support.prometheus import start_prometheus
from tests.support.promnames import packaged_metric_names

FIXTURES = Path(__file__).parent.parent / "agent" / "fixtures"
REPO = Path(__file__).parent.parent.parent
SMI_XML = FIXTURES / "smi" / "h100-hgx_2cards_580.105.08.xml"
NODE = "gpu-node"
CARD = "NVIDIA H100 80GB HBM3"
UUID = "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f00"


def fake_nvidia_smi(bin_dir: Path) -> None:
    """An ``nvidia-smi`` that answers -q -x, topo -m and -L from captures, and fails
    anything else the way a driverless nvidia-smi does."""
    bin_dir.mkdir()
    topo = FIXTURES / "topo" / "nvidia-smi-topo-m_8xH100-NV18_8NIC.txt"
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f'  "-q -x") cat "{SMI_XML}" ;;\n'
        f'  "topo -m") cat "{topo}" ;;\n'
        f'  "-L") echo "GPU 0: {CARD} (UUID: {UUID}1)"; echo "GPU 1: {CARD} (UUID: {UUID}2)" ;;\n'
        '  *) echo "unexpected arguments: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)


def metrics(cluster: Cluster, encoding: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {cluster.admin_token}"}
    if encoding:
        headers["Accept-Encoding"] = encoding
    ask = urllib.request.Request(f"http://{cluster.listen}/metrics", headers=headers)
    with urllib.request.urlopen(ask, timeout=10) as answer:
        body = answer.read()
        if answer.headers.get("Content-Encoding") == "gzip":
            assert encoding and "gzip" in encoding, "gzip sent to a client that did not ask"
            body = gzip.decompress(body)
        elif encoding == "gzip":
            raise AssertionError("/metrics was not gzipped for a client that asked for it")
        return str(body.decode())


def names(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def node_with_cards(cluster: Cluster) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        node = cluster.nodes().get(NODE)
        if node and node["state"] == "Ready" and node.get("gpu_health"):
            return node
        return None

    return wait_for(check, 30, "the node's cards and their slow figures")  # type: ignore[no-any-return]


def test_cards_figures_and_warnings_from_a_capture(cluster: Cluster, tmp_path: Path) -> None:
    fake_nvidia_smi(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    cluster.start_agent(NODE, cluster.token(), env=env)
    node = node_with_cards(cluster)

    assert node["gpu_source"] == "nvidia-smi"
    card0, card1 = sorted(node["gpus"], key=lambda g: g["index"])
    assert card0["uuid"] == "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f001"
    assert (card0["temperature"], card0["memory_temperature"], card0["power"]) == (34, 45, 70.12)
    assert set(card0["throttle"]) == {"sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"}
    assert (card1["pcie_width"], card1["pcie_width_max"]) == (8, 16)
    assert (card1["pcie_gen"], card1["pcie_gen_max"]) == (3, 5)
    health = {h["uuid"]: h for h in node["gpu_health"]}
    assert health[card0["uuid"]]["ecc_volatile_uncorrected"] == 1
    assert health[card0["uuid"]]["remap_pending"] is True
    # The topology was read after discovery and kept on the node.
    assert node["topology"]["cards"][0]["gpus"]["1"].startswith("NV")

    warnings = node["health_warnings"]
    kinds = sorted(w.split(":")[0] for w in warnings)
    assert kinds == ["ecc", "pcie", "remap", "throttle"], warnings
    pcie = next(w for w in warnings if w.startswith("pcie:"))
    assert "card 1" in pcie and "x8 Gen3" in pcie and "lspci -vv -s" in pcie
    assert "Fix:" in pcie

    # The same, as `ctl nodes --json` prints it.
    shown = {
        n["id"]: n
        for n in json.loads(
            run(
                "ctl",
                "nodes",
                "--json",
                "--server",
                cluster.listen,
                "--token",
                cluster.admin_token,
            ).stdout
        )
    }
    assert shown[NODE]["health_warnings"] == warnings
    assert set(warnings) <= set(shown[NODE]["warnings"])
    table = run("ctl", "nodes", "--server", cluster.listen, "--token", cluster.admin_token)
    assert f"{NODE}: {pcie}" in table.stdout.splitlines()

    text = metrics(cluster)
    card = f'node="{NODE}",gpu="1",uuid="{card1["uuid"]}",model="NVIDIA H100 80GB HBM3"'
    assert f"llmgw_gpu_pcie_link_width{{{card}}} 8" in text
    assert f"llmgw_gpu_temperature_celsius{{{card}}} 30" in text
    assert f'llmgw_node_warnings{{node="{NODE}",kind="pcie"}} 1' in text
    assert f'llmgw_node_up{{node="{NODE}"}} 1' in text
    assert 'reason="hw_thermal_slowdown"} 1' in text
    assert "llmgw_gpu_fan_ratio{" not in text  # H100 SXM has no fan: absent, not 0
    # A scraper that takes gzip (Prometheus does) gets the same families, compressed;
    # one that refuses it gets plain text.
    assert names(metrics(cluster, "gzip")) == names(text)
    assert names(metrics(cluster, "gzip;q=0, identity")) == names(text)

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs Debian's prometheus package"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == "", checked.stderr

    # The last hour, at 10 s steps: the cards' temperatures are in it, unread fans not.
    history = cluster.api(f"/api/v1/nodes/{NODE}/history?minutes=5")
    assert history["step_seconds"] == 10 and len(history["t"]) == 30
    by_uuid = {g["uuid"]: g for g in history["gpus"]}
    assert 30 in by_uuid[card1["uuid"]]["temperature"]
    assert set(by_uuid[card1["uuid"]]["temperature"]) <= {None, 30}

    # Every metric a shipped dashboard or alert names is one this control plane exports.
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    histograms = {
        f"{name}{suffix}"
        for line in text.splitlines()
        if line.startswith("# TYPE ") and line.endswith(" histogram")
        for name in [line.split()[2]]
        for suffix in ("_bucket", "_sum", "_count")
    }
    named = packaged_metric_names(REPO)
    assert named, "no metric names found in packaging/"
    assert named - exported - histograms == set()

    # A real Prometheus scrapes the control plane with the admin token.
    with start_prometheus(cluster.listen, token=cluster.admin_token) as prom:
        found = prom.wait_for(f'llmgw_gpu_pcie_link_width{{node="{NODE}",gpu="1"}}', 30)
        assert found[0]["value"][1] == "8"
        memory = prom.wait_for(f'llmgw_node_memory_total_bytes{{node="{NODE}"}}', 30)
        assert float(memory[0]["value"][1]) == node["memory_total"]
