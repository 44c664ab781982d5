"""``GET /api/v1/prometheus/targets``: Prometheus's http_sd_configs answer, one entry
per node whose agent serves its metrics, labelled with its NVLink domain; read with the
metrics token."""

from __future__ import annotations

import httpx

from llmgw.server.app import ControlPlane
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.scrape import metrics_address
from llmgw.wire.hardware import GpuHealth
from llmgw.wire.states import NodeState
from tests.support.nodefacts import live

CLIQUE = "7e3c0a52-18f4-4d2b-b6a9-3f0d8c21e945"


def node(node_id: str, listen: str | None, address: str | None = "10.0.0.5") -> NodeView:
    view = NodeView(id=node_id, cert_serial=1, state=NodeState.READY, address=address)
    if listen is not None:
        view.settings = {"values": {"metrics_listen": {"value": listen, "source": "file"}}}
    return view


def test_where_an_agent_serves_its_metrics() -> None:
    # A listener on every address: the address the agent came from.
    assert metrics_address(node("a", "0.0.0.0:9464")) == "10.0.0.5:9464"
    assert metrics_address(node("a", "[::]:9464", "fd00::5")) == "[fd00::5]:9464"
    assert metrics_address(node("a", "10.9.0.5:9500")) == "10.9.0.5:9500"
    assert metrics_address(node("a", None)) is None  # serves none
    assert metrics_address(node("a", "0.0.0.0:9464", None)) is None  # not known where


async def test_the_targets_with_their_labels(plane: tuple[ControlPlane, httpx.AsyncClient]) -> None:
    cp, client = plane
    tray = node("gb-tray-01", "0.0.0.0:9464")
    joined = {"fabric_state": "Completed", "fabric_status": "Success"}
    tray.live = live(
        gpu_health=[
            GpuHealth(
                uuid=f"GPU-{i}", index=i, fabric_cluster_uuid=CLIQUE, fabric_clique_id=1, **joined
            )
            for i in range(4)
        ]
    )
    cp.registry.nodes.update(
        {
            "gb-tray-01": tray,
            "cpu-01": node("cpu-01", "10.0.1.7:9464"),
            "quiet": node("quiet", None),
        }
    )
    answer = await client.get("/api/v1/prometheus/targets")
    assert answer.status_code == 200
    assert answer.json() == [
        {
            "targets": ["10.0.1.7:9464"],
            "labels": {"node": "cpu-01", "fabric": "", "nvlink_domain": "", "models": ""},
        },
        {
            "targets": ["10.0.0.5:9464"],
            "labels": {
                "node": "gb-tray-01",
                "fabric": "",
                "nvlink_domain": f"{CLIQUE}/1",
                "models": "",
            },
        },
    ]
    token = {"authorization": f"Bearer {cp.metrics_token}"}
    by_token = await client.get("/api/v1/prometheus/targets", headers=token)
    assert by_token.status_code == 200 and by_token.json() == answer.json()
    wrong = {"authorization": "Bearer llmgw-metrics-" + "0" * 40}
    assert (await client.get("/api/v1/prometheus/targets", headers=wrong)).status_code == 401
