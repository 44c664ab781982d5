"""Serve jobs as the admin API shows them (``/api/v1/jobs``): what ``ctl model serve``
started and how far it got, step by step. Part of ``llmgw.wire.admin``; read its
docstring for the rules. The names are a contract scripts rely on (issue 32): keep them."""

# No `from __future__ import annotations` (the package's docstring says why).
from typing import Literal, TypedDict

JobState = Literal["running", "succeeded", "failed"]
StepState = Literal["pending", "running", "done", "failed"]
# The steps of a serve job, in order.
StepName = Literal["resolve", "plan", "place", "fetch", "start", "ready"]


class JobStepJson(TypedDict):
    """One step: when it started and ended (seconds since the epoch; None: not yet) and
    what it says (the source resolved, the node placed on, the bytes fetched...)."""

    name: StepName
    state: StepState
    started: float | None
    ended: float | None
    detail: str


class JobNodeJson(TypedDict):
    """A node a replica of the job went to, and its download: bytes so far, of ``total``
    when the hub said, the rate over the last seconds (None: not measured yet) and the
    file being fetched."""

    node: str
    replica_id: str
    done: int | None
    total: int | None
    rate_bytes_per_s: float | None
    file: str | None


class JobErrorJson(TypedDict):
    """Why a job failed, and at which step."""

    step: StepName
    reason: str


class JobJson(TypedDict):
    """``GET /api/v1/jobs/{id}`` (each of ``GET /api/v1/jobs``)."""

    id: str
    kind: Literal["serve"]
    model: str
    state: JobState
    step: StepName
    steps: list[JobStepJson]
    nodes: list[JobNodeJson]
    error: JobErrorJson | None
    created: float
    updated: float
