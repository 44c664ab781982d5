"""The guard's answers: its policies, its recent decisions, and a check of its judges."""

from typing import TypedDict


class GuardPolicyJson(TypedDict):
    """A guard policy (``GET /api/v1/guard/policies`` and each of its routes)."""

    name: str
    # A catalog model asked of each text; None: the pattern rules alone.
    judge: str | None
    injection: str  # block, flag
    pii: str  # redact, block, flag
    wait_ms: int
    fail: str  # closed, open
    # What to change for the policy to work as meant (a judge keeping its prompt cache).
    warnings: list[str]


class GuardDecisionJson(TypedDict):
    """One of the last decisions of this control plane (``GET /api/v1/guard/decisions``),
    newest first: never the text read or the data found, only where and what kind."""

    at: float
    policy: str
    verdict: str  # flag, redact, block, withhold, timeout
    key: str
    where: str  # prompt, tool_answer SERVER.TOOL, tool_args SERVER.TOOL
    found: str


class GuardCheckJson(TypedDict):
    """A policy's judge timed (``POST /api/v1/guard/judges/check``)."""

    policy: str
    judge: str
    wait_ms: int
    state: str  # ok, tight, slow, unavailable
    single_ms: list[float]
    burst: int
    burst_p50_ms: float
    per_second: float | None
    answered: int
    advice: str
