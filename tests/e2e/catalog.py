"""Helpers of the catalog's end-to-end tests: a control plane with short scheduling
periods, agents running the built llama-server, and the model commands."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from llmgw import pki
from tests.e2e.cluster import Cluster, engine_ports, run, wait_for
from tests.support.tinymodel import write_tiny_model

# Short periods so a lost node, a failure's backoff and a pass take seconds; engine
# ports of this worker's own (cluster.engine_ports).
SCHEDULING = f"""
scheduling:
  interval: 0.5
  node_lost_grace: 3
  backoff_base: 1
  backoff_max: 4
  engine_ports: {engine_ports(1)}
"""


def scheduled(root: Path, extra: str = "", prefix: list[str] | None = None) -> Cluster:
    """A control plane in ``root`` with SCHEDULING (and ``extra`` YAML) in its config,
    started (under ``prefix``, a command such as prlimit); the caller stops it."""
    cluster = Cluster(root, server_prefix=prefix or [])
    cluster.init()
    config = cluster.data_dir / "server.yaml"
    config.write_text(config.read_text() + SCHEDULING + extra)
    cluster.start_server()
    return cluster


def join(cluster: Cluster, node_id: str, binary: Path, token: bool = True) -> None:
    cluster.start_agent(
        node_id, cluster.token() if token else None, ["--engine", f"llama.cpp={binary}"]
    )
    cluster.wait_state(node_id, "Ready", 20)


def serve(cluster: Cluster, model: Path, name: str, *flags: str) -> None:
    """`ctl model serve` of a tiny model at a context it was trained for."""
    ctl(cluster, "model", "serve", str(model), "--name", name, "--context", "256", *flags)


def serve_tiny(cluster: Cluster, binary: Path, node_id: str = "a") -> None:
    """A node running the built llama-server, serving the tiny model as ``tiny``."""
    join(cluster, node_id, binary)
    serve(cluster, write_tiny_model(cluster.root / "tiny.gguf"), "tiny")
    wait_ready(cluster, "tiny", 1)


def passes(cluster: Cluster, count: int = 3, timeout: float = 30) -> None:
    """Wait until the reconciler has made ``count`` more passes (``reconcile_passes`` in
    /api/v1/status): after them, what it did not do it will not do, with no guessed sleep."""
    start = int(cluster.api("/api/v1/status")["reconcile_passes"])
    wait_for(
        lambda: int(cluster.api("/api/v1/status")["reconcile_passes"]) >= start + count,
        timeout,
        f"{count} more reconcile passes",
    )


def ctl(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("ctl", *args, "--data-dir", str(cluster.data_dir), check=check)


def ctl_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(ctl(cluster, *args, "--json").stdout)


def replicas(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [r for r in cluster.api("/api/v1/replicas") if r["model"] == name]


def wait_ready(cluster: Cluster, name: str, count: int, timeout: float = 60) -> list[Any]:
    """Exactly ``count`` replicas of the model, every one Ready."""

    def check() -> list[dict[str, Any]] | None:
        rows = replicas(cluster, name)
        for row in rows:
            if row["state"] == "failed":
                raise AssertionError(f"{row['replica_id']} failed: {row['reason']}")
        ready = [r for r in rows if r["state"] == "ready"]
        return rows if len(rows) == count and len(ready) == count else None

    if count == 0:
        wait_for(lambda: not replicas(cluster, name), timeout, f"{name} to have no replicas")
        return []
    return wait_for(check, timeout, f"{name} to have {count} ready replicas", step=0.2)  # type: ignore[no-any-return]


def engine_key(cluster: Cluster, replica_id: str) -> str:
    return pki.engine_key((cluster.data_dir / "cluster.key").read_bytes(), replica_id)
