"""The agents' settings from the cluster, end to end: ``ctl config set`` reaches every
agent, a node's own value wins on that node only, a bad value is refused with nothing
changed, and each node says what it runs with and where each setting came from."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.e2e.catalog import replicas, scheduled, serve_tiny, wait_ready
from tests.e2e.cluster import Cluster, run, wait_for


def ctl(cluster: Cluster, *args: str, check: bool = True) -> Any:
    return run(
        "ctl", *args, "--server", cluster.listen, "--token", cluster.admin_token, check=check
    )


def setting(cluster: Cluster, node: str, key: str) -> dict[str, Any] | None:
    reported = cluster.nodes()[node].get("settings") or {}
    return (reported.get("values") or {}).get(key)


def reaches(cluster: Cluster, wanted: dict[str, dict[str, Any]], key: str) -> float:
    """Seconds until every node in ``wanted`` reports ``key`` as wanted there."""
    start = time.monotonic()

    def check() -> bool:
        nodes = cluster.nodes()
        return all(
            n.get("state") == "Ready"
            and ((n.get("settings") or {}).get("values") or {}).get(key) == wanted[i]
            for i, n in nodes.items()
            if i in wanted
        )

    wait_for(check, 20, f"{key} as {wanted} on every node")
    return time.monotonic() - start


def test_settings_reach_every_agent_and_a_nodes_own_wins_there(cluster: Cluster) -> None:
    for node in ("a", "b"):
        cluster.start_agent(node, cluster.token())
        cluster.wait_state(node, "Ready", 20)
    assert setting(cluster, "a", "discovery.slow_interval") == {"value": 15.0, "source": "default"}

    ctl(cluster, "config", "set", "discovery.slow_interval", "7")
    took = reaches(
        cluster,
        {n: {"value": 7.0, "source": "cluster"} for n in ("a", "b")},
        "discovery.slow_interval",
    )
    # The agents start again to apply it (a second or two of Python starting).
    assert took < 10, f"the setting took {took:.1f} s to reach both agents"

    ctl(cluster, "config", "set", "discovery.slow_interval", "9", "--node", "b")
    reaches(
        cluster,
        {"a": {"value": 7.0, "source": "cluster"}, "b": {"value": 9.0, "source": "node"}},
        "discovery.slow_interval",
    )
    # a's settings changed version, not what it runs with: said without a restart.
    wait_for(lambda: cluster.nodes()["a"]["settings"]["version"] == 2, 10, "a to take version 2")

    before = json.loads(ctl(cluster, "config", "get", "--json").stdout)
    refused = ctl(cluster, "config", "set", "heartbeat_interval", "soon", check=False)
    assert refused.returncode != 0 and "heartbeat_interval" in refused.stderr
    refused = ctl(cluster, "config", "set", "server", "elsewhere:8080", check=False)
    assert refused.returncode != 0 and "identity" in refused.stderr
    assert json.loads(ctl(cluster, "config", "get", "--json").stdout) == before
    assert (
        ctl(cluster, "config", "get", "discovery.slow_interval", "--node", "b").stdout.strip()
        == "9"
    )

    history = json.loads(ctl(cluster, "config", "history", "--json").stdout)
    assert [h["change"] for h in history] == [
        "discovery.slow_interval = 9",
        "discovery.slow_interval = 7",
    ]
    assert history[0]["layer"] == "agents.nodes.b"
    table = ctl(cluster, "config", "history").stdout
    assert "agents.nodes.b" in table and "discovery.slow_interval = 7" in table

    ctl(cluster, "config", "unset", "discovery.slow_interval", "--node", "b")
    reaches(cluster, {"b": {"value": 7.0, "source": "cluster"}}, "discovery.slow_interval")


def test_an_agent_started_again_for_its_settings_keeps_its_engine_serving(
    tmp_path: Path, binary: Path
) -> None:
    cluster = scheduled(tmp_path)
    try:
        serve_tiny(cluster, binary, "a")
        (before,) = replicas(cluster, "tiny")
        assert before["state"] == "ready" and before["pid"]
        ctl(cluster, "config", "set", "discovery.slow_interval", "11")
        reaches(cluster, {"a": {"value": 11.0, "source": "cluster"}}, "discovery.slow_interval")
        assert "starting again" in (cluster.root / "agent-a.log").read_text()
        (after,) = wait_ready(cluster, "tiny", 1)
        # The same engine process, adopted by the agent that started again.
        assert after["pid"] == before["pid"] and after["replica_id"] == before["replica_id"]
    finally:
        cluster.stop()
