"""Metrics where they live, end to end: two agents (their ``nvidia-smi`` answering from
a capture) serve their own node's families on ``metrics_listen``; the control plane
publishes them at ``/api/v1/prometheus/targets``; Debian's Prometheus finds them
through ``http_sd_configs`` and scrapes them with the cluster's metrics token, and
their ``llmgw_gpu_*`` series arrive with the node's and card's labels. A scrape
without the token is refused; ``promtool check metrics`` finds every exposition clean
(an agent's, the control plane's with fleet detail on and off).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.cluster import Cluster, run, wait_for
from tests.e2e.test_telemetry import fake_nvidia_smi
from tests.support.ports import free_port
from tests.support.prometheus import start_prometheus

NODES = ("gpu-a", "gpu-b")


def get(url: str, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()


def promtool(text: str) -> None:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: `make test` installs Debian's prometheus package"
    checked = subprocess.run(
        [tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")


def start_agents(cluster: Cluster, tmp_path: Path) -> dict[str, str]:
    """Each node's agent, serving its metrics on a port of its own: node -> HOST:PORT."""
    fake_nvidia_smi(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    where = {}
    for node in NODES:
        where[node] = f"127.0.0.1:{free_port()}"
        state = cluster.state_dir(node)
        state.mkdir(parents=True)
        (state / "agent.yaml").write_text(f"metrics_listen: {where[node]}\n")
        cluster.start_agent(node, cluster.token(), env=env)

    def ready() -> bool:
        nodes = cluster.nodes()
        return all(
            nodes.get(n, {}).get("state") == "Ready" and nodes[n].get("gpu_health") for n in NODES
        )

    wait_for(ready, 30, "both nodes Ready with their cards")
    return where


def test_prometheus_finds_the_agents_through_http_sd(cluster: Cluster, tmp_path: Path) -> None:
    where = start_agents(cluster, tmp_path)
    token = (cluster.data_dir / "metrics.token").read_text().strip()
    assert token.startswith("llmgw-metrics-")
    base = f"http://{cluster.listen}"

    # The targets, for the metrics token or an admin; no one else.
    status, _ = get(f"{base}/api/v1/prometheus/targets", None)
    assert status == 401
    targets: list[dict[str, Any]] = cluster.api("/api/v1/prometheus/targets")
    assert sorted((t["targets"], t["labels"]["node"]) for t in targets) == [
        ([where[n]], n) for n in NODES
    ]
    assert set(targets[0]["labels"]) == {"node", "fabric", "nvlink_domain", "models"}
    status, _ = get(f"{base}/api/v1/prometheus/targets", token)
    assert status == 200
    # The metrics token opens metrics and nothing else.
    status, _ = get(f"{base}/api/v1/nodes", token)
    assert status == 403

    # An agent answers the token only, once the control plane has given it.
    agent = f"http://{where['gpu-a']}/metrics"
    assert get(agent, None)[0] == 401
    assert get(agent, "llmgw-metrics-wrong")[0] == 403
    status, text = wait_for(
        lambda: (got := get(agent, token))[0] == 200 and "llmgw_gpu_info{" in got[1] and got,
        30,
        "gpu-a's own metrics",
    )
    assert 'llmgw_gpu_pcie_link_width{node="gpu-a",gpu="1",' in text
    assert "llmgw_node_up{" not in text  # the control plane's word, not the agent's
    promtool(text)

    # The control plane's own: with fleet detail (auto: two nodes), then without.
    status, detail = get(f"{base}/metrics", token)
    assert status == 200 and 'llmgw_gpu_info{node="gpu-b"' in detail
    promtool(detail)
    run(
        "ctl",
        "config",
        "set",
        "metrics.fleet_detail",
        "off",
        "--server",
        cluster.listen,
        "--token",
        cluster.admin_token,
    )
    status, lean = get(f"{base}/metrics", token)
    assert status == 200 and 'llmgw_node_up{node="gpu-b"} 1' in lean
    assert [line for line in lean.splitlines() if line.startswith("llmgw_gpu_")] == []
    promtool(lean)

    sd = {
        "url": f"{base}/api/v1/prometheus/targets",
        "refresh_interval": "1s",
        "authorization": {"type": "Bearer", "credentials_file": str(tmp_path / "token")},
    }
    (tmp_path / "token").write_text(token)
    # honor_labels: the agents write `node` themselves, the same as the target's label.
    agents_job: dict[str, Any] = {
        "job_name": "llmgw-agents",
        "honor_labels": True,
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "authorization": {"type": "Bearer", "credentials_file": str(tmp_path / "token")},
        "http_sd_configs": [sd],
    }
    # The same targets scraped without the token: refused.
    bare_job: dict[str, Any] = {
        "job_name": "bare",
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "http_sd_configs": [sd],
    }
    with start_prometheus(cluster.listen, token=token, extra_jobs=[agents_job, bare_job]) as prom:
        for node in NODES:
            found = prom.wait_for(
                f'llmgw_gpu_temperature_celsius{{job="llmgw-agents",node="{node}",gpu="1"}}', 30
            )
            labels = found[0]["metric"]
            assert labels["instance"] == where[node] and "exported_node" not in labels
            assert labels["model"] == "NVIDIA H100 80GB HBM3"
            assert labels["uuid"] == "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f002"
            assert found[0]["value"][1] == "30"

        def refused() -> list[dict[str, Any]] | None:
            bare = [t for t in prom.targets() if t["labels"].get("job") == "bare"]
            down = [t for t in bare if t["health"] == "down" and "401" in t["lastError"]]
            return down if len(down) == len(NODES) else None

        wait_for(refused, 30, "the bare job's scrapes refused")
