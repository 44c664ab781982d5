"""The Slurm page (``/admin/slurm``): the nodes llmgw shares with Slurm, each with its
part (slurmctld, slurmd, both), its stage on llmgw's side (serving, lending, lent,
reclaiming), Slurm's own state, reason, jobs and version as its agent last read them,
and what it waits for; the warnings with their fix, what the lending policy would do
next, and the files the control plane writes for slurmctld, folded away.

It reads and changes through the Slurm service (``SlurmDesk``: ``status``, ``files``,
``lend``, ``reclaim``), as ``GET /api/v1/slurm`` and ``ctl slurm lend|reclaim`` do, with
the signed-in caller as the ``Principal``: a refusal (an unknown node, a replica with
nowhere else to go, Slurm off) is the service's, shown with its reason, and nothing
changed. ``node_slurm`` gives a node's page its own row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, TypedDict

from starlette.responses import RedirectResponse, Response

from llmgw.server import schema
from llmgw.server.pages.frame import Frame, Page, PageCall, PageHandler
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import SlurmNodes
from llmgw.wire.admin import SlurmFilesJson, SlurmJobJson, SlurmJson, SlurmNodeJson
from llmgw.wire.warnings import split_fix

Change = Literal["lend", "reclaim"]
# The stage a node may be sent from by each form; the service decides in the end.
OFFERED: dict[Change, tuple[str, ...]] = {
    "lend": ("serving",),
    "reclaim": ("lending", "lent"),
}
# Only a node that runs slurmd can be lent (the controller's alone is not in the set).
LENDABLE = ("slurmd", "both")


class SlurmDesk(Protocol):
    """What the page asks of the Slurm service (``server/slurm/service.py``)."""

    def status(self) -> SlurmJson: ...

    def files(self) -> SlurmFilesJson: ...

    def part_of(self, node_id: str) -> str: ...

    def node_json(self, node_id: str) -> SlurmNodeJson: ...

    async def lend(self, ask: SlurmNodes, by: Principal) -> SlurmJson: ...

    async def reclaim(self, ask: SlurmNodes, by: Principal) -> SlurmJson: ...


class ShownNode(TypedDict):
    """A node's row: the service's answer, its problem parted from its fix, and the
    forms its stage offers."""

    node: str
    name: str
    part: str
    stage: str
    lent: bool
    connected: bool
    state: str | None
    reason: str | None
    admin_drain: bool
    # None: slurmctld could not be asked (never shown as none).
    jobs: list[SlurmJobJson] | None
    steps: int | None
    version: str | None
    running: list[str]
    problem: tuple[str, str | None] | None
    doing: str | None
    waiting_for: str | None
    offers: list[Change]


def shown_node(n: SlurmNodeJson) -> ShownNode:
    return {
        "node": n["node"],
        "name": n["name"],
        "part": n["part"],
        "stage": n["stage"],
        "lent": n["lent"],
        "connected": n["connected"],
        "state": n["state"],
        "reason": n["reason"],
        "admin_drain": n["admin_drain"],
        "jobs": None if n["jobs"] is None else list(n["jobs"]),
        "steps": n["steps"],
        "version": n["version"],
        "running": list(n["running"]),
        "problem": split_fix(n["problem"]) if n["problem"] else None,
        "doing": n["doing"],
        "waiting_for": n["waiting_for"],
        "offers": [
            c
            for c, stages in OFFERED.items()
            if n["stage"] in stages and (c != "lend" or n["part"] in LENDABLE)
        ],
    }


def node_slurm(slurm: SlurmDesk, node_id: str) -> ShownNode | None:
    """``node_id``'s row while it has a part in Slurm (in its set, being taken back, or
    running slurmctld); None when it has none or Slurm is off."""
    if slurm.part_of(node_id) == "none":
        return None
    return shown_node(slurm.node_json(node_id))


def of_node(slurm: SlurmDesk | None) -> Callable[[str], ShownNode | None]:
    """What a node's page shows of Slurm (``node_slurm``); nothing without the service."""
    if slurm is None:
        return lambda node_id: None
    return lambda node_id: node_slurm(slurm, node_id)


def policy_on(status: SlurmJson) -> bool:
    policy = status["policy"]
    return policy["lend_idle_after"] is not None or policy["reclaim_when_queued"] is not None


def asked_nodes(form: dict[str, str]) -> SlurmNodes:
    """The form's ``node`` (one, or several with commas) as the service's request."""
    names = [n.strip() for n in form.get("node", "").split(",") if n.strip()]
    if not names:
        raise Refusal(400, "bad_request", "node: name a node (its id, as `llmgw ctl nodes` shows)")
    return schema.read(SlurmNodes, {"nodes": names})


def pages(frame: Frame, slurm: SlurmDesk) -> list[Page]:
    async def show(call: PageCall) -> Response:
        status = slurm.status()
        template = "slurm_body.html" if call.htmx else "slurm.html"
        return frame.render(
            call.request,
            template,
            call.session,
            slurm=status,
            rows=[shown_node(n) for n in status["nodes"]],
            warnings=[split_fix(w) for w in status["warnings"]],
            policy_on=policy_on(status),
            # Folded away, and only on the whole page: the body's refresh leaves it open.
            files=None if call.htmx or not status["enabled"] else slurm.files(),
        )

    def changer(change: Change) -> PageHandler:
        async def send(call: PageCall) -> Response:
            ask = asked_nodes(call.form)
            if change == "lend":
                await slurm.lend(ask, call.principal)
            else:
                await slurm.reclaim(ask, call.principal)
            return RedirectResponse("/admin/slurm", status_code=303)

        send.__name__ = f"slurm_{change}"
        return send

    return [
        Page("GET", "/admin/slurm", show),
        Page("POST", "/admin/slurm/lend", changer("lend"), role="operator"),
        Page("POST", "/admin/slurm/reclaim", changer("reclaim"), role="operator"),
    ]
