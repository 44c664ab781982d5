"""Whether a decoded JSON answer is the shape (a ``llmgw.wire.admin`` TypedDict) the
admin client reads it as: what tests/server/api/test_answer_shapes.py holds every route
to, and what a service's own tests use for the answers they get."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, NotRequired, Union, get_args, get_origin, get_type_hints


def problems(shape: Any, value: object, where: str = "$") -> list[str]:
    """Every way ``value`` (decoded JSON) differs from ``shape``, a type of
    ``llmgw.wire.admin``: a key missing or extra, or a value of another type."""
    if typing.is_typeddict(shape):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object ({shape.__name__})"]
        hints = get_type_hints(shape, include_extras=True)
        missing = sorted(shape.__required_keys__ - value.keys())
        extra = sorted(value.keys() - hints.keys())
        out = [f"{where}: {shape.__name__} lacks {k!r}" for k in missing]
        out += [f"{where}: {shape.__name__} does not declare {k!r}" for k in extra]
        for key, hint in hints.items():
            if key in value:
                if get_origin(hint) is NotRequired:
                    (hint,) = get_args(hint)
                out += problems(hint, value[key], f"{where}.{key}")
        return out
    origin, args = get_origin(shape), get_args(shape)
    if origin in (Union, types.UnionType):
        arms = [problems(arm, value, where) for arm in args]
        if any(not p for p in arms):
            return []
        # The arm that came nearest says what is wrong.
        return min(arms, key=len)
    if origin is Literal:
        return [] if value in args else [f"{where}: {value!r} is none of {args}"]
    if origin is tuple:  # a fixed pair in JSON: a list of that length
        if not isinstance(value, list) or len(value) != len(args):
            return [f"{where}: {value!r} is not a list of {len(args)}"]
        return [
            p
            for i, (a, v) in enumerate(zip(args, value, strict=True))
            for p in problems(a, v, f"{where}[{i}]")
        ]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        return [p for i, item in enumerate(value) for p in problems(args[0], item, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object"]
        return [p for k, item in value.items() for p in problems(args[1], item, f"{where}.{k}")]
    if shape is object:
        return []
    if shape is type(None):
        return [] if value is None else [f"{where}: {value!r} is not null"]
    if shape is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif shape is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, shape)
    return [] if ok else [f"{where}: {value!r} is not {shape.__name__}"]


def check(shape: Any, value: object) -> None:
    found = problems(shape, value)
    assert not found, "\n".join(found)
