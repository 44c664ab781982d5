"""The engines the fleet runs, decided by the control plane: two agents installing the
named llama.cpp release from a loopback mirror in the background, a version change
converging on both with the model's replicas replaced one at a time (never fewer ready
than asked) and the old version removed, and a release failing its pinned sha256 leaving
the old version serving with the node's words for why."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.catalog import ctl, ctl_json, replicas, scheduled, serve, wait_ready
from tests.e2e.cluster import Cluster, wait_for
from tests.support.engines import ASSET, Mirror
from tests.support.pyindex import PackageIndex, standin_wheel
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e


@pytest.fixture
def mirror(tmp_path: Path, binary: Path) -> Iterator[Mirror]:
    m = Mirror(tmp_path / "mirror")
    for tag in ("b1", "b2", "b3"):
        m.publish(tag, {"build/bin/llama-server": binary})
    try:
        yield m
    finally:
        m.close()


def rows(cluster: Cluster) -> list[dict[str, Any]]:
    return list(ctl_json(cluster, "engines")["nodes"])


def converged(cluster: Cluster, version: str) -> list[dict[str, Any]] | None:
    found = rows(cluster)
    ok = len(found) == 2 and all(r["state"] == "ready" and r["wanted"] == version for r in found)
    return found if ok else None


def engine_of(pid: int) -> str | None:
    """The install directory a replica's engine runs from (``b2-cpu``); None for a
    process that has just ended."""
    try:
        return Path(psutil.Process(pid).exe()).parents[2].name
    except psutil.NoSuchProcess:
        return None


class ReadyWatch:
    """Counts the model's ready replicas every 50 ms while a change runs: the fewest
    seen is what clients could have been left with."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster, self.name = cluster, name
        self.fewest = 99
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.05):
            ready = [r for r in replicas(self.cluster, self.name) if r["state"] == "ready"]
            self.fewest = min(self.fewest, len(ready))

    def stop(self) -> int:
        self.done.set()
        self.thread.join(5)
        return self.fewest


def test_engine_versions_converge_one_replica_at_a_time(tmp_path: Path, mirror: Mirror) -> None:
    cluster = scheduled(tmp_path, "engines:\n  llama.cpp: b1\n")
    try:
        for node in ("a", "b"):
            config = tmp_path / f"{node}.yaml"
            config.write_text(f"release_source: {mirror.url}\n")
            cluster.start_agent(node, cluster.token(), ["--config", str(config)])
        # Both install b1 in the background, before any model asks for it.
        found = wait_for(lambda: converged(cluster, "b1"), 60, "both nodes on b1")
        assert {(r["node"], tuple(r["versions"]), r["build"]) for r in found} == {
            ("a", ("b1",), "auto"),
            ("b", ("b1",), "auto"),
        }
        wanted = ctl_json(cluster, "engines")["engines"]
        assert wanted == [
            {
                "engine": "llama.cpp",
                "version": "b1",
                "sha256": {},
                "index_url": None,
                "packages": {},
                "source": "server.yaml",
            }
        ]

        serve(cluster, write_tiny_model(tmp_path / "tiny.gguf"), "tiny", "--replicas", "2")
        before = wait_ready(cluster, "tiny", 2, 120)
        assert {engine_of(r["pid"]) for r in before} == {"b1-cpu"}

        watch = ReadyWatch(cluster, "tiny")
        try:
            out = ctl(cluster, "engines", "set", "llama.cpp", "2")  # 2 is llama.cpp's b2
            assert "llama.cpp 2" in out.stdout
            wait_for(lambda: converged(cluster, "b2"), 60, "both nodes on b2")

            def moved() -> list[dict[str, Any]] | None:
                now = [r for r in replicas(cluster, "tiny") if r["state"] == "ready"]
                on_b2 = [r for r in now if r["pid"] and engine_of(r["pid"]) == "b2-cpu"]
                return now if len(now) == 2 and len(on_b2) == 2 else None

            try:
                after = wait_for(moved, 120, "both replicas running b2", step=0.2)
            except AssertionError:
                print(ctl(cluster, "model", "show", "tiny").stdout)
                print(replicas(cluster, "tiny"))
                print(rows(cluster))
                raise
        finally:
            fewest = watch.stop()
        assert fewest >= 2, f"only {fewest} replica(s) were ready during the change"
        assert {r["replica_id"] for r in after}.isdisjoint(r["replica_id"] for r in before)
        # b1 is gone from both nodes once nothing runs it.
        wait_for(
            lambda: all(r["versions"] == ["b2"] for r in rows(cluster)),
            30,
            "b1 removed from both nodes",
        )
        history = ctl_json(cluster, "engines", "history")
        assert [(e["action"], e["change"]) for e in history] == [("engines.set", "llama.cpp b2")]

        # b3 pinned to a digest its archive does not have: refused, b2 keeps serving.
        bad = "0" * 64
        asset = ASSET.format(tag="b3")
        ctl(cluster, "engines", "set", "llama.cpp", "b3", "--sha256", f"{asset}={bad}")

        def refused() -> list[dict[str, Any]] | None:
            found = rows(cluster)
            return found if all(r["state"] == "failed" for r in found) else None

        for row in wait_for(refused, 60, "both nodes to refuse b3"):
            assert row["versions"] == ["b2"]
            assert f"{asset} failed its sha256 check: pinned {bad}" in row["message"]
        still = wait_ready(cluster, "tiny", 2)
        assert {r["replica_id"] for r in still} == {r["replica_id"] for r in after}
        # The refused placements carry the nodes' own words.
        why = ctl(cluster, "explain", "tiny").stdout
        assert why.count("engine: llama.cpp b3 not on this node: install failed: ") == 2, why
        assert "failed its sha256 check" in why
        digest = hashlib.sha256((mirror.root / "download" / "b3" / asset).read_bytes())
        assert digest.hexdigest() != bad
    finally:
        cluster.stop()


def test_vllm_is_installed_by_every_agent_from_the_fleets_package_index(
    tmp_path: Path, mirror: Mirror
) -> None:
    """The real install path of a Python engine: uv into its own environment on each node,
    from a package index the test serves on loopback (a stand-in wheel that behaves as
    vLLM's CLI), the version seen to run before it counts."""
    cluster = scheduled(tmp_path, "engines:\n  llama.cpp: b1\n")
    try:
        with PackageIndex() as index:
            index.add(*standin_wheel("vllm", "0.0.1"))
            for node in ("a", "b"):
                config = tmp_path / f"{node}.yaml"
                config.write_text(f"release_source: {mirror.url}\n")
                cluster.start_agent(node, cluster.token(), ["--config", str(config)])
            wait_for(lambda: converged(cluster, "b1"), 60, "both nodes on llama.cpp b1")
            ctl(cluster, "engine-build", "b", "cpu")
            ctl(cluster, "engines", "set", "vllm", "0.0.1", "--index-url", index.url)

            def installed() -> list[dict[str, Any]] | None:
                found = [r for r in rows(cluster) if r["engine"] == "vllm"]
                ready = [r for r in found if r["state"] == "ready"]
                return found if len(ready) == 2 else None

            found = wait_for(installed, 90, "vllm 0.0.1 on both nodes")
            assert {(r["node"], r["build"], tuple(r["versions"])) for r in found} == {
                ("a", "auto", ("0.0.1",)),
                ("b", "cpu", ("0.0.1",)),
            }
        engines = cluster.nodes()["b"]["engines"]
        vllm = [e for e in engines if e["name"] == "vllm"]
        assert [(e["version"], e["build"], e["origin"]) for e in vllm] == [
            ("0.0.1", "cpu", "installed")
        ]
        assert vllm[0]["path"].endswith("/engines/vllm/0.0.1-cpu/venv/bin/vllm")
    finally:
        cluster.stop()
