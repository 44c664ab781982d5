"""The admin API's answer about ``llmgw restart`` (``POST`` and ``GET /api/v1/restart``):
the plan, and how far it got. Part of ``llmgw.wire.admin``; read its docstring for the
rules."""

# No `from __future__ import annotations` (the package's docstring says why).
from typing import Literal, TypedDict

# ``waiting`` to be asked; ``asked`` and not back yet; ``back``: a new stream (an agent)
# or a later start (a control plane); ``skipped`` never asked (``reason`` says why);
# ``failed`` (``reason`` says how); ``restarting``: this control plane, last.
RestartStep = Literal["waiting", "asked", "back", "skipped", "failed", "restarting"]
# Where the whole run is: nothing asked yet since this control plane started (``idle``),
# the agents, the other control planes, this one, over (``done``) or stopped (``failed``).
RestartStage = Literal["idle", "agents", "control_planes", "this", "done", "failed"]


class RestartAgentJson(TypedDict):
    """A node's agent in a restart: its engines' pids (by replica) before it was asked,
    and once back whether every one of them is still the same process."""

    node: str
    state: RestartStep
    reason: str | None
    version: str
    engines: dict[str, int | None]
    engines_kept: bool | None


class RestartPlaneJson(TypedDict):
    """A control plane in a restart: ``started`` its start (epoch seconds) as it last said."""

    name: str
    role: str | None
    state: RestartStep
    reason: str | None
    started: float | None


class RestartJson(TypedDict):
    """``/api/v1/restart``: agents first, then the other control planes (standbys before
    a leader), then this one (``this``)."""

    stage: RestartStage
    asked_at: float | None
    by: str | None
    this: str
    agents: list[RestartAgentJson]
    control_planes: list[RestartPlaneJson]
    error: str | None
