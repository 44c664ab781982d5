"""The fine-tunes pages of a real control plane, in process over its SQLite store,
through the pages' own steps (session, role, CSRF) and the real ``FinetuneService``; a
node's stream is a stand-in answering as a runner does."""

from __future__ import annotations

import json

from llmgw.server.fleet.figures import LiveFigures
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.pages.finetunepages import loss_points
from llmgw.wire.hardware import HostFacts
from llmgw.wire.messages import FinetuneStatus
from llmgw.wire.states import NodeState
from tests.server.pages.inprocess import Site, row, text
from tests.support.finetunes import AgentEnd, tiny_model

PAIRS = "".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) + "\n" for i in range(3))


def add_node(site: Site, name: str) -> AgentEnd:
    end = AgentEnd()
    facts = HostFacts(hostname=name, os="linux", arch="x86_64")
    view = NodeView(id=name, cert_serial=1, state=NodeState.READY, facts=facts)
    view.live = LiveFigures(memory_available=64 * 1024**3)
    view.session = end  # type: ignore[assignment]
    site.cp.registry.nodes[name] = view
    return end


async def test_start_follow_and_cancel_a_fine_tune(site: Site) -> None:
    assert 'id="no-finetunes"' in await site.page("/admin/finetunes", "viewer")
    site.cp.models.models["m"] = tiny_model()
    add_node(site, "cpu1")
    form = {"model": "m", "name": "tuned", "data": PAIRS, "mib": "1000", "epochs": "1"}
    assert (await site.post("/admin/finetunes", "viewer", **form)).status_code == 403
    bad = await site.post("/admin/finetunes", "operator", **{**form, "data": PAIRS + "{x\n"})
    assert bad.status_code == 400 and "line 4: not JSON" in bad.text
    made = await site.post("/admin/finetunes", "operator", **form)
    assert made.status_code == 303
    job_id = made.headers["location"].rsplit("/", 1)[1]
    assert job_id.startswith("ft-")
    listed = await site.page("/admin/finetunes", "viewer")
    assert row(listed, f"finetune-{job_id}").startswith(f"{job_id} tuned m cpu1 preparing")
    service = site.cp.finetunes
    for step, loss in enumerate((2.0, 1.5, 1.25), 1):
        service.report(
            "cpu1",
            FinetuneStatus(
                id=job_id, state="training", step=step, steps=3, loss_at=step - 1, loss=[loss]
            ),
        )
    page = await site.page(f"/admin/finetunes/{job_id}", "viewer")
    assert 'id="finetune-loss"' in page and "3 steps: from 2.000 to 1.250." in text(page)
    assert 'id="finetune-cancel"' not in page  # a viewer reads only
    assert 'id="finetune-cancel"' in await site.page(f"/admin/finetunes/{job_id}", "operator")
    done = await site.post(f"/admin/finetunes/{job_id}/cancel", "operator")
    assert done.status_code == 303
    assert "cancelled" in text(await site.page(f"/admin/finetunes/{job_id}", "viewer"))


async def test_the_pages_speak_turkish(site: Site) -> None:
    headers = {**site.as_("operator"), "accept-language": "tr-TR,tr;q=0.9"}
    page = (await site.client.get("/admin/finetunes", headers=headers)).text
    assert "Henüz ince ayar yok." in page and "İnce ayar başlat" in page


def test_the_loss_is_drawn_lowest_at_the_bottom() -> None:
    assert loss_points([1.0]) == ""
    assert loss_points([2.0, 1.0, 1.5]) == "0.0,0.0 300.0,160.0 600.0,80.0"
