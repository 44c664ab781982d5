"""``/api/v1/finetunes`` through the real admin app: refusals before anything is sent,
a job created on a node (its stream a stand-in), listed, shown, and cancelled."""

from __future__ import annotations

import json

import httpx

from llmgw.server.app import ControlPlane
from llmgw.server.fleet.figures import LiveFigures
from llmgw.server.fleet.registry import NodeView
from llmgw.wire.admin import FinetuneJson
from llmgw.wire.hardware import HostFacts
from llmgw.wire.states import NodeState
from tests.support.finetunes import AgentEnd, tiny_model
from tests.support.shapes import check

PAIRS = "".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) + "\n" for i in range(20))


def add_node(cp: ControlPlane, name: str) -> AgentEnd:
    end = AgentEnd()
    facts = HostFacts(hostname=name, os="linux", arch="x86_64")
    view = NodeView(id=name, cert_serial=1, state=NodeState.READY, facts=facts)
    view.live = LiveFigures(memory_available=64 * 1024**3)
    view.session = end  # type: ignore[assignment]
    cp.registry.nodes[name] = view
    return end


async def test_create_list_show_cancel(plane: tuple[ControlPlane, httpx.AsyncClient]) -> None:
    cp, client = plane
    cp.models.models["m"] = tiny_model()
    body = {"model": "m", "name": "tuned", "data": PAIRS, "mib": 1000, "epochs": 1}
    bad = await client.post("/api/v1/finetunes", json={**body, "data": PAIRS + "[1]\n"})
    assert bad.status_code == 400
    assert "line 21: a JSON list" in bad.json()["error"]["message"]
    none = await client.post("/api/v1/finetunes", json=body)
    assert none.status_code == 409 and none.json()["error"]["code"] == "no_room"
    end = add_node(cp, "cpu1")
    made = await client.post("/api/v1/finetunes", json=body)
    assert made.status_code == 201, made.text
    job = made.json()
    assert job["state"] == "preparing" and job["node"] == "cpu1" and job["pairs"] == 20
    assert job["loss"] == [] and job["step"] is None and job["epochs"] == 1
    assert end.kinds() == ["finetune.data", "finetune.start"]
    listed = (await client.get("/api/v1/finetunes")).json()
    assert [j["id"] for j in listed] == [job["id"]]
    shown = await client.get(f"/api/v1/finetunes/{job['id']}")
    assert shown.json()["name"] == "tuned"
    check(FinetuneJson, shown.json())
    assert (await client.get("/api/v1/finetunes/ft-000000000000")).status_code == 404
    cancelled = await client.post(f"/api/v1/finetunes/{job['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    check(FinetuneJson, cancelled.json())
    again = await client.post(f"/api/v1/finetunes/{job['id']}/cancel")
    assert again.status_code == 409
