"""Typed requests: frozen dataclasses whose fields say what they accept.

One declaration serves three readers: ``read`` turns a JSON body (or a query string)
into the dataclass or raises ``Invalid`` naming the field and what it takes; the
services take the dataclass, never the raw body; ``json_schema`` writes the same rules
as JSON Schema for ``/api/v1/openapi.json``. A field's rules are given with ``spec``::

    @dataclass(frozen=True)
    class CreateKey:
        name: str = spec(doc="whose key it is", pattern=KEY_NAME, max_length=64)
        rpm: int | None = spec(None, minimum=1, maximum=MAX_LIMIT)

What every value gets without being asked: numbers are finite and whole numbers stay
within what the store and a JavaScript client can hold (2^53); text is valid Unicode
without NUL (SQLite cannot keep a lone surrogate, and C code stops at NUL) and has a
length limit; lists and maps have a size limit; unknown fields are refused by name, so
a misspelt field is never silently dropped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from collections.abc import Mapping, Sized
from dataclasses import MISSING, dataclass
from typing import Any, NoReturn, TypedDict, TypeVar, Unpack, overload

from llmgw.jsonvalue import JSON, JSONObject

T = TypeVar("T")
_V = TypeVar("_V")

# The largest whole number any field takes: what a double (and so a JavaScript client)
# holds exactly, and far inside SQLite's 64-bit integers.
MAX_INT = 2**53
MAX_TEXT = 1024
MAX_ITEMS = 256


class Invalid(ValueError):
    """A request that does not fit its type: ``field`` is the path of the value
    (``keys[1].weight``), empty for the body as a whole."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Spec:
    """The rules of one value. ``items`` are the rules of a list's items or a map's
    values, ``keys`` of a map's keys."""

    doc: str = ""
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None
    min_length: int = 0
    pattern: re.Pattern[str] | None = None
    # What the pattern allows, in words, for the error message.
    pattern_doc: str = ""
    max_items: int | None = None
    min_items: int = 0
    items: Spec | None = None
    keys: Spec | None = None
    example: JSON = None


class Rules(TypedDict, total=False):
    """``Spec``'s fields, as ``spec`` takes them (a test keeps the two alike)."""

    doc: str
    minimum: float | None
    maximum: float | None
    max_length: int | None
    min_length: int
    pattern: re.Pattern[str] | None
    pattern_doc: str
    max_items: int | None
    min_items: int
    items: Spec | None
    keys: Spec | None
    example: JSON


@overload
def spec(**rules: Unpack[Rules]) -> Any: ...  # required: fits any field, as field() does
@overload
def spec(default: _V, **rules: Unpack[Rules]) -> _V: ...
def spec(default: object = MISSING, **rules: Unpack[Rules]) -> object:
    """A dataclass field with its rules (see ``Spec``); no default means required."""
    if isinstance(default, list | dict):
        raise TypeError("use a tuple or None as a default, never a mutable value")
    return dataclasses.field(default=default, metadata={"spec": Spec(**rules)})


def _spec_of(f: dataclasses.Field[object]) -> Spec:
    found = f.metadata.get("spec")
    return found if isinstance(found, Spec) else Spec()


# A field's type as ``typing.get_type_hints`` gives it: a class, or a form such as
# ``int | None``, ``tuple[str, ...]`` or ``Literal["a", "b"]``, taken apart with
# ``typing.get_origin`` and ``typing.get_args``.
TypeForm = object


def _hints(cls: type) -> dict[str, TypeForm]:
    return typing.get_type_hints(cls)


def _is_optional(tp: TypeForm) -> tuple[bool, TypeForm]:
    args = typing.get_args(tp)
    if _is_union(tp) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return True, rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
    return False, tp


def _is_union(tp: TypeForm) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _kind(value: object) -> str:
    """A JSON value's kind, as an error message says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# ------------------------------------------------------------------------- reading


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:32]} is out of range")
    return value


# One decoder for every request (json.loads with hooks would build one a call).
_STRICT = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def decode_json(raw: bytes) -> JSON:
    """JSON as every reader reads it: NaN, Infinity and numbers past a double's range
    refused (``ValueError``, as for text that is not JSON, or not UTF-8). Nesting deeper
    than Python's recursion limit raises ``RecursionError``."""
    found: JSON = _STRICT.decode(raw.decode("utf-8"))
    return found


def read(cls: type[T], data: object, where: str = "") -> T:
    """``cls`` from a JSON object, or ``Invalid`` naming the first value that does not fit."""
    if not isinstance(data, dict):
        raise Invalid(where, f"must be a JSON object, not {_kind(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            allowed = ", ".join(sorted(fields)) or "none"
            raise Invalid(_join(where, str(key)), f"unknown field (the fields are: {allowed})")
    hints = _hints(cls)
    values: dict[str, object] = {}
    for name, f in fields.items():
        path = _join(where, name)
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise Invalid(path, "is required")
            continue
        values[name] = _value(data[name], hints[name], _spec_of(f), path)
    return cls(**values)


def read_query(cls: type[T], params: Mapping[str, str]) -> T:
    """``cls`` from a URL's query: each value's text read as the field's type."""
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    data: dict[str, object] = {}
    for key, text in params.items():
        if key not in fields:
            allowed = ", ".join(sorted(fields)) or "none"
            raise Invalid(key, f"unknown parameter (the parameters are: {allowed})")
        _, tp = _is_optional(hints[key])
        data[key] = _from_text(text, tp, key)
    return read(cls, data)


def _from_text(text: str, tp: TypeForm, path: str) -> bool | int | float | str:
    if tp is bool:
        lowered = text.lower()
        if lowered in ("1", "true", "yes"):
            return True
        if lowered in ("0", "false", "no", ""):
            return False
        raise Invalid(path, f"must be true or false (1 or 0), not {text!r}")
    if tp is int:
        if re.fullmatch(r"[+-]?\d{1,20}", text):
            return int(text)
        raise Invalid(path, f"must be a whole number, not {text!r}")
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise Invalid(path, f"must be a number, not {text!r}") from None
    return text


def _value(value: object, tp: TypeForm, rules: Spec, path: str) -> object:
    optional, tp = _is_optional(tp)
    if value is None:
        if optional:
            return None
        raise Invalid(path, f"must be {_describe(tp, rules)}, not null")
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if isinstance(value, str) and value in choices:
            return value
        raise Invalid(path, f"must be one of {', '.join(map(str, choices))} (got {value!r})")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return read(tp, value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise Invalid(path, f"must be true or false, not {_kind(value)}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
                value = int(value)
            else:
                raise Invalid(path, f"must be {_describe(tp, rules)}, not {_shown(value)}")
        return _in_range(value, rules, path, whole=True)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(path, f"must be {_describe(tp, rules)}, not {_shown(value)}")
        if not math.isfinite(value):
            raise Invalid(path, "must be a finite number")
        return float(_in_range(value, rules, path, whole=False))
    if tp is str:
        if not isinstance(value, str):
            raise Invalid(path, f"must be {_describe(tp, rules)}, not {_kind(value)}")
        return _text(value, rules, path)
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise Invalid(path, f"must be a list, not {_kind(value)}")
        _count(value, rules, path)
        (inner, *_) = typing.get_args(tp)
        items = [
            _value(v, inner, rules.items or Spec(), f"{path}[{i}]") for i, v in enumerate(value)
        ]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise Invalid(path, f"must be an object, not {_kind(value)}")
        _count(value, rules, path)
        key_tp, value_tp = typing.get_args(tp)
        out: dict[object, object] = {}
        for k, v in value.items():
            key = _value(k, key_tp, rules.keys or Spec(), f"{path} key {k!r}")
            out[key] = _value(v, value_tp, rules.items or Spec(), f"{path}.{k}")
        return out
    if _is_union(tp):
        for option in typing.get_args(tp):
            try:
                return _value(value, option, rules, path)
            except Invalid:
                continue
        raise Invalid(path, f"must be {_describe(tp, rules)}, not {_shown(value)}")
    raise TypeError(f"{path}: the type {tp!r} cannot be read from JSON")


def _shown(value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value) if len(repr(value)) <= 40 else "a number out of range"
    return _kind(value)


def _in_range(value: float, rules: Spec, path: str, whole: bool) -> float:
    low = rules.minimum if rules.minimum is not None else (-MAX_INT if whole else None)
    high = rules.maximum if rules.maximum is not None else (MAX_INT if whole else None)
    if (low is not None and value < low) or (high is not None and value > high):
        raise Invalid(path, f"must be {_range_words(low, high, whole)} (got {_shown(value)})")
    return value


def _range_words(low: float | None, high: float | None, whole: bool) -> str:
    kind = "a whole number" if whole else "a number"

    def n(x: float) -> str:
        return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"

    if low is not None and high is not None:
        return f"{kind} from {n(low)} to {n(high)}"
    if low is not None:
        return f"{kind} of {n(low)} or more"
    if high is not None:
        return f"{kind} of {n(high)} or less"
    return kind


def _text(value: str, rules: Spec, path: str) -> str:
    limit = rules.max_length if rules.max_length is not None else MAX_TEXT
    if len(value) > limit:
        raise Invalid(path, f"must be at most {limit:,} characters (got {len(value):,})")
    if len(value) < rules.min_length:
        raise Invalid(path, "must not be empty" if rules.min_length == 1 else "is too short")
    if "\x00" in value:
        raise Invalid(path, "must not hold a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid(path, "must be valid Unicode (it holds a lone surrogate)") from None
    if rules.pattern is not None and not rules.pattern.fullmatch(value):
        words = rules.pattern_doc or f"match {rules.pattern.pattern}"
        raise Invalid(path, f"{value!r} is not allowed: {words}")
    return value


def _count(value: Sized, rules: Spec, path: str) -> None:
    limit = rules.max_items if rules.max_items is not None else MAX_ITEMS
    if len(value) > limit:
        raise Invalid(path, f"must hold at most {limit:,} items (got {len(value):,})")
    if len(value) < rules.min_items:
        raise Invalid(path, f"must hold at least {rules.min_items} item(s)")


def _describe(tp: TypeForm, rules: Spec) -> str:
    if tp is bool:
        return "true or false"
    if tp is int:
        return _range_words(
            rules.minimum if rules.minimum is not None else -MAX_INT,
            rules.maximum if rules.maximum is not None else MAX_INT,
            True,
        )
    if tp is float:
        return _range_words(rules.minimum, rules.maximum, False)
    if tp is str:
        return "a string"
    if _is_union(tp):
        return " or ".join(_describe(a, rules) for a in typing.get_args(tp))
    return "an object" if dataclasses.is_dataclass(tp) else str(tp)


# ------------------------------------------------------------------ JSON Schema


PLAIN_TEXT = r"^[^\u0000\ud800-\udfff]*$"


def json_schema(cls: type) -> dict[str, Any]:
    """The dataclass as a JSON Schema object, with the same rules ``read`` applies.
    (Its readers index into it as a schema: ``body["properties"][name]``.)"""
    hints = _hints(cls)
    properties: JSONObject = {}
    required: list[JSON] = []
    for f in dataclasses.fields(cls):
        rules = _spec_of(f)
        properties[f.name] = _schema(hints[f.name], rules)
        if f.default is MISSING and f.default_factory is MISSING:
            required.append(f.name)
    out: JSONObject = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        out["description"] = " ".join(cls.__doc__.split())
    if required:
        out["required"] = required
    return out


def _schema(tp: TypeForm, rules: Spec) -> JSONObject:
    optional, tp = _is_optional(tp)
    out = _schema_of(tp, rules)
    if rules.doc:
        out["description"] = rules.doc
    if rules.example is not None:
        out["example"] = rules.example
    if optional:
        return {
            "anyOf": [out, {"type": "null"}],
            **({"description": rules.doc} if rules.doc else {}),
        }
    return out


def _schema_of(tp: TypeForm, rules: Spec) -> JSONObject:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return {"type": "string", "enum": list(typing.get_args(tp))}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return json_schema(tp)
    if tp is bool:
        return {"type": "boolean"}
    if tp is int or tp is float:
        whole = tp is int
        out: JSONObject = {"type": "integer" if whole else "number"}
        low = rules.minimum if rules.minimum is not None else (-MAX_INT if whole else None)
        high = rules.maximum if rules.maximum is not None else (MAX_INT if whole else None)
        if low is not None:
            out["minimum"] = int(low) if whole else low
        if high is not None:
            out["maximum"] = int(high) if whole else high
        return out
    if tp is str:
        out = {"type": "string", "maxLength": rules.max_length or MAX_TEXT}
        if rules.min_length:
            out["minLength"] = rules.min_length
        if rules.pattern is not None:
            out["pattern"] = _ecma(rules.pattern.pattern)
        else:
            # What every text is refused for without a pattern of its own: NUL, and a lone
            # surrogate (code points, as ECMA's "u" flag and Python's re read it).
            out["pattern"] = PLAIN_TEXT
        return out
    if origin in (tuple, list):
        (inner, *_) = typing.get_args(tp)
        out = {"type": "array", "items": _schema(inner, rules.items or Spec())}
        out["maxItems"] = rules.max_items if rules.max_items is not None else MAX_ITEMS
        if rules.min_items:
            out["minItems"] = rules.min_items
        return out
    if origin is dict:
        _, value_tp = typing.get_args(tp)
        out = {
            "type": "object",
            "additionalProperties": _schema(value_tp, rules.items or Spec()),
            "maxProperties": rules.max_items if rules.max_items is not None else MAX_ITEMS,
        }
        if rules.keys is not None and rules.keys.pattern is not None:
            out["propertyNames"] = {
                "pattern": _ecma(rules.keys.pattern.pattern),
                "maxLength": rules.keys.max_length or MAX_TEXT,
            }
        return out
    if _is_union(tp):
        return {"anyOf": [_schema_of(a, rules) for a in typing.get_args(tp)]}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _ecma(pattern: str) -> str:
    """A Python pattern as JSON Schema's (ECMA 262) dialect: anchored, as ``fullmatch``
    reads it."""
    body = pattern.removeprefix("^").removesuffix("$").removesuffix(r"\Z")
    return f"^(?:{body})$"
