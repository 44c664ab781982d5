"""A store that cannot be written: made immutable (``chattr +i``, as root) while the
control plane runs and before it starts. Writes answer 503 naming the problem and its
fix, health and status say so, ``/v1`` keeps serving, usage is kept and written once
the store can be written again, which the control plane finds by itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.catalog import ctl, ctl_json, scheduled, serve_tiny
from tests.e2e.cluster import Cluster, run, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("chattr") is None, reason="chattr +i needs root"
    ),
]


def store_files(cluster: Cluster) -> list[Path]:
    return [cluster.data_dir, *sorted(cluster.data_dir.glob("store.db*"))]


def chattr(flag: str, paths: list[Path]) -> None:
    subprocess.run(["chattr", flag, *map(str, paths)], check=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        chattr("-i", store_files(c))
        c.stop()


def chat(cluster: Cluster, key: str) -> dict[str, Any]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    req = urllib.request.Request(
        f"http://{cluster.listen}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def health(cluster: Cluster) -> dict[str, Any]:
    return cluster.api("/healthz", auth=False)  # type: ignore[no-any-return]


def used(cluster: Cluster, key_name: str) -> int:
    rows = ctl_json(cluster, "usage")
    return sum(r["requests"] for r in rows if r["key_name"] == key_name)


def test_a_store_made_unwritable_while_running(cluster: Cluster, binary: Path) -> None:
    serve_tiny(cluster, binary)
    key = ctl_json(cluster, "keys", "create", "--name", "before")["key"]
    chat(cluster, key)
    wait_for(lambda: used(cluster, "before") == 1, 10, "the first request's usage written")

    chattr("+i", store_files(cluster))
    status, answer = cluster.api_error("/api/v1/keys", body={"name": "during"})
    assert status == 503 and answer["error"]["type"] == "store_unavailable"
    assert "store.db" in answer["error"]["message"] and "chattr -i" in answer["error"]["message"]
    out = ctl(cluster, "keys", "create", "--name", "during", check=False)
    assert out.returncode != 0 and "cannot be written" in out.stderr and "HTTP" not in out.stderr
    assert health(cluster)["ok"] is False and health(cluster)["store_writable"] is False
    status_json = json.loads(run("status", "--json", "--data-dir", str(cluster.data_dir)).stdout)
    assert status_json["store_writable"] is False and "store.db" in status_json["store_problem"]
    assert "NOT WRITABLE" in run("status", "--data-dir", str(cluster.data_dir)).stdout

    for _ in range(3):  # /v1 serves from memory; its usage is kept
        assert chat(cluster, key)["choices"]
    assert [k["name"] for k in ctl_json(cluster, "keys", "list")] == ["before"]  # nothing half-made

    chattr("-i", store_files(cluster))
    wait_for(lambda: health(cluster)["ok"], 15, "the control plane to find the store writable")
    assert used(cluster, "before") == 4  # the three served meanwhile, written after
    made = ctl_json(cluster, "keys", "create", "--name", "after")
    assert made["state"] == "active"
    log = cluster.server.text() if cluster.server else ""
    assert log.count("the store cannot be written") <= 2  # said, not once a write
    assert "Traceback" not in log


def test_a_control_plane_started_on_an_unwritable_store(cluster: Cluster, binary: Path) -> None:
    serve_tiny(cluster, binary)
    key = ctl_json(cluster, "keys", "create", "--name", "k")["key"]
    assert cluster.server is not None
    cluster.server.stop()
    chattr("+i", store_files(cluster))
    cluster.start_server()
    assert health(cluster)["store_writable"] is False
    cluster.wait_state("a", "Ready", 20)  # the agent comes back; its state is kept in memory
    wait_for(lambda: chat(cluster, key)["choices"], 30, "the replica to serve again")
    status, answer = cluster.api_error("/api/v1/keys", body={"name": "x"})
    assert status == 503 and answer["error"]["type"] == "store_unavailable"

    chattr("-i", store_files(cluster))
    wait_for(lambda: health(cluster)["ok"], 15, "the store to be found writable")
    assert ctl_json(cluster, "keys", "create", "--name", "y")["state"] == "active"
    wait_for(lambda: used(cluster, "k") >= 1, 10, "the usage served meanwhile, written")
    node = cluster.api("/api/v1/nodes/a")
    assert node["state"] == "Ready"
