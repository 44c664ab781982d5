"""A control plane restarted under load serves from the first request it takes: four
clients (the official openai SDK) chat without pause while the control plane is killed
(-9) and started again, three times: with its agent coming back as usual, with its agent
stopped (SIGSTOP) across the restart, and with one engine killed while it was down.

What a client sees: while the process is down, the connection refused (and a request in
flight when it died, its connection closed): the SDK's ``APIConnectionError``. From the
moment the control plane listens again, every request is answered 200: it routes to the
replicas the store remembers once their engines answer its probe with their keys, so
there is no ``503 no_replica`` while the agent reconnects, nor while it stays away."""

from __future__ import annotations

import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.e2e.catalog import ctl_json, join, scheduled, serve, wait_ready
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.load import KeptLoad as Load
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e

VOUCHED = re.compile(r'^llmgw_replica_vouched_by_probe\{model="tiny",replica="([^"]+)"\} 1$', re.M)


def restart(cluster: Cluster) -> float:
    """Kill the control plane (-9) and start it again; when it listened again."""
    assert cluster.server is not None
    cluster.server.signal(signal.SIGKILL)
    cluster.server.popen.wait(10)
    cluster.start_server()  # returns once /healthz answers
    return time.monotonic()


def vouched(cluster: Cluster) -> set[str]:
    req = urllib.request.Request(
        f"http://{cluster.listen}/metrics",
        headers={"authorization": f"Bearer {cluster.admin_token}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return set(VOUCHED.findall(resp.read().decode()))


def gone(pid: int) -> bool:
    """Exited (a zombie while its agent is stopped and cannot reap it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def test_a_control_plane_restart_under_load_answers_no_503(cluster: Cluster, binary: Path) -> None:
    join(cluster, "a", binary)
    serve(cluster, write_tiny_model(cluster.root / "tiny.gguf"), "tiny", "--replicas", "2")
    rows = wait_ready(cluster, "tiny", 2)
    pids = {r["replica_id"]: r["pid"] for r in rows}
    key = ctl_json(cluster, "keys", "create", "--name", "load")["key"]
    agent = cluster.agents["a"]

    with Load(cluster, key) as load:
        # 1. Killed and started again: served at once, and while the agent comes back.
        listening = restart(cluster)
        cluster.wait_state("a", "Ready", 20)
        load.flowing_for(3)
        load.check(listening)
        assert load.served(listening) > 0

        # 2. The agent stopped across the restart: the node stays NotReady, and the
        # engines the store remembers serve on their probe's word.
        agent.signal(signal.SIGSTOP)
        listening = restart(cluster)
        load.flowing_for(10)
        assert cluster.nodes()["a"]["state"] == "NotReady"
        assert vouched(cluster) == set(pids)
        load.check(listening)
        agent.signal(signal.SIGCONT)
        cluster.wait_state("a", "Ready", 20)
        again = wait_ready(cluster, "tiny", 2)
        assert {r["replica_id"]: r["pid"] for r in again} == pids  # adopted, untouched
        load.flowing_for(3)
        load.check(listening)

        # 3. An engine killed while the control plane was down: its replica is not used.
        agent.signal(signal.SIGSTOP)
        assert cluster.server is not None
        cluster.server.signal(signal.SIGKILL)
        cluster.server.popen.wait(10)
        dead, alive = sorted(pids)
        psutil.Process(pids[dead]).kill()
        wait_for(lambda: gone(pids[dead]), 10, "the engine to die")
        cluster.start_server()
        listening = time.monotonic()
        load.flowing_for(8)
        assert vouched(cluster) == {alive}
        load.check(listening)
        agent.signal(signal.SIGCONT)
        cluster.wait_state("a", "Ready", 20)
        load.flowing_for(3)
        load.check(listening)
