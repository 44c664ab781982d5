"""``GuardService``: guard policies (add, remove, list, show: admins change them, each
change audited), what they decided (the last 200 decisions in memory, per control
plane; counts by policy and verdict for ``/metrics``; each decision but a pass audited
as ``guard.VERDICT``, written off the request path once a second), and ``judge check``.

It is the gateway's ``PromptGuard`` (the ``/v1`` hook) and the MCP gateway's
``ToolGuard``, through its ``Reader`` (``reading.py``).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from llmgw.jsonvalue import JSON, JSONObject
from llmgw.server.audittrail import AuditTrail
from llmgw.server.catalog.model import Model
from llmgw.server.gateway.limits import Key
from llmgw.server.gateway.metrics import family
from llmgw.server.guard.judge import Judge, Said
from llmgw.server.guard.policies import GuardPolicy, KeptPolicies, PolicyAdd
from llmgw.server.guard.reading import Decision, Reader
from llmgw.server.mcp.tools import Reading, ToolResult
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal, bad_request, not_found
from llmgw.server.store import Store
from llmgw.wire.admin import GuardCheckJson, GuardDecisionJson, GuardPolicyJson

log = logging.getLogger("llmgw.guard")

if TYPE_CHECKING:
    from llmgw.server.gateway.service import PromptGuard
    from llmgw.server.mcp.tools import ToolGuard

    def _is_both(service: GuardService) -> tuple[PromptGuard, ToolGuard]:
        """mypy's check that the service is what /v1 and the MCP gateway take."""
        return service, service


KEPT = 200
BURST = 8
# About 280 tokens of ordinary text, with nothing in it for the rules.
CHECK_TEXT = (
    "The quarterly report covers the build farm, the storage upgrade and the move of the "
    "nightly jobs to the new scheduler. Each team wrote a short summary of what changed, "
    "what broke and what they plan next. The storage upgrade finished a week early; the "
    "old arrays are kept read-only until the end of the month. The scheduler now runs the "
    "nightly jobs in priority order and retries a failed one once before paging anyone. "
) * 3


def policy_json(policy: GuardPolicy, models: Mapping[str, Model]) -> GuardPolicyJson:
    warnings = []
    judge = models.get(policy.judge) if policy.judge else None
    if judge is not None and not judge.external:
        for profile in judge.profiles:
            if profile.engine == "llama.cpp" and not _no_prompt_cache(profile.args):
                warnings.append(
                    f"the judge's profile {profile.name} keeps llama.cpp's prompt cache: "
                    "serve it with --arg=--cache-ram --arg=0"
                )
    return {
        "name": policy.name,
        "judge": policy.judge,
        "injection": policy.injection,
        "pii": policy.pii,
        "wait_ms": policy.wait_ms,
        "fail": policy.fail,
        "warnings": warnings,
    }


def _no_prompt_cache(args: tuple[str, ...]) -> bool:
    for i, arg in enumerate(args):
        if arg in ("--cache-ram", "-cram") and i + 1 < len(args) and args[i + 1] == "0":
            return True
        if arg in ("--cache-ram=0", "-cram=0"):
            return True
    return False


class GuardService:
    def __init__(
        self,
        store: Store,
        models: Callable[[], Mapping[str, Model]],
        judge: Judge,
        trail: AuditTrail,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``trail``: where each decision's audit entry goes."""
        self.store = store
        self.trail = trail
        self.kept = KeptPolicies(store)
        self.models = models
        self.judge = judge
        self.reader = Reader(lambda: self.kept.now, judge, self.record, clock)
        self.recent: deque[Decision] = deque(maxlen=KEPT)
        self.counts: dict[tuple[str, str], int] = {}

    async def load(self) -> None:
        await self.kept.load()

    # ------------------------------------------------------------------ policies

    def policies(self) -> list[GuardPolicyJson]:
        models = self.models()
        return [policy_json(p, models) for _, p in sorted(self.kept.now.items())]

    def show(self, name: str) -> GuardPolicyJson:
        policy = self.kept.now.get(name)
        if policy is None:
            raise not_found(f"no guard policy named {name} (`llmgw ctl guard policy list`)")
        return policy_json(policy, self.models())

    async def add(self, ask: PolicyAdd, by: Principal) -> GuardPolicyJson:
        """A new policy, or one replaced: its judge must be a model of the catalog."""
        if ask.judge is not None and ask.judge not in self.models():
            raise bad_request(
                f"no model named {ask.judge} in the catalog to judge with: serve one first "
                f"(`llmgw ctl model serve SOURCE --name {ask.judge} --arg=--cache-ram "
                "--arg=0`), or leave --judge out for the pattern rules alone",
                "judge",
            )
        policy = GuardPolicy(ask.name, ask.judge, ask.injection, ask.pii, ask.wait_ms, ask.fail)
        action = "guard.policy.change" if ask.name in self.kept.now else "guard.policy.add"
        await self.kept.write({**self.kept.now, ask.name: policy}, by, action, ask.name)
        return policy_json(policy, self.models())

    async def remove(self, name: str, by: Principal) -> GuardPolicyJson:
        shown = self.show(name)
        rest = {k: v for k, v in self.kept.now.items() if k != name}
        await self.kept.write(rest, by, "guard.policy.remove", name)
        return shown

    # ------------------------------------------------------------------ decisions

    def record(self, decision: Decision) -> None:
        where = (decision.policy, decision.verdict)
        self.counts[where] = self.counts.get(where, 0) + 1
        if decision.verdict == "pass":
            return
        self.recent.append(decision)
        d = decision
        detail = f"key {d.key}; {d.where}" + (f"; {d.found}" if d.found else "")
        self.trail.add("guard", f"guard.{d.verdict}", d.policy, detail)

    def decisions(self, policy: str | None = None) -> list[GuardDecisionJson]:
        return [
            {
                "at": d.at,
                "policy": d.policy,
                "verdict": d.verdict,
                "key": d.key,
                "where": d.where,
                "found": d.found,
            }
            for d in reversed(self.recent)
            if policy is None or d.policy == policy
        ]

    def metric_lines(self) -> list[str]:
        return family(
            "llmgw_guard_decisions_total",
            "counter",
            "Guard policies' decisions by policy and verdict (pass, flag, redact, block, "
            "withhold, timeout).",
            self.counts,
            ("policy", "verdict"),
        )

    # ------------------------------------------------------------------ readings

    async def prompt(self, key: Key, body: JSONObject) -> str | None:
        return await self.reader.prompt(key, body)

    async def tool_arguments(
        self, key: Key, tool: str, arguments: Mapping[str, JSON]
    ) -> tuple[Reading, Mapping[str, JSON]]:
        return await self.reader.tool_arguments(key, tool, arguments)

    async def tool_answer(
        self, key: Key, tool: str, result: ToolResult
    ) -> tuple[Reading, ToolResult]:
        return await self.reader.tool_answer(key, tool, result)

    # ------------------------------------------------------------------ judge check

    async def judge_check(self, name: str | None = None) -> list[GuardCheckJson]:
        """Each policy's judge (or the one named) timed: three judgments of a 280-token
        prompt one after another, then BURST at once, against the policy's wait."""
        if name is not None:
            self.show(name)
        chosen = [p for p in self.kept.now.values() if name is None or p.name == name]
        out = []
        for policy in sorted(chosen, key=lambda p: p.name):
            if policy.judge is None:
                continue
            out.append(await self._check(policy))
        if name is not None and not out:
            raise Refusal(400, "bad_request", f"guard policy {name} names no judge")
        return out

    async def _check(self, policy: GuardPolicy) -> GuardCheckJson:
        assert policy.judge is not None
        wait = policy.wait_ms / 1000
        cap = max(10.0, wait * 3)  # measured past the wait, to say by how much

        async def timed() -> tuple[float, Said]:
            start = time.perf_counter()
            said = await self.judge.judge(policy.judge or "", CHECK_TEXT, cap)
            return time.perf_counter() - start, said

        one = [await timed() for _ in range(3)]
        start = time.perf_counter()
        burst = await asyncio.gather(*(timed() for _ in range(BURST)))
        wall = time.perf_counter() - start
        answered = [t for t, s in [*one, *burst] if s not in ("unanswered", "timeout")]
        verdicts = [t for t, s in [*one, *burst] if s in ("safe", "injection", "pii")]
        p50 = statistics.median(t for t, _ in one)
        burst_p50 = statistics.median(t for t, _ in burst)
        if not answered:
            state, advice = (
                "unavailable",
                (
                    f"the judge {policy.judge} gave no verdict: is it Ready "
                    f"(`llmgw ctl models`), and does it answer with one word?"
                ),
            )
        elif p50 < wait / 2 and burst_p50 < wait:
            state, advice = "ok", "the judge keeps up with the wait"
        elif p50 < wait:
            state, advice = (
                "tight",
                (
                    "close to the wait: under load judgments will miss it; give the judge a "
                    "bigger machine or more replicas, or a longer --wait"
                ),
            )
        else:
            then = "refused" if policy.fail == "closed" else "flagged"
            state, advice = (
                "slow",
                (
                    f"judgments take longer than the wait ({policy.wait_ms} ms): with fail "
                    f"{policy.fail} requests are {then}; "
                    "give the judge a bigger machine or more replicas, or a longer --wait"
                ),
            )
        if answered and not verdicts:
            advice += (
                f"; {policy.judge} answers, but never SAFE, INJECTION or PII first: the "
                "pattern rules decide alone (judge with a model that follows instructions)"
            )
        return {
            "policy": policy.name,
            "judge": policy.judge,
            "wait_ms": policy.wait_ms,
            "state": state,
            "single_ms": [round(t * 1000, 1) for t, _ in one],
            "burst": BURST,
            "burst_p50_ms": round(burst_p50 * 1000, 1),
            "per_second": round(BURST / wall, 2) if wall > 0 else None,
            "answered": len(answered),
            "advice": advice,
        }
