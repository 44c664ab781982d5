"""A real llama-server run as a shard: installed from a release mirror, started with its
key, watched, logged, adopted after the agent is killed, stopped; and every refusal."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from llmgw import pki
from tests.e2e.cluster import Cluster, free_port, run, wait_for
from tests.support.engines import (
    LoopThread,
    Mirror,
    missing_library_binary,
)
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture
def mirror(tmp_path: Path, binary: Path) -> Iterator[Mirror]:
    m = Mirror(tmp_path / "mirror")
    m.publish("b1", {"build/bin/llama-server": binary})
    try:
        yield m
    finally:
        m.close()


def join(cluster: Cluster, node_id: str, mirror: Mirror, tag: str = "b1") -> None:
    config = cluster.root / f"{node_id}.yaml"
    config.write_text(f"release_source: {mirror.url}\nllamacpp_version: {tag}\n")
    cluster.start_agent(node_id, cluster.token(), ["--config", str(config)])
    cluster.wait_state(node_id, "Ready", 20)


def start(cluster: Cluster, node_id: str, replica_id: str, **spec: Any) -> None:
    body = {"replica_id": replica_id, "engine": "llama.cpp", "port": free_port(), **spec}
    answer = cluster.api(f"/api/v1/nodes/{node_id}/shards", body=body)
    assert answer == {"replica_id": replica_id, "node": node_id}


def replica(cluster: Cluster, replica_id: str) -> dict[str, Any] | None:
    rows = [r for r in cluster.api("/api/v1/replicas") if r["replica_id"] == replica_id]
    return rows[0] if rows else None


def wait_replica(cluster: Cluster, replica_id: str, state: str, timeout: float = 60) -> Any:
    def check() -> dict[str, Any] | None:
        row = replica(cluster, replica_id)
        if row and row["state"] == "failed" and state != "failed":
            raise AssertionError(f"{replica_id} failed: {row['reason']}\n{row['last_lines']}")
        return row if row and row["state"] == state else None

    return wait_for(check, timeout, f"replica {replica_id} {state}", step=0.25)


def test_shard_runs_with_its_key_survives_the_agent_and_is_adopted(
    cluster: Cluster, mirror: Mirror, model: Path
) -> None:
    join(cluster, "n1", mirror)
    node = cluster.nodes()["n1"]
    assert node["engines"] == []  # probed, and nothing installed yet: an honest empty list

    start(cluster, "n1", "r1", source=str(model), model="tiny", cpu_cores=1)
    row = wait_replica(cluster, "r1", "ready", 120)
    assert row["backend"] == "CPU" and row["offloaded_layers"] is None
    pid, port = row["pid"], row["port"]
    engines = cluster.nodes()["n1"]["engines"]
    assert [(e["name"], e["version"], e["build"]) for e in engines] == [("llama.cpp", "b1", "cpu")]

    key = pki.engine_key((cluster.data_dir / "cluster.key").read_bytes(), "r1")
    process = psutil.Process(pid)
    # The key reaches the engine in its environment, never on its command line.
    assert key not in " ".join(process.cmdline())
    assert process.environ().get("LLAMA_API_KEY") == key
    assert os.getpgid(pid) == pid  # its own process group

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert reply.choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong").models.list()

    # Usage arrives with heartbeats; logs on request.
    wait_for(lambda: (replica(cluster, "r1") or {}).get("rss"), 10, "engine RSS")
    out = run(
        "ctl", "logs", "n1", "--source", "r1", "-n", "50", "--data-dir", str(cluster.data_dir)
    )
    assert "listening on http://0.0.0.0:" in out.stdout
    out = run("ctl", "logs", "n1", "--data-dir", str(cluster.data_dir))
    assert "shard r1: ready" in out.stdout
    replicas = json.loads(
        run("ctl", "replicas", "--json", "--data-dir", str(cluster.data_dir)).stdout
    )
    assert [(r["replica_id"], r["state"], r["pid"]) for r in replicas] == [("r1", "ready", pid)]

    # Kill -9 the agent: the engine keeps serving.
    cluster.agents["n1"].signal(signal.SIGKILL)
    cluster.agents["n1"].popen.wait(5)
    cluster.wait_state("n1", "NotReady", 10)
    assert client.models.list().data
    # A new agent adopts it: same replica, same process.
    cluster.start_agent("n1", extra=["--config", str(cluster.root / "n1.yaml")])
    cluster.wait_state("n1", "Ready", 15)
    # Read from its state dir once the agent has registered: seconds on a busy machine.
    wait_for(lambda: "adopted shard r1" in cluster.agents["n1"].text(), 30, "adoption")
    row = wait_replica(cluster, "r1", "ready", 15)
    assert row["pid"] == pid and process.is_running()
    # What it runs on comes back with it (kept with the shard, not read from a log tail).
    assert (row["backend"], row["devices"], row["offloaded_layers"]) == ("CPU", [], None)
    assert client.models.list().data

    # Stop: the process group goes, the replica with it.
    run("ctl", "shard", "stop", "n1", "r1", "--data-dir", str(cluster.data_dir))
    wait_for(lambda: replica(cluster, "r1") is None, 15, "r1 to be gone")
    wait_for(
        lambda: not process.is_running() or process.status() == psutil.STATUS_ZOMBIE,
        10,
        "the engine to exit",
    )


def test_refusals_reach_the_control_plane_with_their_reason(
    cluster: Cluster, mirror: Mirror, model: Path, tmp_path: Path
) -> None:
    mirror.publish("b2", {"build/bin/llama-server": b"#!/bin/sh\n"}, checksum="0" * 64)
    mirror.publish("b3", {"build/bin/llama-server": missing_library_binary(tmp_path / "elf")})
    mirror.publish("b4", {"../evil": b"x", "build/bin/llama-server": b"#!/bin/sh\n"})
    for node_id, tag in (("nb", "b1"), ("sum", "b2"), ("lib", "b3"), ("evil", "b4")):
        join(cluster, node_id, mirror, tag)

    pickle = tmp_path / "weights.bin"
    pickle.write_bytes(b"\x80\x04not really")
    start(cluster, "nb", "pickled", source=str(pickle))
    start(cluster, "nb", "flagged", source=str(model), args=["-m", "/etc/passwd"])
    start(cluster, "sum", "checksum", source=str(model))
    start(cluster, "lib", "library", source=str(model))
    start(cluster, "evil", "escape", source=str(model))

    expected = {
        "pickled": "pickle",
        "flagged": "'-m' is not allowed",
        "checksum": "sha256",
        "library": "libllmgwgone.so",
        "escape": "..",
    }
    for replica_id, words in expected.items():
        row = wait_replica(cluster, replica_id, "failed", 60)
        assert words in row["reason"], (replica_id, row["reason"])
        assert "Error:" not in row["reason"]  # a reason in words, not an exception's name
    # The pickle was refused before anything was installed or fetched for it.
    assert "pickled: installing" not in cluster.agents["nb"].text()
    assert not (tmp_path / "evil").exists()
    assert cluster.nodes()["evil"]["engines"] == []


def test_two_shards_on_one_source_make_one_resumed_download(
    cluster: Cluster, mirror: Mirror, model: Path
) -> None:
    from tests.agent.weights.weights_fakehub import start_hub

    loop = LoopThread()
    hub, runner = loop.run(start_hub())
    try:
        data = model.read_bytes()
        # The first transfer is cut part way: the agent must resume it with Range.
        hub.add("llmgw/tiny-GGUF", "tiny-Q8_0.gguf", data, cut_after=len(data) // 3, cuts=1)
        config = cluster.root / "hub.yaml"
        config.write_text(
            f"release_source: {mirror.url}\nllamacpp_version: b1\nhf_endpoint: {hub.endpoint}\n"
        )
        cluster.start_agent("hubnode", cluster.token(), ["--config", str(config)])
        cluster.wait_state("hubnode", "Ready", 20)
        for replica_id in ("a", "b"):
            start(cluster, "hubnode", replica_id, source="hf:llmgw/tiny-GGUF:Q8_0")
        rows = [wait_replica(cluster, r, "ready", 120) for r in ("a", "b")]
        assert rows[0]["pid"] != rows[1]["pid"]
        downloads = hub.downloads("tiny-Q8_0.gguf")
        ranges = [r.headers.get("Range", "") for r in downloads]
        # One source, one download: the cut first try and its resumption, nothing more.
        assert len(downloads) == 2, ranges
        assert ranges[0] == "" and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
        listed = cluster.api("/api/v1/weights?node=hubnode")
        # Listed in the cache's normal form (org/repo lowercased, quantisation uppercased).
        (entry,) = [e for e in listed if e["source"] == "hf:llmgw/tiny-gguf:Q8_0"]
        assert entry["wanted"] is True and entry["complete"] is True
        assert entry["total_bytes"] == len(data)

        # In use, it is not collected; once no shard uses it, it is.
        out = json.loads(
            run("ctl", "weights", "--collect", "--json", "--data-dir", str(cluster.data_dir)).stdout
        )
        assert out[0]["asked"] == [] and Path(entry["path"]).exists()
        for replica_id in ("a", "b"):
            run("ctl", "shard", "stop", "hubnode", replica_id, "--data-dir", str(cluster.data_dir))
        wait_for(lambda: cluster.api("/api/v1/replicas") == [], 20, "both shards stopped")
        out = json.loads(
            run("ctl", "weights", "--collect", "--json", "--data-dir", str(cluster.data_dir)).stdout
        )
        assert out[0]["removed"] == [entry["name"]] and out[0]["still_listed"] == []
        assert out[0]["freed_bytes"] >= len(data)
        assert not Path(entry["path"]).exists()
    finally:
        loop.run(runner.cleanup())
        loop.close()


def test_crash_is_reported_with_last_lines_and_weights_are_collected(
    cluster: Cluster, mirror: Mirror, model: Path, tmp_path: Path
) -> None:
    import subprocess
    import sys

    join(cluster, "c1", mirror)
    start(cluster, "c1", "crashy", source=str(model))
    row = wait_replica(cluster, "crashy", "ready", 120)

    # Follow the engine's log while it dies.
    follow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw",
            "ctl",
            "logs",
            "c1",
            "--source",
            "crashy",
            "-n",
            "1",
            "--follow",
            "--data-dir",
            str(cluster.data_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = follow.stdout.readline() if follow.stdout else ""
        assert first.strip(), "ctl logs --follow printed nothing"
        os.kill(row["pid"], signal.SIGKILL)
        failed = wait_replica(cluster, "crashy", "failed", 15)
        assert "exited" in failed["reason"]
        assert failed["last_lines"] and any("llama" in x for x in failed["last_lines"])
    finally:
        follow.terminate()
        follow.communicate(timeout=5)  # reaps it and closes its pipes

    # A cached source no shard uses is collected; the node proves each path first.
    cache = cluster.root / "weights-c1"
    cache.mkdir(parents=True, exist_ok=True)
    stranger = cache / "my-own-copy"
    stranger.mkdir()
    (stranger / "model.gguf").write_bytes(b"an operator's file")
    listed = json.loads(
        run("ctl", "weights", "c1", "--json", "--data-dir", str(cluster.data_dir)).stdout
    )
    assert all(not e.get("wanted") for e in listed)
    out = json.loads(
        run("ctl", "weights", "--collect", "--json", "--data-dir", str(cluster.data_dir)).stdout
    )
    (node,) = [n for n in out if n["node"] == "c1"]
    assert "my-own-copy" not in node["removed"]
    assert stranger.exists() and (stranger / "model.gguf").read_bytes() == b"an operator's file"
    assert node["still_listed"] == []


@pytest.fixture
def open_cluster() -> Iterator[Cluster]:
    """A cluster in a folder of its own under /tmp, open to every user down to the
    agent's dirs, as an operator's /var/lib is. Not in pytest's temporary tree: pytest
    keeps its folders 0700, and a worker of the same run that makes its own first folder
    then closes them again under this test."""
    root = Path(tempfile.mkdtemp(prefix="llmgw-asuser-"))
    root.chmod(0o755)
    c = Cluster(root)
    c.init()
    c.start_server()
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="running engines as another user needs root")
def test_engine_runs_as_the_engines_user(
    open_cluster: Cluster, mirror: Mirror, model: Path
) -> None:
    import pwd

    cluster = open_cluster
    nobody = pwd.getpwnam("nobody")
    shared = cluster.root / "shared-model"
    shared.mkdir(mode=0o755)
    readable = shared / "tiny.gguf"
    readable.write_bytes(model.read_bytes())
    config = cluster.root / "u1.yaml"
    config.write_text(f"release_source: {mirror.url}\nllamacpp_version: b1\nengine_user: nobody\n")
    cluster.start_agent("u1", cluster.token(), ["--config", str(config)])
    cluster.wait_state("u1", "Ready", 20)
    start(cluster, "u1", "asuser", source=str(readable))
    row = wait_replica(cluster, "asuser", "ready", 120)
    process = psutil.Process(row["pid"])
    assert process.uids().real == nobody.pw_uid
    assert "installing: downloading llama-b1-bin-ubuntu-x64.tar.gz" in cluster.agents["u1"].text()
