"""What the gateway checks in a request before any engine sees it.

Every field the gateway reads or caps is checked for type and range here, and the
request as a whole for size: nesting depth, number of messages, prompt characters. A
request that fails is the client's to fix (400 naming the field and the limit), so no
engine ever answers an error that was the client's doing, and no sequence of client
requests can count against a replica (the breaker judges only what is left).

Checked: ``model``; ``stream`` and ``stream_options``; ``max_tokens``,
``max_completion_tokens`` and llama.cpp's ``n_predict`` (every spelling of the answer's
length, so the model's ``max_output`` holds for each); ``n``; ``temperature``;
``top_p``; ``messages`` (each an object with a known role and text, parts or nothing
as content); ``prompt`` and ``input``; ``tools``; ``stop``. Other fields pass to the
engine unchanged: they are the engine's to judge, and its 4xx goes to the client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from llmgw.jsonvalue import JSON, JSONObject
from llmgw.server.schema import decode_json

Kind = Literal["chat", "completion", "embedding"]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# Every spelling of "at most this many tokens in the answer" an engine reads.
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")
MAX_N = 128
MAX_TOOLS = 512
MAX_STOP = 16
_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


@dataclass(frozen=True)
class Bounds:
    """The size of work one request may ask for (``gateway:`` in server.yaml)."""

    max_body: int = 32 * 2**20
    max_depth: int = 64
    max_messages: int = 4096
    max_prompt_chars: int = 8 * 2**20


class Rejected(Exception):
    """A request the client must fix; ``param`` names the field."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


def parse(raw: bytes, bounds: Bounds) -> JSONObject:
    """The body as a JSON object within ``bounds``' depth, or ``Rejected``."""
    try:
        body = decode_json(raw)
    except RecursionError:
        raise Rejected(
            f"the request body is nested deeper than {bounds.max_depth} levels",
            "too_deep",
        ) from None
    except ValueError as exc:  # UnicodeDecodeError is one too
        raise Rejected(f"the request body is not JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise Rejected("the request body must be a JSON object", "invalid_json")
    # Each container opens with one of these: fewer of them than the limit is a proof.
    if raw.count(b"{") + raw.count(b"[") > bounds.max_depth:
        _check_depth(body, bounds.max_depth)
    if _LONE_SURROGATE_ESCAPE.search(raw):
        _check_text(body)
    return body


def _check_depth(body: JSON, limit: int) -> None:
    stack: list[tuple[JSON, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise Rejected(
                f"the request body is nested deeper than {limit} levels "
                "(gateway.max_depth in server.yaml)",
                "too_deep",
            )
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, dict | list))


def _check_text(body: JSON) -> None:
    """No lone surrogate (``"\\ud800"``) anywhere: no engine can read one."""
    stack: list[JSON] = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise Rejected(
                    "the request holds a lone UTF-16 surrogate (\\ud800-\\udfff without "
                    "its pair); send valid Unicode",
                    "invalid_json",
                ) from None


# ---------------------------------------------------------------------- fields


def check(kind: Kind, body: JSONObject, bounds: Bounds) -> str:
    """Every field the gateway reads or caps, or ``Rejected`` naming the first bad one;
    returns the model the request names."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Rejected("the request names no model ('model' is required)", "missing_model", "model")
    if len(model) > 256:
        raise Rejected("'model' is longer than 256 characters", "invalid_value", "model")
    _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise Rejected("'stream_options' must be an object", "invalid_type", "stream_options")
        _bool(options, "include_usage", "stream_options.include_usage")
    for name in LENGTH_FIELDS:
        _whole(body, name, 0, 2**31 - 1)
    _whole(body, "n", 1, MAX_N)
    _number(body, "temperature", 0.0, 2.0)
    _number(body, "top_p", 0.0, 1.0)
    size = 0
    if kind == "chat":
        size = _messages(body.get("messages"), bounds)
    elif kind == "completion":
        size = _prompt(body.get("prompt"), "prompt", bounds)
    else:
        size = _prompt(body.get("input"), "input", bounds)
    if size > bounds.max_prompt_chars:
        raise Rejected(
            f"the prompt is {size:,} characters, over the limit of "
            f"{bounds.max_prompt_chars:,} (gateway.max_prompt_chars in server.yaml)",
            "prompt_too_large",
            "messages" if kind == "chat" else ("prompt" if kind == "completion" else "input"),
        )
    _tools(body.get("tools"))
    _stop(body.get("stop"))
    return model


def _bool(body: JSONObject, name: str, param: str | None = None) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise Rejected(f"'{param or name}' must be true or false", "invalid_type", param or name)


def _whole(body: JSONObject, name: str, low: int, high: int) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise Rejected(f"'{name}' must be a whole number", "invalid_type", name)
    if not low <= value <= high:
        raise Rejected(
            f"'{name}' must be from {low} to {high:,} (got {value})", "invalid_value", name
        )


def _number(body: JSONObject, name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Rejected(f"'{name}' must be a number", "invalid_type", name)
    if not low <= value <= high:
        raise Rejected(
            f"'{name}' must be from {low:g} to {high:g} (got {value})", "invalid_value", name
        )


def _chars(value: JSON) -> int:
    """Characters of text in a value (the parts of a message, say)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    if isinstance(value, dict):
        if value.get("type") == "image_url":
            return 0  # an image, not prompt text: its size is images.py's to cap
        return sum(_chars(v) for v in value.values())
    return 0


def _messages(messages: JSON, bounds: Bounds) -> int:
    if not isinstance(messages, list) or not messages:
        raise Rejected(
            "'messages' must be a list of one or more messages", "invalid_type", "messages"
        )
    if len(messages) > bounds.max_messages:
        raise Rejected(
            f"'messages' holds {len(messages):,} messages, over the limit of "
            f"{bounds.max_messages:,} (gateway.max_messages in server.yaml)",
            "too_many_messages",
            "messages",
        )
    size = 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise Rejected(f"'{where}' must be an object", "invalid_type", where)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise Rejected(
                f"'{where}.role' must be one of {', '.join(sorted(ROLES))}",
                "invalid_value",
                f"{where}.role",
            )
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise Rejected(
                        f"'{where}.content[{j}]' must be an object with a 'type'",
                        "invalid_type",
                        f"{where}.content",
                    )
        elif content is not None and not isinstance(content, str):
            raise Rejected(
                f"'{where}.content' must be text, a list of parts or null",
                "invalid_type",
                f"{where}.content",
            )
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise Rejected(f"'{where}.name' must be a string", "invalid_type", f"{where}.name")
        calls = message.get("tool_calls")
        if calls is not None and (
            not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls)
        ):
            raise Rejected(
                f"'{where}.tool_calls' must be a list of objects",
                "invalid_type",
                f"{where}.tool_calls",
            )
        size += _chars(content) + _chars(calls)
    return size


def _prompt(prompt: JSON, name: str, bounds: Bounds) -> int:
    """Text, a list of texts, a list of token ids, or a list of lists of token ids."""
    if isinstance(prompt, str):
        return len(prompt)
    if not isinstance(prompt, list) or not prompt:
        raise Rejected(
            f"'{name}' must be text, a list of texts or of token ids", "invalid_type", name
        )
    if len(prompt) > bounds.max_messages:
        raise Rejected(
            f"'{name}' holds {len(prompt):,} items, over the limit of {bounds.max_messages:,} "
            "(gateway.max_messages in server.yaml)",
            "too_many_messages",
            name,
        )
    texts = [p for p in prompt if isinstance(p, str)]
    if len(texts) == len(prompt):
        return sum(len(p) for p in texts)
    if all(_token_id(p) for p in prompt):
        return len(prompt)
    lists = [p for p in prompt if isinstance(p, list) and p and all(_token_id(t) for t in p)]
    if len(lists) == len(prompt):
        return sum(len(p) for p in lists)
    raise Rejected(
        f"'{name}' must be text, a list of texts, a list of token ids or a list of lists of "
        "token ids",
        "invalid_type",
        name,
    )


def _token_id(value: JSON) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


def _tools(tools: JSON) -> None:
    if tools is None:
        return
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise Rejected(
            f"'tools' must be a list of at most {MAX_TOOLS} tools", "invalid_type", "tools"
        )
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise Rejected(f"'{where}' must be an object with a 'type'", "invalid_type", where)
        if tool["type"] == "function":
            function = tool.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise Rejected(
                    f"'{where}.function' must be an object with a 'name'",
                    "invalid_type",
                    f"{where}.function",
                )
            parameters = function.get("parameters")
            if parameters is not None and not isinstance(parameters, dict):
                raise Rejected(
                    f"'{where}.function.parameters' must be a JSON Schema object",
                    "invalid_type",
                    f"{where}.function.parameters",
                )


def _stop(stop: JSON) -> None:
    if stop is None or isinstance(stop, str):
        return
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP
        or not all(isinstance(s, str) for s in stop)
    ):
        raise Rejected(
            f"'stop' must be text or a list of at most {MAX_STOP} texts", "invalid_type", "stop"
        )


# ------------------------------------------------------------------- changing


def hold_to(body: JSONObject, max_output: int | None) -> None:
    """The model's longest answer, whatever the request calls it; set when absent.
    (``check`` has made each a whole number or absent.)"""
    if max_output is None:
        return
    for name in LENGTH_FIELDS:
        asked = body.get(name)
        if isinstance(asked, int) and asked > max_output:
            body[name] = max_output
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = max_output


def ask_for_usage(body: JSONObject) -> bool:
    """A stream is asked to end with its usage, so it can be counted; returns whether
    the client asked for it itself (if not, it is kept from the client). (``check``
    has made ``stream_options`` an object or absent.)"""
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return True
    body["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    return False
