"""``/api/v1/finetunes`` through the real admin app: refusals before anything is sent,
a job created on a node (its stream a stand-in), listed, shown, and cancelled."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import httpx

from llmgw.server.app import ControlPlane
from llmgw.server.finetune.job import FinetuneJob
from llmgw.server.fleet.figures import LiveFigures
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.admin import FinetuneJson
from llmgw.wire.hardware import HostFacts
from llmgw.wire.states import NodeState
from tests.support.finetunes import AgentEnd, tiny_model
from tests.support.shapes import check
from tests.support.tinymodel import write_tiny_model

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


async def test_a_stored_fine_tune_is_added_as_an_adapter_only_once_it_succeeded(
    tmp_path: Path, plane: tuple[ControlPlane, httpx.AsyncClient]
) -> None:
    cp, client = plane
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    served = await client.post(
        "/api/v1/models", json={"source": str(tiny), "name": "tiny", "context": 256}
    )
    assert served.status_code == 201, served.text
    path = "/api/v1/models/tiny/adapters"
    body = {"name": "tuned", "source": "finetune:tuned"}
    refused = await client.post(path, json=body)
    assert refused.status_code == 409 and refused.json()["error"]["param"] == "source"
    assert "no fine-tune made an adapter 'tuned'" in refused.text
    bad = await client.post(path, json={"name": "x", "source": "finetune:a/b"})
    assert bad.status_code == 400 and "write finetune:NAME" in bad.text
    job = FinetuneJob(
        id="ft-00000000000a",
        name="tuned",
        model="tiny",
        base="hf:org/tiny",
        epochs=1,
        rank=4,
        mib=1000,
        pairs=2,
        created=1.0,
        updated=1.0,
        state="training",
    )
    cp.finetunes.jobs[job.id] = job
    training = await client.post(path, json=body)
    assert training.status_code == 409 and "is training" in training.text
    cp.finetunes.jobs[job.id] = replace(job, state="succeeded")
    added = await client.post(path, json=body)
    assert added.status_code == 201, added.text
    assert added.json() == [{"name": "tuned", "source": "finetune:tuned", "scale": 1.0}]
