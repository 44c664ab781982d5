"""``/api/v1/finetunes``: fine-tune jobs, created, listed, shown, cancelled.

Each answers a job (or a list of them) as ``wire.admin.finetune.FinetuneJson``; the
service (``server/finetune/service.py``) does the work and refuses with a reason.
"""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.finetune.service import FinetuneAsk, FinetuneService
from llmgw.server.requests import FinetuneRequest

JOB = {
    "type": "object",
    "required": ["id", "name", "model", "node", "state", "loss", "step", "steps", "error"],
}
JOBS = {"type": "array", "items": JOB}
# The pairs travel in the body as a JSON string: 32 MiB of JSONL, its quotes escaped.
MAX_BODY = 64 * 1024 * 1024


def routes(service: FinetuneService) -> Ops:
    async def listed(call: Call[None, None]) -> object:
        return [job.to_json() for job in service.listed()]

    async def show(call: Call[None, None]) -> object:
        return service.find(call.params["id"]).to_json()

    async def create(call: Call[FinetuneRequest, None]) -> object:
        body = call.body
        ask = FinetuneAsk(
            model=body.model,
            name=body.name,
            data=body.data,
            node=body.node,
            mib=body.mib,
            epochs=body.epochs,
            rank=body.rank,
            base=body.base,
        )
        return (await service.create(ask, call.principal)).to_json()

    async def cancel(call: Call[None, None]) -> object:
        return (await service.cancel(call.params["id"], call.principal)).to_json()

    path = "/api/v1/finetunes"
    return [
        Op("GET", path, listed, "Fine-tune jobs, oldest first", answer=JOBS),
        Op(
            "POST",
            path,
            create,
            "Train a LoRA adapter of a model on a node: the pairs checked and the node "
            "chosen before anything is sent",
            body=FinetuneRequest,
            max_body=MAX_BODY,
            status=201,
            answer=JOB,
            errors=(404, 409),
        ),
        Op("GET", f"{path}/{{id}}", show, "One fine-tune job", answer=JOB, errors=(404,)),
        Op(
            "POST",
            f"{path}/{{id}}/cancel",
            cancel,
            "Stop a fine-tune (its trainer is killed on the node)",
            answer=JOB,
            errors=(404, 409),
        ),
    ]
