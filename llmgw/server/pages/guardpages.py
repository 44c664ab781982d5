"""The guard page (``/admin/guard``), for operators: every guard policy (its judge,
what an instruction or personal data found does, its wait and what a judgment past it
does, and its warnings), the verdicts counted since this control plane started, and
its recent decisions (newest first: where and what kind of data, never the data);
forms for an admin to add (or replace) and remove a policy.

It reads and changes through ``GuardService`` (``server/guard/service.py``), as
``/api/v1/guard`` and ``ctl guard`` do, with the signed-in caller as the
``Principal``: a refusal (a judge not in the catalog) is the service's, shown with
nothing changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypedDict

from starlette.responses import RedirectResponse, Response

from llmgw.server import schema
from llmgw.server.guard.policies import POLICY_NAME, PolicyAdd
from llmgw.server.pages.frame import Frame, Page, PageCall, form_body
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.wire.admin import GuardDecisionJson, GuardPolicyJson

# The verdicts a policy's row counts, in the order shown.
VERDICTS = ("pass", "flag", "redact", "block", "withhold", "timeout")


class GuardDesk(Protocol):
    """What the page asks of the guard (``server/guard/service.py``)."""

    @property
    def counts(self) -> Mapping[tuple[str, str], int]: ...

    def policies(self) -> list[GuardPolicyJson]: ...

    def decisions(self, policy: str | None = None) -> list[GuardDecisionJson]: ...

    async def add(self, ask: PolicyAdd, by: Principal) -> GuardPolicyJson: ...

    async def remove(self, name: str, by: Principal) -> GuardPolicyJson: ...


class ShownPolicy(TypedDict):
    policy: GuardPolicyJson
    # Each verdict's count since this control plane started (those never given: 0).
    counts: dict[str, int]


def shown_policies(guard: GuardDesk) -> list[ShownPolicy]:
    counts = guard.counts
    return [
        {"policy": p, "counts": {v: counts.get((p["name"], v), 0) for v in VERDICTS}}
        for p in guard.policies()
    ]


def asked_policy(form: Mapping[str, str]) -> PolicyAdd:
    """The add form as the service's request; blank fields take the API's defaults."""
    body = form_body(
        form, texts=("name", "judge", "injection", "pii", "fail"), numbers=("wait_ms",)
    )
    return schema.read(PolicyAdd, body)


def pages(frame: Frame, guard: GuardDesk) -> list[Page]:
    async def show(call: PageCall) -> Response:
        policy = call.request.query_params.get("policy") or None
        if policy is not None and not POLICY_NAME.fullmatch(policy):
            raise Refusal(400, "bad_request", "policy: not a guard policy's name", "policy")
        return frame.render(
            call.request,
            "guard.html",
            call.session,
            rows=shown_policies(guard),
            decisions=guard.decisions(policy),
            policy=policy,
            verdicts=VERDICTS,
        )

    async def add(call: PageCall) -> Response:
        made = await guard.add(asked_policy(call.form), call.principal)
        return RedirectResponse(f"/admin/guard#policy-{made['name']}", status_code=303)

    async def remove(call: PageCall) -> Response:
        await guard.remove(call.params["name"], call.principal)
        return RedirectResponse("/admin/guard", status_code=303)

    return [
        Page("GET", "/admin/guard", show, role="operator"),
        Page("POST", "/admin/guard/policies", add, role="admin"),
        Page("POST", "/admin/guard/policies/{name}/remove", remove, role="admin"),
    ]
