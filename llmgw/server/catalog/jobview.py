"""A serve job as data: its steps in order, the nodes its replicas went to with their
downloads, and how it ended. Plain data, no IO: ``jobs.py`` moves a job along from what
the reconciler and the nodes say, and keeps it in the store as ``as_json`` writes it.

The steps, in order (names users and scripts rely on): resolve (the source read, its
shape), plan (the model checked and judged to fit), place (a node chosen for each
replica), fetch (the engine installed and the weights fetched on each node), start (the
engine launched and loading), ready (every replica answers). A step is pending, running,
done or failed; the job is running until every step is done (succeeded) or one failed
(failed, with that step and why).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import cast, get_args

from llmgw.wire.admin import JobErrorJson, JobJson, JobNodeJson, JobStepJson, StepName
from llmgw.wire.admin.jobs import JobState, StepState

STEPS: tuple[StepName, ...] = get_args(StepName)
JOB_ID_PREFIX = "job-"


def new_job_id() -> str:
    """``job-`` and 12 hex digits."""
    return JOB_ID_PREFIX + secrets.token_hex(6)


@dataclass
class Step:
    name: StepName
    state: StepState = "pending"
    started: float | None = None
    ended: float | None = None
    detail: str = ""

    def as_json(self) -> JobStepJson:
        return {
            "name": self.name,
            "state": self.state,
            "started": self.started,
            "ended": self.ended,
            "detail": self.detail,
        }


@dataclass
class NodeDownload:
    """A replica's node and what its download said last (None: nothing said yet)."""

    node: str
    replica_id: str
    done: int | None = None
    total: int | None = None
    rate: float | None = None
    file: str | None = None

    def as_json(self) -> JobNodeJson:
        return {
            "node": self.node,
            "replica_id": self.replica_id,
            "done": self.done,
            "total": self.total,
            "rate_bytes_per_s": self.rate,
            "file": self.file,
        }


@dataclass
class Job:
    """A serve job; ``created`` and ``updated`` and each step's times are wall-clock
    seconds (what the API shows)."""

    id: str
    model: str
    created: float
    updated: float
    steps: list[Step] = field(default_factory=lambda: [Step(name) for name in STEPS])
    nodes: list[NodeDownload] = field(default_factory=list)
    state: JobState = "running"
    error: JobErrorJson | None = None

    def step(self, name: StepName) -> Step:
        return self.steps[STEPS.index(name)]

    @property
    def current(self) -> StepName:
        """The step it is at: the failed one, the first not done, else the last."""
        for step in self.steps:
            if step.state != "done":
                return step.name
        return STEPS[-1]

    @property
    def ended(self) -> bool:
        return self.state != "running"

    def reach(self, name: StepName, now: float, detail: str | None = None) -> bool:
        """Every step before ``name`` done and ``name`` running (its detail set when
        given); True when anything changed."""
        changed = False
        index = STEPS.index(name)
        for step in self.steps[:index]:
            if step.state != "done":
                step.started = step.started if step.started is not None else now
                step.state, step.ended = "done", now
                changed = True
        step = self.steps[index]
        if step.state == "pending":
            step.state, step.started = "running", now
            changed = True
        if detail is not None and detail != step.detail:
            step.detail = detail
            changed = True
        if changed:
            self.updated = now
        return changed

    def finish(self, now: float, detail: str = "") -> None:
        """Every step done: the job succeeded."""
        self.reach(STEPS[-1], now)
        last = self.steps[-1]
        last.state, last.ended = "done", now
        last.detail = detail or last.detail
        self.state, self.updated = "succeeded", now

    def fail(self, name: StepName, reason: str, now: float) -> None:
        """The job failed at ``name``: the steps before it done, it failed."""
        self.reach(name, now)
        step = self.step(name)
        step.state, step.ended = "failed", now
        self.state, self.updated = "failed", now
        self.error = {"step": name, "reason": reason}

    def as_json(self) -> JobJson:
        return {
            "id": self.id,
            "kind": "serve",
            "model": self.model,
            "state": self.state,
            "step": self.current,
            "steps": [s.as_json() for s in self.steps],
            "nodes": [n.as_json() for n in self.nodes],
            "error": self.error,
            "created": self.created,
            "updated": self.updated,
        }

    @classmethod
    def from_json(cls, body: JobJson) -> Job:
        """A job as ``as_json`` wrote it (the store's body)."""
        steps = {s["name"]: s for s in body["steps"]}
        return cls(
            id=body["id"],
            model=body["model"],
            created=float(body["created"]),
            updated=float(body["updated"]),
            steps=[
                Step(
                    name,
                    steps[name]["state"],
                    steps[name]["started"],
                    steps[name]["ended"],
                    steps[name]["detail"],
                )
                if name in steps
                else Step(name)
                for name in STEPS
            ],
            nodes=[
                NodeDownload(
                    n["node"],
                    n["replica_id"],
                    n["done"],
                    n["total"],
                    n["rate_bytes_per_s"],
                    n["file"],
                )
                for n in body["nodes"]
            ],
            state=body["state"],
            error=body["error"],
        )


def job_of(body: object) -> Job:
    """A job from the store's decoded body; ValueError when it is not one."""
    try:
        return Job.from_json(cast(JobJson, body))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a job: {exc}") from None
