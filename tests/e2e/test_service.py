"""``llmgw service`` without systemd, for real: an agent installed under a scratch prefix
as ``node add`` installs it on a machine without systemd (the zipapp at
PREFIX/llmgw.pyz, PREFIX/agent.yaml), started by ``service start`` with ``node add``'s
own launch shell (nohup'd, its pid in PREFIX/agent.pid), then restarted, stopped and
started again, each step seen by its status and by the control plane."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import pytest

from llmgw.config import AgentConfig, dump
from tests.e2e.cluster import Cluster, run, wait_for

pytestmark = pytest.mark.e2e


def service(prefix: Path, *args: str) -> Any:
    done = run("service", *args, "--role", "agent", "--prefix", str(prefix), "--json")
    (row,) = json.loads(done.stdout)
    return row


def registrations(prefix: Path) -> int:
    log = prefix / "agent.log"
    return log.read_text().count("registered with") if log.exists() else 0


def test_an_agent_installed_without_systemd_is_started_stopped_and_restarted(
    cluster: Cluster, tmp_path: Path, zipapp: Path
) -> None:
    prefix = tmp_path / "opt-llmgw"
    prefix.mkdir()
    (prefix / "llmgw.pyz").symlink_to(zipapp)
    config = AgentConfig(
        server=cluster.listen,
        token=cluster.token(),
        node_id="svc",
        state_dir=str(prefix / "state"),
        weights_dir=str(prefix / "weights"),
    )
    (prefix / "agent.yaml").write_text(dump(config))
    try:
        assert service(prefix, "status")["state"] == "inactive"

        first = service(prefix, "start")
        assert (first["state"], first["manager"]) == ("active", "nohup")
        assert first["unit"] == str(prefix / "agent.pid") and first["since"] is not None
        assert str(prefix / "llmgw.pyz") in psutil.Process(first["pid"]).cmdline()
        cluster.wait_state("svc", "Ready", 60)
        # Started already: a start changes nothing.
        assert service(prefix, "start")["pid"] == first["pid"]

        seen = registrations(prefix)
        again = service(prefix, "restart")
        assert again["state"] == "active" and again["pid"] != first["pid"]
        assert not psutil.pid_exists(first["pid"]) or psutil.Process(first["pid"]).status() == (
            psutil.STATUS_ZOMBIE
        )
        wait_for(lambda: registrations(prefix) > seen, 60, "the new agent to register")
        cluster.wait_state("svc", "Ready", 30)

        stopped = service(prefix, "stop")
        assert (stopped["state"], stopped["pid"]) == ("inactive", None)
        assert not (prefix / "agent.pid").exists()
        wait_for(lambda: not psutil.pid_exists(again["pid"]), 10, "the agent to exit")
        # Said in words too.
        text = run("service", "status", "--role", "agent", "--prefix", str(prefix)).stdout
        assert f"agent   {prefix / 'agent.pid'}: inactive (log: {prefix}/agent.log)" in text
    finally:
        run("service", "stop", "--prefix", str(prefix), check=False)
