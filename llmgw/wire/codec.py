"""Dataclasses to plain maps and back, checked field by field.

``to_map`` leaves out None fields (absent, never 0). ``from_map`` ignores keys it does not
know and refuses a known field of the wrong type, naming it. The checking for each
dataclass is worked out once, from its type hints, into a list of small functions, so
decoding a heartbeat does no type introspection: the agents' port decodes thousands a
second.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, Union

_T = TypeVar("_T")
Coerce = Callable[[Any, str], Any]


class MessageError(ValueError):
    """A frame that names a known message but does not hold a valid one."""


def to_map(obj: Any) -> Any:
    """A dataclass (recursively) as plain maps and lists, with None fields left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is not None:
                out[f.name] = to_map(value)
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [to_map(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_map(v) for k, v in obj.items()}
    return obj


def _wrong(where: str, expected: str, value: Any) -> MessageError:
    return MessageError(f"{where}: expected {expected}, got {value!r:.60}")


def _scalar(tp: type) -> Coerce:
    if tp is float:

        def as_float(value: Any, where: str) -> Any:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            raise _wrong(where, "float", value)

        return as_float
    if tp is int:

        def as_int(value: Any, where: str) -> Any:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise _wrong(where, "int", value)

        return as_int

    def as_type(value: Any, where: str) -> Any:
        if isinstance(value, tp):
            return value
        raise _wrong(where, tp.__name__, value)

    return as_type


_COERCERS: dict[Any, Coerce] = {}


def _coercer(tp: Any) -> Coerce:
    """The checking function for one type, made once and kept."""
    found = _COERCERS.get(tp)
    if found is not None:
        return found
    origin = typing.get_origin(tp)
    coerce: Coerce
    if tp is Any:

        def coerce(value: Any, where: str) -> Any:
            return value

    elif origin is Union or origin is types.UnionType:
        (inner_tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = _coercer(inner_tp)

        def coerce(value: Any, where: str) -> Any:
            return None if value is None else inner(value, where)

    elif origin is list:
        item = _coercer(typing.get_args(tp)[0])

        def coerce(value: Any, where: str) -> Any:
            if not isinstance(value, list):
                raise MessageError(f"{where}: expected a list, got {type(value).__name__}")
            return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]

    elif origin is dict:
        entry = _coercer(typing.get_args(tp)[1])

        def coerce(value: Any, where: str) -> Any:
            if not isinstance(value, dict):
                raise MessageError(f"{where}: expected a map, got {type(value).__name__}")
            return {str(k): entry(v, f"{where}.{k}") for k, v in value.items()}

    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = tp
        names = ", ".join(str(m.value) for m in members)

        def coerce(value: Any, where: str) -> Any:
            try:
                return members(value)
            except ValueError:
                raise _wrong(where, f"one of {names}", value) from None

    elif dataclasses.is_dataclass(tp) and isinstance(tp, type):
        cls = tp

        def coerce(value: Any, where: str) -> Any:
            if not isinstance(value, dict):
                raise MessageError(f"{where}: expected a map, got {type(value).__name__}")
            return from_map(cls, value, where)

    else:
        coerce = _scalar(tp)
    _COERCERS[tp] = coerce
    return coerce


# Per dataclass: (field name, its checking function, whether it must be present, and the
# exact types a value may have to be taken as it is, without calling the function).
_PLANS: dict[type, list[tuple[str, Coerce, bool, frozenset[type]]]] = {}
_AS_IS = {int: int, str: str, bool: bool, float: float}


def _as_is(tp: Any) -> frozenset[type]:
    """Exact types taken unchecked: the field's own scalar type (``int`` never admits a
    bool: ``type(True)`` is ``bool``), and None where the field is optional. A float
    field given an int goes through its function, which makes it a float."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else (tp,)
    found: set[type] = set()
    for arg in args:
        if arg is type(None):
            found.add(type(None))
        elif arg in _AS_IS:
            found.add(_AS_IS[arg])
        else:
            return frozenset()  # a list, map, enum or dataclass: always checked
    return frozenset(found)


def _plan(cls: type) -> list[tuple[str, Coerce, bool, frozenset[type]]]:
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        plan = [
            (
                f.name,
                _coercer(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                _as_is(hints[f.name]),
            )
            for f in dataclasses.fields(cls)
        ]
        _PLANS[cls] = plan
    return plan


def from_map(cls: type[_T], data: dict[str, Any], where: str = "") -> _T:
    """Build ``cls`` from a map, ignoring keys it does not know."""
    kwargs: dict[str, Any] = {}
    for name, coerce, required, as_is in _plan(cls):
        if name in data:
            value = data[name]
            if type(value) in as_is:
                kwargs[name] = value
            else:
                kwargs[name] = coerce(value, f"{where or cls.__name__}.{name}")
        elif required:
            raise MessageError(f"{where or cls.__name__}: missing field {name!r}")
    return cls(**kwargs)
