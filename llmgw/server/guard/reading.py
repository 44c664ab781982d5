"""A key's guard policies applied to what it sends and gets: a ``/v1`` request's
prompt, a tool call's arguments before they leave, a tool's answer before it returns.

For each policy the key names (its own, then its levels'; a name no policy has is
skipped and logged once), in order, on the text as the previous one left it:

- the pattern rules (``rules.py``) find personal data and planted instructions;
- the policy's judge, when it names one, is asked too (``judge.py``), within its wait;
  it adds what the rules missed and never clears what they found. A judgment past the
  wait is ``timeout``: ``fail: closed`` refuses, ``open`` lets through, flagged.
- personal data: ``redact`` rewrites each piece as ``[REDACTED:KIND]``, ``block``
  refuses (naming the policy and the kind, never the data), ``flag`` lets it through
  and says so (``x-llmgw-guard: flagged POLICY``);
- an instruction: in the caller's own prompt or a call's arguments, ``block`` refuses
  and ``flag`` flags; in a tool's answer (an MCP result, or a ``role: tool`` message of
  a chat) ``block`` withholds it: the text is replaced by a notice naming the policy, so
  the instruction never reaches the model.

The strongest outcome of the policies wins (block, withhold, redact, flag, pass), and
each is recorded as a ``Decision`` (counted, kept, audited by ``service.py``).

A chat's judge reads only what is new since the model last spoke (the messages after
the last assistant message), each at once: earlier ones were judged when they were new.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from llmgw.jsonvalue import JSON, JSONObject
from llmgw.server.gateway.limits import Key
from llmgw.server.guard import rules
from llmgw.server.guard.judge import Said
from llmgw.server.guard.policies import GuardPolicy
from llmgw.server.mcp.tools import PASS, Reading, ToolResult, Verdict
from llmgw.server.refusal import Refusal

log = logging.getLogger("llmgw.guard")

HEADER = "x-llmgw-guard"
# Strength of each verdict: the strongest of a text's policies is its reading.
STRENGTH: dict[Verdict, int] = {
    "pass": 0,
    "flag": 1,
    "timeout": 1,
    "redact": 2,
    "withhold": 3,
    "block": 4,
}


class Judging(Protocol):
    async def judge(self, model: str, text: str, wait: float) -> Said: ...


@dataclass(frozen=True)
class Decision:
    """What a policy made of one text: never the text or the data found in it."""

    at: float
    policy: str
    verdict: Verdict
    key: str
    # prompt, tool_answer SERVER.TOOL, tool_args SERVER.TOOL
    where: str
    # "email at 12-30 (redacted: j***@***)", or why (the judge's timeout)
    found: str


@dataclass(frozen=True)
class Where:
    """What is read: the caller's prompt, a tool's answer, or a tool call's arguments."""

    kind: str  # prompt, tool_answer, tool_args
    tool: str = ""

    @property
    def label(self) -> str:
        return f"{self.kind} {self.tool}" if self.tool else self.kind

    @property
    def answer(self) -> bool:
        return self.kind == "tool_answer"


PROMPT = Where("prompt")


def withheld_notice(policy: str) -> str:
    return f"[withheld by guard policy {policy}: this tool answer held an instruction to the model]"


class Reader:
    """Reads texts with a key's policies; ``record`` takes each policy's decision."""

    def __init__(
        self,
        policies: Callable[[], Mapping[str, GuardPolicy]],
        judge: Judging,
        record: Callable[[Decision], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policies = policies
        self.judging = judge
        self.record = record
        self.clock = clock
        self._unknown: set[str] = set()

    def of(self, key: Key) -> list[GuardPolicy]:
        """The key's policies that exist; each missing name logged once."""
        known = self.policies()
        out = []
        for name in key.policies:
            policy = known.get(name)
            if policy is not None:
                out.append(policy)
            elif name not in self._unknown:
                self._unknown.add(name)
                log.warning("guard: no policy named %s (key %s): skipped", name, key.record.name)
        return out

    async def read(self, key: Key, text: str, where: Where, judged: bool = True) -> Reading:
        """``text`` read by every policy of ``key``; ``judged``: ask their judges too."""
        return (await self.outcome(key, text, where, judged))[0]

    async def outcome(
        self, key: Key, text: str, where: Where, judged: bool = True, ruled: bool = True
    ) -> tuple[Reading, list[str]]:
        """The reading, and the policies that flagged the text (flagged and redacted
        both, say: the answer still says it was flagged). ``ruled``: read by the pattern
        rules too (False: by the judges alone, of a text whose parts the rules read)."""
        reading = PASS
        flagged: list[str] = []
        for policy in self.of(key):
            if not ruled and policy.judge is None:
                continue
            current = reading.text if reading.text is not None else text
            said: Said = "none"
            if judged and policy.judge is not None:
                said = await self.judging.judge(policy.judge, current, policy.wait_ms / 1000)
            one, flags = self._apply(policy, current, where, said, key, ruled)
            if flags:
                flagged.append(policy.name)
            if STRENGTH[one.verdict] > STRENGTH[reading.verdict]:
                reading = replace(one, text=one.text or reading.text)
            elif one.text is not None:
                reading = replace(reading, text=one.text)
            if reading.verdict in ("block", "withhold"):
                break
        return reading, flagged

    def _apply(
        self, policy: GuardPolicy, text: str, where: Where, said: Said, key: Key, ruled: bool
    ) -> tuple[Reading, bool]:
        name = policy.name
        flags = False
        planted = rules.injections(text) if ruled else []
        found = rules.pii(text) if ruled else []
        notes = [f"{f.kind} at {f.start}-{f.end}" for f in planted + found]
        if said == "injection" and not planted:
            notes.append("injection (the judge)")
        if said == "pii" and not found:
            notes.append("personal data (the judge)")
        detail = "; ".join(notes)
        reading = PASS
        if said == "timeout":
            late = f"the judge {policy.judge} did not answer within {policy.wait_ms} ms"
            self._decide(key, name, "timeout", where, f"{late} (fail: {policy.fail})")
            if policy.fail == "closed":
                return Reading("block", None, name, f"{late} (fail: closed)", late=True), False
            reading, flags = Reading("timeout", None, name, late), True
        if planted or said == "injection":
            kinds = "an instruction to the model"
            if policy.injection == "flag":
                reading, flags = _stronger(reading, Reading("flag", None, name, kinds)), True
            elif where.answer:
                self._decide(key, name, "withhold", where, detail)
                return Reading("withhold", withheld_notice(name), name, f"{kinds}: withheld"), False
            else:
                self._decide(key, name, "block", where, detail)
                return Reading(
                    "block", None, name, f"{where.kind.replace('_', ' ')} holds {kinds}"
                ), False
        if found or said == "pii":
            kinds = ", ".join(dict.fromkeys(rules.WORDS[f.kind] for f in found)) or "personal data"
            if policy.pii == "block":
                self._decide(key, name, "block", where, _masked(text, found, detail))
                return Reading(
                    "block", None, name, f"{where.kind.replace('_', ' ')} holds {kinds}"
                ), False
            if policy.pii == "redact" and found:
                redacted = rules.redact(text, found)
                reading = _stronger(reading, Reading("redact", redacted, name, kinds))
            else:
                reading, flags = _stronger(reading, Reading("flag", None, name, kinds)), True
        if reading.verdict not in ("pass", "timeout"):
            shown = _masked(text, found, detail) if reading.verdict == "redact" else detail
            self._decide(key, name, reading.verdict, where, shown)
        elif reading.verdict == "pass" and ruled:
            self._decide(key, name, "pass", where, "")
        return reading, flags

    def _decide(self, key: Key, policy: str, verdict: Verdict, where: Where, found: str) -> None:
        self.record(Decision(self.clock(), policy, verdict, key.record.name, where.label, found))

    # ------------------------------------------------------------------ /v1

    async def prompt(self, key: Key, body: JSONObject) -> str | None:
        """A ``/v1`` request read before it is routed: its text rewritten in place where
        redacted or withheld; a ``Refusal`` where a policy refuses it (400; 503 when its
        judge was late). Returns the ``x-llmgw-guard`` header's value when a policy
        flagged it, else None."""
        texts = list(_texts(body))
        new_from = _new_from(body)
        outcomes = await asyncio.gather(
            *(
                self.outcome(key, text, where, judged=index >= new_from)
                for index, text, where, _ in texts
            )
        )
        flagged: list[str] = []
        for (_, _, _, put), (reading, flags) in zip(texts, outcomes, strict=True):
            if reading.refused and reading.late:
                # Nothing wrong with the request: the judge was slow. A client may retry.
                raise Refusal(
                    503,
                    "guard_timeout",
                    f"refused by guard policy {reading.policy}: {reading.reason}; try again",
                )
            if reading.refused:
                raise Refusal(
                    400,
                    "guard_blocked",
                    f"refused by guard policy {reading.policy}: {reading.reason}",
                )
            if reading.text is not None:
                put(reading.text)
            flagged += flags
        if flagged:
            return "flagged " + ",".join(dict.fromkeys(flagged))
        return None

    # ------------------------------------------------------------------ MCP (ToolGuard)

    async def tool_arguments(
        self, key: Key, tool: str, arguments: Mapping[str, JSON]
    ) -> tuple[Reading, Mapping[str, JSON]]:
        """Every string in the arguments, however nested, read by the rules; then the
        judges read them all at once (one judgment a call, not one a string)."""
        where = Where("tool_args", tool)
        leaves: list[str] = []
        _strings(dict(arguments), leaves.append)
        strongest = PASS
        rewritten: dict[int, str] = {}
        for index, text in enumerate(leaves):
            reading = await self.read(key, text, where, judged=False)
            if reading.refused:
                return reading, arguments
            if reading.text is not None:
                rewritten[index] = reading.text
            strongest = _stronger(strongest, reading)
        if leaves:
            joined = "\n".join(rewritten.get(i, t) for i, t in enumerate(leaves))
            judged, _ = await self.outcome(key, joined, where, ruled=False)
            if judged.refused:
                return judged, arguments
            strongest = _stronger(strongest, replace(judged, text=None))
        if not rewritten:
            return strongest, arguments
        count = iter(range(len(leaves)))
        out = _replaced(dict(arguments), lambda text: rewritten.get(next(count), text))
        assert isinstance(out, dict)
        return strongest, out

    async def tool_answer(
        self, key: Key, tool: str, result: ToolResult
    ) -> tuple[Reading, ToolResult]:
        blocks = [b for b in result.content if isinstance(b, dict) and b.get("type") == "text"]
        text = "\n".join(str(b.get("text", "")) for b in blocks)
        if not text:
            return PASS, result
        reading = await self.read(key, text, Where("tool_answer", tool))
        if reading.text is None and not reading.refused:
            return reading, result
        replaced = reading.text
        if replaced is None:
            replaced = withheld_notice(reading.policy or "")
        content: list[JSON] = [b for b in result.content if b not in blocks]
        content.insert(0, {"type": "text", "text": replaced})
        return reading, ToolResult(content, result.is_error, None)


def _stronger(a: Reading, b: Reading) -> Reading:
    if STRENGTH[b.verdict] > STRENGTH[a.verdict]:
        return replace(b, text=b.text or a.text)
    return replace(a, text=b.text or a.text)


def _strings(value: JSON, take: Callable[[str], None]) -> None:
    """Each string in ``value``, depth first, keys in their order."""
    if isinstance(value, str):
        take(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, take)
    elif isinstance(value, list):
        for item in value:
            _strings(item, take)


def _replaced(value: JSON, put: Callable[[str], str]) -> JSON:
    """``value`` with each string, in ``_strings``'s order, as ``put`` gives it."""
    if isinstance(value, str):
        return put(value)
    if isinstance(value, dict):
        return {k: _replaced(v, put) for k, v in value.items()}
    if isinstance(value, list):
        return [_replaced(v, put) for v in value]
    return value


def _masked(text: str, found: list[rules.Finding], detail: str) -> str:
    if not found:
        return detail
    return "; ".join(
        f"{f.kind} at {f.start}-{f.end} (redacted: {rules.masked(text, f)})" for f in found
    )


Put = Callable[[str], None]


def _texts(body: JSONObject) -> list[tuple[int, str, Where, Put]]:
    """Each text of a request: its message's index, the text, what it is, and how to put
    a rewritten one in its place."""
    out: list[tuple[int, str, Where, Put]] = []
    prompt = body.get("prompt")
    if isinstance(prompt, str):

        def put_prompt(text: str) -> None:
            body["prompt"] = text

        out.append((0, prompt, PROMPT, put_prompt))
    messages = body.get("messages")
    if not isinstance(messages, list):
        return out
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        where = PROMPT
        if message.get("role") == "tool":
            name = message.get("name") or message.get("tool_call_id") or ""
            where = Where("tool_answer", str(name))
        content = message.get("content")
        if isinstance(content, str):
            out.append((index, content, where, _putter(message, "content")))
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    out.append((index, str(part["text"]), where, _putter(part, "text")))
    return out


def _putter(holder: dict[str, JSON], field: str) -> Put:
    def put(text: str) -> None:
        holder[field] = text

    return put


def _new_from(body: JSONObject) -> int:
    """The index of the first message after the last assistant message (0: all new)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "assistant":
            return index + 1
    return 0
