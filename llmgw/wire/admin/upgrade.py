"""The admin API's answer about an upgrade run (``GET`` and ``POST /api/v1/upgrade``,
``ctl upgrade``): its state, current step, and each step's state and words."""

from typing import Literal, TypedDict

StepKind = Literal["control-plane", "node"]
StepState = Literal["pending", "running", "done", "skipped", "failed"]
RunState = Literal["running", "done", "failed"]


class UpgradeStepJson(TypedDict):
    """A control plane or a node moved to the version; ``started``/``ended`` epoch
    seconds or null."""

    kind: StepKind
    target: str
    state: StepState
    detail: str
    started: float | None
    ended: float | None


class UpgradeJson(TypedDict):
    """The run: ``step`` names the step under way (null once it ended), ``error`` the
    failure that stopped it; ``ready`` the nodes Ready when it began with their Ready
    replicas (each must come back with at least as many)."""

    version: str
    source: str
    by: str
    started: float
    ended: float | None
    state: RunState
    step: str | None
    error: str | None
    node_timeout: float
    downgrade: bool
    ready: dict[str, int]
    steps: list[UpgradeStepJson]
