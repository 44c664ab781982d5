"""Serving outlives its agent: with four clients chatting, the node's agent is killed
(-9) for 30 s, stopped (SIGSTOP) for 15 s, and killed again while an engine dies. The
control plane checks the engines of a silent agent itself, so no request fails; a dead
engine's requests move to the other replica; the agent comes back and adopts what runs.

30 s is ten times the node-lost grace these tests run with (3 s), seven times the
reconciler's longest backoff (4 s) and three times a breaker's open time (10 s): every
timer that could act on a silent node has fired several times over by then."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.e2e.catalog import ctl_json, join, replicas, scheduled, serve, wait_ready
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.load import Load, metrics_text, vouched_lines
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def test_an_agents_death_never_stops_serving(cluster: Cluster, binary: Path) -> None:
    join(cluster, "a", binary)
    serve(cluster, write_tiny_model(cluster.root / "tiny.gguf"), "tiny", "--replicas", "2")
    rows = wait_ready(cluster, "tiny", 2)
    pids = {r["replica_id"]: r["pid"] for r in rows}
    key = ctl_json(cluster, "keys", "create", "--name", "load")["key"]
    agent = cluster.agents["a"]

    with Load(cluster, key) as load:
        # 1. kill -9 the agent: the node goes NotReady, its engines go on serving.
        agent.signal(signal.SIGKILL)
        agent.popen.wait(10)
        cluster.wait_state("a", "NotReady", 20)
        load.flowing_for(30)
        # The agent returns and adopts both engines, untouched.
        join(cluster, "a", binary, token=False)
        again = wait_ready(cluster, "tiny", 2)
        assert {r["replica_id"]: r["pid"] for r in again} == pids
        load.flowing_for(3)

        # 2. The agent stopped (SIGSTOP) for 15 s: the same.
        agent = cluster.agents["a"]
        agent.signal(signal.SIGSTOP)
        cluster.wait_state("a", "NotReady", 20)
        load.flowing_for(15)
        agent.signal(signal.SIGCONT)
        cluster.wait_state("a", "Ready", 20)
        load.flowing_for(3)

        # 3. An engine dies while its agent is gone: its requests go to the other.
        agent.signal(signal.SIGKILL)
        agent.popen.wait(10)
        cluster.wait_state("a", "NotReady", 20)
        dead, alive = sorted(pids)
        os.kill(pids[dead], signal.SIGKILL)
        wait_for(lambda: not psutil.pid_exists(pids[dead]), 10, "the engine to die")
        load.flowing_for(15)
        assert load.errors == []

    metrics = metrics_text(cluster)
    assert f'llmgw_replica_vouched_by_probe{{model="tiny",replica="{alive}"}} 1' in metrics
    assert f'replica="{dead}"' not in vouched_lines(metrics)  # dropped by the probe
    assert replicas(cluster, "tiny")  # the control plane still shows what the node ran
