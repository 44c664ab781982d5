"""An upgrade run (``llmgw ctl upgrade``) as it is kept: one JSON document in the store's
settings (``upgrade``), so the control plane that leads after a restart (this one, on the
new version, or another) carries it on from where it stands.

A run names its target version and release source, who started it and when, the nodes
Ready at its start with their Ready replicas (each must come back with at least as
many), how long a node may take, and its steps in order: the control plane that leads
(``control-plane``, then waiting for the nodes that were Ready), each standby
(``control-plane``), then each node (``node``), by name. A step is ``pending``,
``running`` (asked, waiting to see it back), ``done``, ``skipped`` (already on the
version; or an agent too old to be asked, named) or ``failed``; the first failure fails
the run and says where. The same version started again resumes a failed run: its failed
step is pending again and the done ones stay done.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import cast

from llmgw.jsonvalue import JSONObject
from llmgw.wire.admin.upgrade import RunState, StepKind, StepState, UpgradeJson

SETTING = "upgrade"

STEP_STATES: tuple[StepState, ...] = ("pending", "running", "done", "skipped", "failed")
RUN_STATES: tuple[RunState, ...] = ("running", "done", "failed")
# The run as the API answers it.
RunJson = UpgradeJson


@dataclass(frozen=True)
class Step:
    kind: StepKind
    # A control plane's name, or a node's id.
    target: str
    state: StepState = "pending"
    detail: str = ""
    started: float | None = None
    ended: float | None = None
    # The control plane that led when the run began waits, once back on the version,
    # for every node that was Ready to be Ready again.
    wait_nodes: bool = False

    @property
    def name(self) -> str:
        return f"{'control plane' if self.kind == 'control-plane' else 'node'} {self.target}"

    @property
    def finished(self) -> bool:
        return self.state in ("done", "skipped")

    def document(self) -> JSONObject:
        return {
            "kind": self.kind,
            "target": self.target,
            "state": self.state,
            "detail": self.detail,
            "started": self.started,
            "ended": self.ended,
            "wait_nodes": self.wait_nodes,
        }

    @classmethod
    def read(cls, doc: object) -> Step | None:
        if not isinstance(doc, dict):
            return None
        kind, target, state = doc.get("kind"), doc.get("target"), doc.get("state")
        if kind not in ("control-plane", "node") or not isinstance(target, str):
            return None
        return cls(
            kind=cast(StepKind, kind),
            target=target,
            state=cast(StepState, state) if state in STEP_STATES else "pending",
            detail=str(doc.get("detail") or ""),
            started=_number(doc.get("started")),
            ended=_number(doc.get("ended")),
            wait_nodes=doc.get("wait_nodes") is True,
        )


@dataclass(frozen=True)
class UpgradeRun:
    version: str
    source: str
    by: str
    started: float
    node_timeout: float
    downgrade: bool = False
    # The nodes Ready at the start, with their Ready replicas then.
    ready: dict[str, int] = field(default_factory=dict)
    steps: tuple[Step, ...] = ()
    # The asset of the leading control plane's platform and its signed sha256.
    asset: str = ""
    sha256: str = ""
    state: RunState = "running"
    error: str | None = None
    ended: float | None = None

    @property
    def current(self) -> int | None:
        """The index of the step under way or next, None when every one is finished."""
        for i, step in enumerate(self.steps):
            if not step.finished:
                return i
        return None

    def with_step(self, index: int, **changes: object) -> UpgradeRun:
        steps = list(self.steps)
        steps[index] = replace(steps[index], **changes)  # type: ignore[arg-type]
        return replace(self, steps=tuple(steps))

    def resumed(self) -> UpgradeRun:
        """A failed run again: its failed steps pending, the rest as they were."""
        steps = tuple(
            replace(
                s, state="pending", detail=f"again (before: {s.detail})", started=None, ended=None
            )
            if s.state == "failed"
            else s
            for s in self.steps
        )
        return replace(self, steps=steps, state="running", error=None, ended=None)

    def as_json(self) -> RunJson:
        at = self.current
        return {
            "version": self.version,
            "source": self.source,
            "by": self.by,
            "started": self.started,
            "ended": self.ended,
            "state": self.state,
            "step": self.steps[at].name if at is not None and self.state == "running" else None,
            "error": self.error,
            "node_timeout": self.node_timeout,
            "downgrade": self.downgrade,
            "ready": dict(self.ready),
            "steps": [
                {
                    "kind": s.kind,
                    "target": s.target,
                    "state": s.state,
                    "detail": s.detail,
                    "started": s.started,
                    "ended": s.ended,
                }
                for s in self.steps
            ],
        }

    def document(self) -> JSONObject:
        return {
            "version": self.version,
            "source": self.source,
            "by": self.by,
            "started": self.started,
            "node_timeout": self.node_timeout,
            "downgrade": self.downgrade,
            "ready": dict(self.ready),
            "steps": [s.document() for s in self.steps],
            "asset": self.asset,
            "sha256": self.sha256,
            "state": self.state,
            "error": self.error,
            "ended": self.ended,
        }

    @classmethod
    def read(cls, doc: object) -> UpgradeRun | None:
        """The run from its document; None when there is none (or it is not one)."""
        if not isinstance(doc, dict):
            return None
        version, source = doc.get("version"), doc.get("source")
        if not isinstance(version, str) or not isinstance(source, str):
            return None
        ready = doc.get("ready")
        steps = doc.get("steps")
        state = doc.get("state")
        error = doc.get("error")
        return cls(
            version=version,
            source=source,
            by=str(doc.get("by") or ""),
            started=_number(doc.get("started")) or 0.0,
            node_timeout=_number(doc.get("node_timeout")) or 300.0,
            downgrade=doc.get("downgrade") is True,
            ready=(
                {str(k): int(v) for k, v in ready.items() if isinstance(v, int)}
                if isinstance(ready, dict)
                else {}
            ),
            steps=tuple(
                s for s in (Step.read(d) for d in (steps if isinstance(steps, list) else [])) if s
            ),
            asset=str(doc.get("asset") or ""),
            sha256=str(doc.get("sha256") or ""),
            state=cast(RunState, state) if state in RUN_STATES else "failed",
            error=error if isinstance(error, str) else None,
            ended=_number(doc.get("ended")),
        )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
