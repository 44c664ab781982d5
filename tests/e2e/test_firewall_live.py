"""The firewall is changed live: a change through the admin API reaches a running agent,
which keeps the new plan of its table (``STATE_DIR/firewall.json``, what it loads with
nft as root) at once, with neither the control plane nor the agent started again.

The test cluster's firewall is off (its agents run as root on this one machine, and a
table here would reach every other test), and stays off: the networks are what change.
Turning it on and off is the admin API's test (tests/server/api/test_firewall_api.py),
a table loaded the netns test's (tests/agent/test_firewall_netns.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e


def kept(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def test_a_firewall_change_reaches_a_running_agent_without_a_restart(cluster: Cluster) -> None:
    cluster.start_agent("n1", cluster.token())
    cluster.wait_state("n1", "Ready", 20)
    plan_file = cluster.state_dir("n1") / "firewall.json"
    first = wait_for(lambda: kept(plan_file), 10, "the agent's first firewall plan")
    assert first["enabled"] is False and first["networks"] == []
    server_pid = cluster.server.popen.pid if cluster.server else None
    agent_pid = cluster.agents["n1"].popen.pid

    answer = cluster.api("/api/v1/firewall", body={"networks": ["10.20.0.0/16"]})
    assert answer["enabled"] is False and answer["networks"] == ["10.20.0.0/16"]
    changed = wait_for(
        lambda: (p := kept(plan_file)) and p["networks"] and p, 10, "the plan to follow"
    )
    assert changed["networks"] == ["10.20.0.0/16"] and changed["enabled"] is False

    cluster.api("/api/v1/firewall", body={"unset": True})
    back = wait_for(lambda: (p := kept(plan_file)) and not p["networks"] and p, 10, "server.yaml's")
    assert back["enabled"] is False
    # Nothing was started again to apply it.
    assert cluster.server and cluster.server.alive() and cluster.server.popen.pid == server_pid
    assert cluster.agents["n1"].alive() and cluster.agents["n1"].popen.pid == agent_pid
