"""A leader and a standby of it, on SQLite, as real processes: the standby joined with
``server join`` and started with the catalog tests' short periods."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path
from typing import Any

from tests.e2e.catalog import SCHEDULING
from tests.e2e.cluster import Cluster


def leader_state(cluster: Cluster) -> tuple[int, dict[str, Any]]:
    """``GET /leader``: its status and body (200 on the leader, 503 on a standby)."""
    try:
        return 200, cluster.api("/leader", auth=False)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def standby_of(leader: Cluster, root: Path) -> Cluster:
    standby = Cluster(root, name="cp-b")
    standby.root.mkdir(parents=True, exist_ok=True)
    standby.join_as_standby(leader)
    config = standby.data_dir / "server.yaml"
    config.write_text(config.read_text() + SCHEDULING)
    standby.start_server()
    return standby


def answered(cluster: Cluster, key: str) -> bool:
    """Whether the tiny model answers a chat through ``cluster`` with ``key``."""
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    status, _, _ = cluster.post("/v1/chat/completions", body.encode(), key, timeout=10)
    return status == 200
