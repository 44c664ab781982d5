"""The fine-tunes page (``/admin/finetunes``): every fine-tune job with its state, step
and loss; one job (``/admin/finetunes/{id}``) with its loss drawn as it goes, its peak
memory and what went wrong; a form to start one (the pairs pasted, up to the pages'
form size: larger files go through ``llmgw ctl finetune create``) and a button to
cancel one.

It reads and changes through ``FinetuneService`` (``server/finetune/service.py``), as
``/api/v1/finetunes`` and ``ctl finetune`` do, with the signed-in caller as the
``Principal``: a refusal (a bad line of the pairs, no node with the memory) is the
service's, shown with nothing sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from starlette.responses import RedirectResponse, Response

from llmgw.server.finetune.job import DEFAULT_EPOCHS, DEFAULT_MIB, DEFAULT_RANK, FinetuneJob
from llmgw.server.finetune.service import FinetuneAsk
from llmgw.server.pages.frame import Frame, Page, PageCall, form_body
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal

# The loss chart's drawing box (SVG user units).
WIDTH, HEIGHT = 600.0, 160.0


class FinetuneDesk(Protocol):
    """What the page asks of the fine-tunes (``server/finetune/service.py``)."""

    def listed(self) -> list[FinetuneJob]: ...

    def find(self, job_id: str) -> FinetuneJob: ...

    async def create(self, ask: FinetuneAsk, by: Principal) -> FinetuneJob: ...

    async def cancel(self, job_id: str, by: Principal) -> FinetuneJob: ...


def loss_points(loss: Sequence[float]) -> str:
    """The loss as an SVG polyline's points: step across, loss up (lowest at the
    bottom); empty for fewer than two steps."""
    if len(loss) < 2:
        return ""
    low, high = min(loss), max(loss)
    span = (high - low) or 1.0
    step = WIDTH / (len(loss) - 1)
    return " ".join(
        f"{i * step:.1f},{HEIGHT - (x - low) / span * HEIGHT:.1f}" for i, x in enumerate(loss)
    )


def asked_job(form: Mapping[str, str]) -> FinetuneAsk:
    body = form_body(
        form, texts=("model", "name", "node", "base"), numbers=("mib", "epochs", "rank")
    )
    data = form.get("data", "")
    if not data.strip():
        raise Refusal(400, "invalid_data", "paste the pairs (JSONL) into the form", "data")
    for needed in ("model", "name"):
        if needed not in body:
            raise Refusal(400, "bad_request", f"{needed}: give one", needed)
    return FinetuneAsk(
        model=str(body["model"]),
        name=str(body["name"]),
        data=data,
        node=str(body["node"]) if "node" in body else None,
        mib=int(str(body.get("mib", DEFAULT_MIB))),
        epochs=int(str(body.get("epochs", DEFAULT_EPOCHS))),
        rank=int(str(body.get("rank", DEFAULT_RANK))),
        base=str(body["base"]) if "base" in body else None,
    )


def pages(frame: Frame, finetunes: FinetuneDesk) -> list[Page]:
    async def show_all(call: PageCall) -> Response:
        jobs = sorted(finetunes.listed(), key=lambda j: -j.created)
        return frame.render(
            call.request,
            "finetunes.html",
            call.session,
            jobs=[j.to_json() for j in jobs],
            defaults={"mib": DEFAULT_MIB, "epochs": DEFAULT_EPOCHS, "rank": DEFAULT_RANK},
        )

    async def show(call: PageCall) -> Response:
        job = finetunes.find(call.params["id"])
        return frame.render(
            call.request,
            "finetune.html",
            call.session,
            job=job.to_json(),
            ended=job.ended,
            points=loss_points(job.loss),
            width=WIDTH,
            height=HEIGHT,
        )

    async def create(call: PageCall) -> Response:
        made = await finetunes.create(asked_job(call.form), call.principal)
        return RedirectResponse(f"/admin/finetunes/{made.id}", status_code=303)

    async def cancel(call: PageCall) -> Response:
        done = await finetunes.cancel(call.params["id"], call.principal)
        return RedirectResponse(f"/admin/finetunes/{done.id}", status_code=303)

    return [
        Page("GET", "/admin/finetunes", show_all, role="viewer"),
        Page("GET", "/admin/finetunes/{id}", show, role="viewer"),
        Page("POST", "/admin/finetunes", create, role="operator"),
        Page("POST", "/admin/finetunes/{id}/cancel", cancel, role="operator"),
    ]
