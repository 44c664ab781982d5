"""A control plane and two agents as real processes: join, heartbeats, restarts, refusals."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, run, wait_for

pytestmark = pytest.mark.e2e


def test_two_agents_join_heartbeat_and_survive_restarts(cluster: Cluster) -> None:
    for node_id in ("alpha", "beta"):
        cluster.start_agent(node_id, cluster.token())
    for node_id in ("alpha", "beta"):
        node = cluster.wait_state(node_id, "Ready", 20)
        assert node["connected"] is True
        assert node["address"] == "127.0.0.1"
        assert node["memory_total"] > 0 and node["cpu_count"] > 0

    # Heartbeats arrive and carry live figures.
    before = cluster.api("/api/v1/status")["heartbeats"]
    wait_for(
        lambda: cluster.api("/api/v1/status")["heartbeats"] >= before + 4,
        10,
        "heartbeats from both agents",
    )
    assert cluster.nodes()["alpha"]["cpu_percent"] is not None

    certs = {n: (cluster.state_dir(n) / "node.crt").read_bytes() for n in ("alpha", "beta")}

    # An agent killed outright goes NotReady after 3 missed heartbeats (3 s here) ...
    cluster.agents["alpha"].signal(signal.SIGKILL)
    node = cluster.wait_state("alpha", "NotReady", 10)
    assert "missed 3 heartbeats" in node["reason"]
    assert cluster.nodes()["beta"]["state"] == "Ready"
    # ... and comes back Ready from its state dir, with no token and no new certificate.
    cluster.start_agent("alpha")
    cluster.wait_state("alpha", "Ready", 10)

    # The control plane killed outright and started again: every agent Ready within 10 s.
    assert cluster.server is not None
    cluster.server.signal(signal.SIGKILL)
    cluster.server.popen.wait(5)
    started = time.monotonic()
    cluster.start_server()
    for node_id in ("alpha", "beta"):
        cluster.wait_state(node_id, "Ready", 10)
    assert time.monotonic() - started < 10
    for node_id, cert in certs.items():
        assert (cluster.state_dir(node_id) / "node.crt").read_bytes() == cert, node_id
    assert "enrolled as node" not in cluster.agents["alpha"].text().split("agent for node")[-1]


def test_stopped_control_plane_is_noticed_by_ping(cluster: Cluster) -> None:
    agent = cluster.start_agent("gamma", cluster.token())
    cluster.wait_state("gamma", "Ready", 20)
    assert cluster.server is not None
    cluster.server.signal(signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        wait_for(
            lambda: "no answer to HTTP/2 PING" in agent.text(),
            10,
            "the agent to notice the stopped control plane",
        )
        assert time.monotonic() - stopped < 10
    finally:
        cluster.server.signal(signal.SIGCONT)
    cluster.wait_state("gamma", "Ready", 15)


def test_join_tokens_expired_reused_and_forged_are_refused(cluster: Cluster) -> None:
    from llmgw import jointoken

    def join_with(token: str, node_id: str) -> str:
        """Enroll ``node_id`` with ``token``; it must be refused: the reason given."""
        out = run(
            "agent",
            "run",
            "--server",
            cluster.listen,
            "--token",
            token,
            "--state-dir",
            str(cluster.root / node_id),
            "--node-id",
            node_id,
            check=False,
        )
        assert out.returncode == 1, out.stdout + out.stderr
        assert not (cluster.root / node_id / "node.crt").exists()
        return out.stderr

    token = cluster.token()
    cluster.start_agent("one", token)
    cluster.wait_state("one", "Ready", 20)
    assert "already used by node 'one'" in join_with(token, "two")

    short = cluster.token(ttl="1s")
    time.sleep(1.5)
    assert "expired" in join_with(short, "three")

    good = jointoken.parse(cluster.token())
    forged = jointoken.JoinToken(
        good.id, b"x" * 32, good.addresses, good.ca_fingerprint, good.expires_at
    )
    assert "forged" in join_with(forged.encode(), "four")
    invented = jointoken.JoinToken(
        "0" * 16, b"y" * 32, good.addresses, good.ca_fingerprint, good.expires_at
    )
    assert "not issued by this control plane" in join_with(invented.encode(), "five")
    assert set(cluster.nodes()) == {"one"}


def test_wrong_admin_token_gets_401_json(cluster: Cluster) -> None:
    code, body = cluster.api_error("/api/v1/nodes", token="llmgw-admin-wrong")
    assert code == 401
    assert body["error"]["type"] == "unauthorized"
    assert "admin token" in body["error"]["message"]
    code, body = cluster.api_error("/api/v1/status", auth=False)
    assert code == 401
    out = run("ctl", "nodes", "--server", cluster.listen, "--token", "nope", check=False)
    assert out.returncode == 1 and "admin token" in out.stderr


def test_gateway_wants_a_key_and_the_admin_token_is_not_one(cluster: Cluster) -> None:
    code, body = cluster.api_error("/v1/models", auth=False)
    assert code == 401 and body["error"]["type"] == "authentication_error"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    code, body = cluster.api_error("/v1/models")  # with the admin token
    assert code == 401 and body["error"]["code"] == "invalid_api_key"


def test_ctl_reads_the_data_dir_and_env(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.start_agent("delta", cluster.token())
    cluster.wait_state("delta", "Ready", 20)
    out = run("ctl", "nodes", "--data-dir", str(cluster.data_dir))
    assert out.stdout.splitlines()[0].split()[:2] == ["NODE", "STATE"]
    assert "delta" in out.stdout and "Ready" in out.stdout
    listed = json.loads(run("ctl", "nodes", "--json", "--data-dir", str(cluster.data_dir)).stdout)
    assert [n["id"] for n in listed] == ["delta"]
    env = {
        "LLMGW_SERVER": cluster.listen,
        "LLMGW_TOKEN": cluster.admin_token,
        "PATH": "/usr/bin:/bin",
        "HOME": str(cluster.root),
    }
    status = json.loads(run("ctl", "status", "--json", env=env).stdout)
    assert status["nodes"] == {"total": 1, "ready": 1, "not_ready": 0}
    env_dir = {
        "LLMGW_DATA_DIR": str(cluster.data_dir),
        "PATH": "/usr/bin:/bin",
        "HOME": str(cluster.root),
    }
    assert "1 Ready of 1" in run("ctl", "status", env=env_dir).stdout
    assert run("node", "token", env=env_dir).stdout.startswith("llmgw-join-1.")


def test_init_twice_refuses_and_changes_nothing(cluster: Cluster) -> None:
    files = {
        p: p.read_bytes()
        for p in cluster.data_dir.rglob("*")
        if p.is_file() and "store.db" not in p.name
    }
    out = run("server", "init", "--data-dir", str(cluster.data_dir), "--yes", check=False)
    assert out.returncode == 1
    assert "already initialised" in out.stderr and "server.yaml" in out.stderr
    assert {p: p.read_bytes() for p in files} == files


def test_bad_config_is_refused_naming_file_and_key(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    c.init()
    cfg = c.data_dir / "server.yaml"
    cfg.write_text(cfg.read_text() + "listn: 1.2.3.4:80\n")
    out = run("server", "run", "--data-dir", str(c.data_dir), check=False, timeout=20)
    assert out.returncode == 1
    assert str(cfg) in out.stderr and "unknown key 'listn'" in out.stderr
    assert "allowed: " in out.stderr


def test_doctor_checks_the_link_to_the_control_plane(cluster: Cluster) -> None:
    cluster.start_agent("epsilon", cluster.token())
    cluster.wait_state("epsilon", "Ready", 20)
    state = str(cluster.state_dir("epsilon"))
    out = run("doctor", "--json", "--state-dir", state, check=False)
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert {"cpu", "memory", "nvidia", "clock", "route", "tls", "certificate"} <= set(checks)
    assert checks["tls"]["status"] == "ok", checks["tls"]
    assert checks["route"]["detail"].endswith("from 127.0.0.1")
    assert all(c["fix"] for c in checks.values() if c["status"] != "ok")

    assert cluster.server is not None
    cluster.server.stop()
    out = run("doctor", "--state-dir", state, check=False)
    assert out.returncode == 1
    assert "FAIL  tls" in out.stdout and "fix: start the control plane" in out.stdout
