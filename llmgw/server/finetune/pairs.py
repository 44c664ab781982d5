"""A fine-tune's pairs file, judged before anything is sent to a node.

JSONL: each non-blank line one object, either ``{"prompt": str, "completion": str}``
or the chat form ``{"messages": [{"role": str, "content": str}, ...]}`` (at least one
message, and an assistant's among them: that is what is learned). At most
``MAX_BYTES`` and ``MAX_LINES`` lines; not empty. Every refusal names the line and
says what that line should hold. Nothing here does IO.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from llmgw.server.refusal import Refusal

MAX_BYTES = 32 * 1024 * 1024
MAX_LINES = 100_000
ROLES = frozenset({"system", "user", "assistant"})
FORMS = (
    'each line must be {"prompt": "...", "completion": "..."} or '
    '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}]}'
)


@dataclass(frozen=True)
class Pairs:
    """A pairs file that passed: its bytes as sent, how many pairs, their sha256."""

    data: bytes
    count: int
    sha256: str


def _refuse(message: str) -> Refusal:
    return Refusal(400, "invalid_data", message, "data")


def check(data: bytes) -> Pairs:
    """The pairs in ``data``, or a Refusal naming the first line that is wrong."""
    if len(data) > MAX_BYTES:
        raise _refuse(
            f"the pairs file is {len(data):,} bytes; at most {MAX_BYTES:,} (32 MiB) are "
            "taken: train on a sample of it"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise _refuse(f"line {line}: not UTF-8 text; the pairs file must be UTF-8 JSONL") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) > MAX_LINES:
        raise _refuse(f"the pairs file has {len(lines):,} lines; at most {MAX_LINES:,} are taken")
    count = 0
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        _line(number, raw)
        count += 1
    if count == 0:
        raise _refuse(f"the pairs file holds no pairs; {FORMS}, one per line")
    return Pairs(data, count, hashlib.sha256(data).hexdigest())


def _line(number: int, raw: str) -> None:
    try:
        item = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _refuse(
            f"line {number}: not JSON ({exc.msg} at column {exc.colno}); {FORMS}"
        ) from None
    if not isinstance(item, dict):
        raise _refuse(f"line {number}: a JSON {type(item).__name__}, not an object; {FORMS}")
    if "messages" in item:
        _messages(number, item["messages"])
        return
    for key in ("prompt", "completion"):
        value = item.get(key)
        if not isinstance(value, str):
            said = "missing" if value is None else f"a {type(value).__name__}, not text"
            raise _refuse(f"line {number}: {key!r} is {said}; {FORMS}")
    if not item["completion"].strip():
        raise _refuse(f"line {number}: 'completion' is empty: there is nothing to learn")


def _messages(number: int, messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise _refuse(f"line {number}: 'messages' must be a list of messages, not empty")
    for i, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            raise _refuse(f"line {number}: message {i} is not an object; {FORMS}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise _refuse(
                f"line {number}: message {i} has role {role!r}; one of "
                f"{', '.join(sorted(ROLES))} is taken"
            )
        if not isinstance(content, str):
            raise _refuse(f"line {number}: message {i} has no text 'content'")
    if not any(m.get("role") == "assistant" for m in messages):
        raise _refuse(
            f"line {number}: no assistant message: the assistant's answers are what is learned"
        )
