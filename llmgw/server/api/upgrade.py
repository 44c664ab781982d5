"""``/api/v1/upgrade``: move the cluster to another llmgw release (``llmgw ctl upgrade``),
and the run as it stands (``UpgradeService``)."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.requests import UpgradeStart
from llmgw.server.upgrade.run import RunJson
from llmgw.server.upgrade.service import UpgradeService

RUN = {
    "type": "object",
    "required": ["version", "source", "state", "step", "error", "steps"],
}


def routes(upgrade: UpgradeService) -> Ops:
    async def status(call: Call[None, None]) -> RunJson:
        return await upgrade.status()

    async def start(call: Call[UpgradeStart, None]) -> RunJson:
        return await upgrade.start(call.body, call.principal)

    return [
        Op(
            "GET",
            "/api/v1/upgrade",
            status,
            "The last upgrade run: its state, current step, and each step's state and words",
            answer=RUN,
            errors=(404,),
        ),
        Op(
            "POST",
            "/api/v1/upgrade",
            start,
            "Upgrade the cluster to a release (checked first; this control plane, the "
            "standbys, then node by node); the same version again resumes a failed run",
            body=UpgradeStart,
            answer=RUN,
            access="admin",
            status=202,
            errors=(404, 409, 502),
        ),
    ]
