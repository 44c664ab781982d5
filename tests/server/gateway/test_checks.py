"""The gateway's checks of a request, before any engine sees it: every field it reads or
caps, the size of the work, and that nothing a client sends gets past them unchecked
(Hypothesis)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.server.gateway.checks import (
    LENGTH_FIELDS,
    ROLES,
    Bounds,
    Rejected,
    ask_for_usage,
    check,
    hold_to,
    parse,
)
from tests.support import hostile

BOUNDS = Bounds(max_depth=16, max_messages=50, max_prompt_chars=5000)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def rejected(kind: Any, body: Any, bounds: Bounds = BOUNDS) -> Rejected:
    with pytest.raises(Rejected) as info:
        check(kind, parse(json.dumps(body).encode(), bounds), bounds)
    return info.value


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"max_tokens": -1}, "max_tokens", "from 0 to"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "from 0 to"),
        ({"n_predict": -1}, "n_predict", "from 0 to"),
        ({"max_tokens": "5"}, "max_tokens", "whole number"),
        ({"max_tokens": 5.5}, "max_tokens", "whole number"),
        ({"max_tokens": True}, "max_tokens", "whole number"),
        ({"n": 0}, "n", "from 1 to 128"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"stream_options": []}, "stream_options", "an object"),
        ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "true or"),
        ({"temperature": 3}, "temperature", "from 0 to 2"),
        ({"temperature": "hot"}, "temperature", "a number"),
        ({"top_p": -0.1}, "top_p", "from 0 to 1"),
        ({"messages": []}, "messages", "one or more"),
        ({"messages": "hi"}, "messages", "one or more"),
        ({"messages": [5]}, "messages[0]", "an object"),
        ({"messages": [{"role": "king", "content": "x"}]}, "messages[0].role", "one of"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "text"),
        ({"messages": [{"role": "user", "content": [5]}]}, "messages[0].content", "'type'"),
        ({"messages": [{"role": "user", "name": 1}]}, "messages[0].name", "a string"),
        ({"tools": {}}, "tools", "a list"),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "'name'"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}]},
            "tools[0].function.parameters",
            "JSON Schema",
        ),
        ({"stop": 5}, "stop", "text or a list"),
        ({"model": 7}, "model", "names no model"),
    ],
)
def test_a_bad_field_is_refused_by_name(change: dict[str, Any], param: str, words: str) -> None:
    refusal = rejected("chat", {**CHAT, **change})
    assert refusal.param == param and words in refusal.message


def test_prompts_and_inputs_take_text_texts_or_token_ids() -> None:
    for good in ("once", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        check("completion", {"model": "m", "prompt": good}, BOUNDS)
        check("embedding", {"model": "m", "input": good}, BOUNDS)
    for bad in ([], [1, "a"], [[]], {"a": 1}, [-1], [True]):
        assert rejected("completion", {"model": "m", "prompt": bad}).param == "prompt"
        assert rejected("embedding", {"model": "m", "input": bad}).param == "input"


def test_the_size_of_the_work_is_bounded() -> None:
    deep: Any = "x"
    for _ in range(20):
        deep = [deep]
    assert rejected("chat", {**CHAT, "extra": deep}).code == "too_deep"
    many = [{"role": "user", "content": "x"}] * 51
    refusal = rejected("chat", {**CHAT, "messages": many})
    assert refusal.code == "too_many_messages" and "gateway.max_messages" in refusal.message
    big = [{"role": "user", "content": "x" * 5001}]
    refusal = rejected("chat", {**CHAT, "messages": big})
    assert refusal.code == "prompt_too_large" and "5,001 characters" in refusal.message
    # Python's own recursion limit is never what answers a very deep body.
    with pytest.raises(Rejected, match="nested deeper"):
        parse(b"[" * 100_000 + b"]" * 100_000, BOUNDS)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "temperature": NaN}',
        b'{"model": "m", "temperature": Infinity}',
        b'{"model": "m", "x": 1e999}',
        b'{"model": "m", "x": "\\ud800"}',
        b"\xff\xfe",
        b"[1, 2]",
        b"",
    ],
)
def test_json_no_engine_could_read_is_refused(raw: bytes) -> None:
    with pytest.raises(Rejected) as info:
        parse(raw, BOUNDS)
    assert info.value.code == "invalid_json"


def test_a_surrogate_pair_is_fine() -> None:
    body = parse(b'{"model": "m", "x": "\\ud83d\\ude00"}', BOUNDS)
    assert body["x"] == "\U0001f600"


def test_max_output_holds_for_every_spelling() -> None:
    for name in LENGTH_FIELDS:
        body: dict[str, Any] = {**CHAT, name: 10_000}
        hold_to(body, 64)
        assert body[name] == 64
    body = dict(CHAT)
    hold_to(body, 64)
    assert body["max_tokens"] == 64
    body = {**CHAT, "max_tokens": None}
    hold_to(body, 64)
    assert body["max_tokens"] == 64
    body = {**CHAT, "max_completion_tokens": 5}
    hold_to(body, 64)
    assert body == {**CHAT, "max_completion_tokens": 5}
    body = {**CHAT, "max_tokens": 10_000}
    hold_to(body, None)
    assert body["max_tokens"] == 10_000


def test_a_stream_always_asks_for_its_usage() -> None:
    body: dict[str, Any] = {**CHAT, "stream": True}
    assert ask_for_usage(body) is False
    assert body["stream_options"] == {"include_usage": True}
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    assert ask_for_usage(body) is True
    body = {**CHAT, "stream": True, "stream_options": {"continuous_usage_stats": True}}
    assert ask_for_usage(body) is False
    assert body["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


json_values = hostile.json_values(max_leaves=25, awkward=False)
FIELDS = [
    "model", "messages", "prompt", "input", "stream", "stream_options", "max_tokens",
    "max_completion_tokens", "n_predict", "n", "temperature", "top_p", "tools", "stop",
]  # fmt: skip


# Messages with the keys a message has, each any JSON value (a role that is an object...).
messages = st.lists(
    st.dictionaries(
        st.sampled_from(["role", "content", "name", "tool_calls"]),
        json_values | st.sampled_from(["user", "assistant", "system", "tool"]),
        max_size=4,
    ),
    max_size=3,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["chat", "completion", "embedding"]),
    body=st.dictionaries(
        st.sampled_from(FIELDS) | st.text(max_size=6), json_values | messages, max_size=8
    ),
    max_output=st.none() | st.integers(1, 4096),
)
def test_whatever_is_sent_is_refused_by_name_or_checked_and_capped(
    kind: Any, body: dict[str, Any], max_output: int | None
) -> None:
    """No body gets past the checks with a field the gateway reads of the wrong type,
    or with an answer longer than the model's max_output, in any spelling."""
    try:
        parsed = parse(json.dumps(body).encode(), BOUNDS)
        check(kind, parsed, BOUNDS)
    except Rejected as exc:
        assert exc.message and exc.code
        return
    assert isinstance(parsed["model"], str) and parsed["model"]
    for name in (*LENGTH_FIELDS, "n"):
        value = parsed.get(name)
        assert value is None or (type(value) is int and value >= 0)
    if kind == "chat":
        assert all(isinstance(m, dict) for m in parsed["messages"])
    hold_to(parsed, max_output)
    if max_output is not None and kind != "embedding":
        spelt = [parsed.get(n) for n in LENGTH_FIELDS if parsed.get(n) is not None]
        assert spelt and all(v <= max_output for v in spelt)
    # What goes to the engine is plain JSON any reader takes.
    json.loads(json.dumps(parsed, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(chat=messages)
def test_any_messages_are_refused_by_name_or_all_objects_with_a_known_role(
    chat: list[dict[str, Any]],
) -> None:
    try:
        check("chat", {"model": "m", "messages": chat}, BOUNDS)
    except Rejected as exc:
        assert exc.param is not None and exc.param.startswith("messages")
        return
    assert all(isinstance(m.get("role"), str) and m["role"] in ROLES for m in chat)
