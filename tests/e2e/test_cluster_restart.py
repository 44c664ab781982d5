"""``llmgw restart`` on a real cluster: a leader, a standby joined with `server join`, and
a node running the built llama-server serving the tiny model.

Every process starts again in place: the agent over its stream (same pid, since it execs
itself, and a new registration), the standby over the control planes' link, then the
leader; each control plane answers with a later start, the engine keeps its pid (the
new agent adopts it), and the model answers after."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.catalog import ctl_json, join, serve, wait_ready
from tests.e2e.cluster import Cluster, run, wait_for
from tests.e2e.standbys import answered
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e


def started(cluster: Cluster) -> float:
    """When the control plane started, by its uptime."""
    return time.time() - float(cluster.api("/api/v1/status")["uptime_seconds"])


def test_llmgw_restart_starts_every_process_again_and_engines_keep_serving(
    pair: tuple[Cluster, Cluster], binary: Path
) -> None:
    leader, standby = pair
    join(leader, "n1", binary)
    serve(leader, write_tiny_model(leader.root / "tiny.gguf"), "tiny")
    (row,) = wait_ready(leader, "tiny", 1)
    key = ctl_json(leader, "keys", "create", "--name", "after")["key"]
    # The leader hears from the standby (its role, for the order) every 2 s.
    wait_for(
        lambda: {s["name"]: s["role"] for s in ctl_json(leader, "servers")}.get("cp-b"),
        10,
        "the leader to hear from the standby",
    )
    agent = leader.agents["n1"]
    registered = agent.text().count("registered with")
    before = {"cp-a": started(leader), "cp-b": started(standby)}
    servers = {"cp-a": leader.server, "cp-b": standby.server}

    # Asked of the standby: refused, naming the leader, and nothing restarts.
    refused = run("restart", "--data-dir", str(standby.data_dir), check=False)
    assert refused.returncode == 1
    assert "standby" in refused.stderr and leader.listen in refused.stderr, refused.stderr
    assert leader.api("/api/v1/restart")["stage"] == "idle"

    done = run(
        "restart", "--json", "--timeout", "150", "--data-dir", str(leader.data_dir), timeout=180
    )
    doc = json.loads(done.stdout)

    assert doc["stage"] == "done", doc
    (n1,) = doc["agents"]
    assert (n1["node"], n1["state"], n1["engines_kept"]) == ("n1", "back", True), n1
    assert n1["engines"] == {row["replica_id"]: row["pid"]}
    # Standbys before the leader, and the one asked (the leader here) last.
    assert [(p["name"], p["state"]) for p in doc["control_planes"]] == [
        ("cp-b", "back"),
        ("cp-a", "back"),
    ]
    # The agent: the same process (it execs itself: the pid never exited), registered
    # again on a new stream.
    assert agent.alive() and "agent" in psutil.Process(agent.popen.pid).cmdline()
    wait_for(
        lambda: agent.text().count("registered with") > registered, 30, "the agent to register"
    )
    # Both control planes: the same processes, started again (a later start).
    for name, cluster in (("cp-a", leader), ("cp-b", standby)):
        proc = servers[name]
        assert proc is not None and proc.alive()
        assert started(cluster) > before[name] + 0.5, name
    leader.wait_state("n1", "Ready", 30)
    # The engine kept serving: the same pid, and the model answers.
    (again,) = wait_ready(leader, "tiny", 1)
    assert (again["replica_id"], again["pid"]) == (row["replica_id"], row["pid"])
    wait_for(lambda: answered(leader, key), 20, "the model to answer through the leader")
