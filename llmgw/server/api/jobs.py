"""``/api/v1/jobs``: serve jobs (``catalog/jobs.py``), each step of what ``ctl model
serve`` started, as it goes. Read from any control plane: the leader answers its running
jobs as they are now, every control plane the rest from the store."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.catalog.jobs import ServeJobs
from llmgw.server.catalog.model import MODEL_NAME
from llmgw.server.schema import spec
from llmgw.server.store.jobrows import KEEP
from llmgw.wire.admin import JobJson

JOB = {"type": "object", "required": ["id", "kind", "model", "state", "step", "steps"]}


@dataclass(frozen=True)
class JobsQuery:
    model: str | None = spec(
        None, doc="only this model's jobs", pattern=MODEL_NAME, pattern_doc="a model's name"
    )
    limit: int = spec(50, doc="at most this many, newest first", minimum=1, maximum=KEEP)


def routes(jobs: ServeJobs) -> Ops:
    async def list_jobs(call: Call[None, JobsQuery]) -> list[JobJson]:
        return await jobs.newest(call.query.limit, call.query.model)

    async def show(call: Call[None, None]) -> JobJson:
        return await jobs.get(call.params["id"])

    return [
        Op(
            "GET",
            "/api/v1/jobs",
            list_jobs,
            "Serve jobs, newest first: each step, the nodes' downloads, how it ended",
            query=JobsQuery,
            answer={"type": "array", "items": JOB},
        ),
        Op("GET", "/api/v1/jobs/{id}", show, "One serve job", answer=JOB, errors=(404,)),
    ]
