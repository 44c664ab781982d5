"""One replica spanning two nodes, for real: two agents on loopback, llama-server on the
first with ``--rpc`` naming the ``ggml-rpc-server`` the second runs, the model's layers
on the RPC devices, answering `/v1` through the openai SDK; a worker killed is the whole
replica failed, placed again as one."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from tests.e2e.catalog import ctl, ctl_json, join, replicas, scheduled, serve, wait_ready
from tests.e2e.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def split(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (leader,) = [r for r in rows if "~" not in r["replica_id"]]
    (worker,) = [r for r in rows if "~" in r["replica_id"]]
    return leader, worker


def test_a_replica_spans_two_nodes_answers_and_is_placed_again_when_its_worker_dies(
    cluster: Cluster, binary: Path, model: Path
) -> None:
    join(cluster, "a", binary)
    join(cluster, "b", binary)
    serve(cluster, model, "wide", "--nodes", "2")
    leader, worker = split(wait_ready(cluster, "wide", 2, timeout=90))
    assert worker["replica_id"] == leader["replica_id"] + "~1"
    assert {leader["node"], worker["node"]} == {"a", "b"}
    assert "rank 1 of" in worker["note"]

    # The worker is an RPC server on its node's address; the leader names it in --rpc
    # and put the model's layers on it.
    rpc = psutil.Process(worker["pid"]).cmdline()
    assert Path(rpc[0]).name == "ggml-rpc-server"
    assert rpc[1:5] == ["-H", "127.0.0.1", "-p", str(worker["port"])]
    argv = psutil.Process(leader["pid"]).cmdline()
    assert argv[argv.index("--rpc") + 1] == f"127.0.0.1:{worker['port']}"
    assert any(f"127.0.0.1:{worker['port']}" in d for d in leader["devices"]), leader
    assert leader["backend"] == "RPC"

    explained = ctl_json(cluster, "explain", "wide")[0]
    assert explained["nodes"] == 2
    best = explained["spans"][0]
    assert best["kind"] == "ethernet" and best["ok"]
    assert sorted(best["chosen"]) == ["a", "b"]
    assert "Ethernet" in ctl(cluster, "explain", "wide").stdout

    key = ctl_json(cluster, "keys", "create", "--name", "t")["key"]
    with openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0) as sdk:
        reply = sdk.chat.completions.create(
            model="wide", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert reply.choices[0].message.content is not None
        assert reply.usage is not None and reply.usage.completion_tokens > 0

        # The worker's RPC server dies: the replica as a whole fails and is placed
        # again as one, leader and worker both new.
        psutil.Process(worker["pid"]).send_signal(signal.SIGKILL)

        def replaced() -> tuple[dict[str, Any], dict[str, Any]] | None:
            rows = replicas(cluster, "wide")
            ids = {r["replica_id"] for r in rows}
            if leader["replica_id"] in ids or len(rows) != 2:
                return None
            if any(r["state"] != "ready" for r in rows):
                return None
            return split(rows)

        again, again_worker = wait_for(replaced, 90, "the replica placed again")
        assert again_worker["replica_id"] == again["replica_id"] + "~1"
        assert not psutil.pid_exists(leader["pid"]) or (
            psutil.Process(leader["pid"]).status() == psutil.STATUS_ZOMBIE
        )
        shown = ctl_json(cluster, "model", "show", "wide")
        assert shown["profiles"][0]["nodes"] == 2
        reply = sdk.chat.completions.create(
            model="wide", messages=[{"role": "user", "content": "again"}], max_tokens=4
        )
        assert reply.choices[0].message.content is not None

    # A worker's command line names no file of the test: it is still found and stopped
    # with the test's cluster (engines outlive their agents by design, not their tests).
    cluster.stop()
    assert not psutil.pid_exists(again_worker["pid"]) or (
        psutil.Process(again_worker["pid"]).status() == psutil.STATUS_ZOMBIE
    )
