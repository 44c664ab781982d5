"""``/api/v1/slurm``: Slurm beside llmgw (``llmgw ctl slurm``): each node's part and
stage, the files the control plane writes, and the workflows of ``SlurmService``."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.requests import SlurmNodes, SlurmOff, SlurmPolicySet, SlurmSetup
from llmgw.server.slurm.service import SlurmService
from llmgw.wire.admin import SlurmFilesJson, SlurmJson

DOC = {
    "type": "object",
    "required": ["enabled", "controller", "partition", "nodes", "policy", "next", "warnings"],
}
FILES = {"type": "object", "required": ["slurm_conf", "gres_conf", "cgroup_conf"]}


def routes(slurm: SlurmService) -> Ops:
    async def status(call: Call[None, None]) -> SlurmJson:
        return slurm.status()

    async def conf(call: Call[None, None]) -> SlurmFilesJson:
        return slurm.files()

    async def setup(call: Call[SlurmSetup, None]) -> SlurmJson:
        return await slurm.setup(call.body, call.principal)

    async def lend(call: Call[SlurmNodes, None]) -> SlurmJson:
        return await slurm.lend(call.body, call.principal)

    async def reclaim(call: Call[SlurmNodes, None]) -> SlurmJson:
        return await slurm.reclaim(call.body, call.principal)

    async def off(call: Call[SlurmOff, None]) -> SlurmJson:
        return await slurm.off(call.body.now, call.principal)

    async def policy(call: Call[SlurmPolicySet, None]) -> SlurmJson:
        return await slurm.policy(call.body, call.principal)

    return [
        Op(
            "GET",
            "/api/v1/slurm",
            status,
            "Slurm beside llmgw: each node's part, stage, Slurm state and jobs, the policy",
            answer=DOC,
        ),
        Op(
            "GET",
            "/api/v1/slurm/conf",
            conf,
            "The slurm.conf, gres.conf and cgroup.conf the control plane writes",
            answer=FILES,
        ),
        Op(
            "POST",
            "/api/v1/slurm/setup",
            setup,
            "Turn Slurm on, or change what is named (audited; each node is told its part)",
            body=SlurmSetup,
            answer=DOC,
            access="admin",
            errors=(404, 409),
        ),
        Op(
            "POST",
            "/api/v1/slurm/lend",
            lend,
            "Lend nodes to Slurm (their replicas placed elsewhere first)",
            body=SlurmNodes,
            answer=DOC,
            access="operator",
            errors=(404, 409),
        ),
        Op(
            "POST",
            "/api/v1/slurm/reclaim",
            reclaim,
            "Take nodes back from Slurm (back in llmgw when their last job step ends)",
            body=SlurmNodes,
            answer=DOC,
            access="operator",
            errors=(404, 409),
        ),
        Op(
            "POST",
            "/api/v1/slurm/off",
            off,
            "Turn Slurm off: every lent node reclaimed first, or at once with now",
            body=SlurmOff,
            answer=DOC,
            access="admin",
            errors=(409,),
        ),
        Op(
            "POST",
            "/api/v1/slurm/policy",
            policy,
            "Set lending by policy, or turn it off",
            body=SlurmPolicySet,
            answer=DOC,
            access="admin",
            errors=(409,),
        ),
    ]
