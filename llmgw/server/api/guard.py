"""``/api/v1/guard``: guard policies (``ctl guard policy``), their recent decisions on
this control plane (``ctl guard decisions``) and a check of their judges (``ctl guard
judge check``), over ``GuardService`` (``server/guard/service.py``).

Operators may list the policies; only admins change them. Decisions name keys and where
data was found, so they are for operators, never viewers.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.guard.policies import POLICY_NAME, POLICY_WORDS, PolicyAdd
from llmgw.server.guard.service import GuardService
from llmgw.server.schema import spec
from llmgw.wire.admin import GuardCheckJson, GuardDecisionJson, GuardPolicyJson

POLICY = {"type": "object", "required": ["name", "injection", "pii", "wait_ms", "fail"]}


@dataclass(frozen=True)
class DecisionsQuery:
    policy: str | None = spec(
        None, doc="only this policy's", pattern=POLICY_NAME, pattern_doc=POLICY_WORDS
    )


@dataclass(frozen=True)
class JudgeCheck:
    policy: str | None = spec(
        None, doc="only this policy's judge", pattern=POLICY_NAME, pattern_doc=POLICY_WORDS
    )


def routes(guard: GuardService) -> Ops:
    async def listing(call: Call[None, None]) -> list[GuardPolicyJson]:
        return guard.policies()

    async def show(call: Call[None, None]) -> GuardPolicyJson:
        return guard.show(call.params["name"])

    async def add(call: Call[PolicyAdd, None]) -> GuardPolicyJson:
        return await guard.add(call.body, call.principal)

    async def remove(call: Call[None, None]) -> GuardPolicyJson:
        return await guard.remove(call.params["name"], call.principal)

    async def decisions(call: Call[None, DecisionsQuery]) -> list[GuardDecisionJson]:
        return guard.decisions(call.query.policy)

    async def check(call: Call[JudgeCheck, None]) -> list[GuardCheckJson]:
        return await guard.judge_check(call.body.policy)

    return [
        Op(
            "GET",
            "/api/v1/guard/policies",
            listing,
            "Every guard policy",
            answer={"type": "array", "items": POLICY},
            access="operator",
        ),
        Op(
            "POST",
            "/api/v1/guard/policies",
            add,
            "Add a guard policy, or replace one of its name (its judge must be in the catalog)",
            body=PolicyAdd,
            answer=POLICY,
            access="admin",
        ),
        Op(
            "GET",
            "/api/v1/guard/policies/{name}",
            show,
            "One guard policy",
            answer=POLICY,
            errors=(404,),
            access="operator",
        ),
        Op(
            "DELETE",
            "/api/v1/guard/policies/{name}",
            remove,
            "Remove a guard policy (keys naming it are read by their others)",
            answer=POLICY,
            errors=(404,),
            access="admin",
        ),
        Op(
            "GET",
            "/api/v1/guard/decisions",
            decisions,
            "This control plane's last 200 guard decisions, newest first (never the data)",
            query=DecisionsQuery,
            answer={"type": "array", "items": {"type": "object"}},
            access="operator",
        ),
        Op(
            "POST",
            "/api/v1/guard/judges/check",
            check,
            "Time each policy's judge: three judgments of a 280-token prompt, then 8 at "
            "once, against the policy's wait",
            body=JudgeCheck,
            body_optional=True,
            answer={"type": "array", "items": {"type": "object"}},
            errors=(404,),
            access="operator",
            reads=True,
        ),
    ]
