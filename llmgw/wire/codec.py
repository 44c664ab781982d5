"""Dataclasses to plain maps and back, checked field by field.

``to_map`` leaves out None fields (absent, never 0). ``from_map`` ignores keys it does not
know and refuses a known field of the wrong type, naming it. The checking for each
dataclass is worked out once, from its type hints, into a list of small functions, so
decoding a heartbeat does no type introspection: the agents' port decodes thousands a
second.

``decoder`` goes further for the messages: per dataclass it writes one Python function
that reads every field and checks its type inline (a card's 33 fields in one call, not 33
calls and a dict of keywords), for the maps a well-behaved peer sends. Anything it does
not take as it is (an int for a float, a wrong type, a missing field) sends the whole
map through ``from_map`` instead, which decodes it the same way or says what is wrong.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, Union, cast

_T = TypeVar("_T")
Coerce = Callable[[Any, str], Any]
# A written decoder: a map as the wire carries it to its record, or ``_Slow``.
Fast = Callable[[dict[str, Any]], object]


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


# --- compiled decoders: one generated function per dataclass -----------------------------


class _Slow(Exception):
    """The fast decoder met something it does not take as it is: ``from_map`` decides."""


def _slow() -> NoReturn:
    raise _Slow


def _as_float(value: object) -> float:
    if type(value) is int:
        return float(value)
    raise _Slow


_DECODERS: dict[type, Callable[[dict[str, Any]], object]] = {}
_FAST: dict[type, Fast] = {}


class _Writer:
    """The source of one dataclass's fast decoder and the names it refers to."""

    def __init__(self) -> None:
        self.names: dict[str, object] = {
            "_slow": _slow,
            "_as_float": _as_float,
            "_new": object.__new__,
            "_set": object.__setattr__,
        }

    def name(self, value: object, hint: str) -> str:
        for key, known in self.names.items():
            if known is value:
                return key
        key = f"_{hint}{len(self.names)}"
        self.names[key] = value
        return key

    def expr(self, tp: object, var: str, depth: int) -> str:
        """An expression that is ``var`` decoded as ``tp``, or raises ``_Slow``."""
        origin = typing.get_origin(tp)
        if tp is Any:
            return var
        if origin is Union or origin is types.UnionType:
            (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
            return f"(None if {var} is None else {self.expr(inner, var, depth)})"
        if origin is list:
            item = f"_i{depth}"
            inner = self.expr(typing.get_args(tp)[0], item, depth + 1)
            return f"([{inner} for {item} in {var}] if type({var}) is list else _slow())"
        if origin is dict:
            k, v = f"_k{depth}", f"_v{depth}"
            inner = self.expr(typing.get_args(tp)[1], v, depth + 1)
            return (
                f"({{({k} if type({k}) is str else str({k})): {inner} "
                f"for {k}, {v} in {var}.items()}} if type({var}) is dict else _slow())"
            )
        if tp is float:
            return f"({var} if type({var}) is float else _as_float({var}))"
        if tp in (int, str, bool):
            return f"({var} if type({var}) is {tp.__name__} else _slow())"
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return f"{self.name(_enum_reader(tp), 'enum')}({var})"
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            fast = self.name(_fast(tp), "dec")
            return f"({fast}({var}) if type({var}) is dict else _slow())"
        return f"({var} if isinstance({var}, {self.name(tp, 'type')}) else _slow())"


def _enum_reader(members: type[enum.Enum]) -> Callable[[object], enum.Enum]:
    def read(value: object) -> enum.Enum:
        try:
            return members(value)
        except ValueError:
            raise _Slow from None

    return read


def _fast(cls: type) -> Fast:
    """The fast decoder of ``cls``, written once and kept; raises ``_Slow``."""
    found = _FAST.get(cls)
    if found is not None:
        return found

    # A dataclass that refers to itself finds this while its own decoder is written.
    def pending(data: dict[str, Any]) -> object:
        return _FAST[cls](data)

    _FAST[cls] = pending
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    if any(not f.init or f.kw_only for f in fields):
        # Not worth writing for: a class the messages do not have.
        def generic(data: dict[str, Any]) -> object:
            try:
                return from_map(cls, data)
            except MessageError:
                raise _Slow from None

        _FAST[cls] = generic
        return generic
    w = _Writer()
    lines = ["def decode(d):", "    g = d.get"]
    args = []
    for i, f in enumerate(fields):
        var = f"v{i}"
        conv = w.expr(hints[f.name], var, 0)
        key = repr(f.name)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            lines.append(f"    {var} = d[{key}] if {key} in d else _slow()")
            lines.append(f"    {var} = {conv}")
        elif f.default is None:
            lines.append(f"    {var} = g({key})")
            lines.append(f"    if {var} is not None: {var} = {conv}")
        else:
            if f.default is not dataclasses.MISSING:
                absent = w.name(f.default, "default")
            else:
                absent = f"{w.name(f.default_factory, 'factory')}()"
            lines.append(f"    if {key} in d:")
            lines.append(f"        {var} = d[{key}]")
            lines.append(f"        {var} = {conv}")
            lines.append("    else:")
            lines.append(f"        {var} = {absent}")
        args.append(f"{f.name}={var}")
    if "__post_init__" in dir(cls) or hasattr(cls, "__slots__"):
        lines.append(f"    return {w.name(cls, 'cls')}({', '.join(args)})")
    else:
        # Made as ``__init__`` would make it, less a frozen class's one call per field
        # (half a card's decoding): its instance dict given whole, in the field order.
        items = ", ".join(f"{f.name!r}: v{i}" for i, f in enumerate(fields))
        lines.append(f"    o = _new({w.name(cls, 'cls')})")
        lines.append(f"    _set(o, '__dict__', {{{items}}})")
        lines.append("    return o")
    scope: dict[str, Any] = dict(w.names)
    exec("\n".join(lines), scope)  # noqa: S102 - source written above from type hints
    fast: Fast = scope["decode"]
    _FAST[cls] = fast
    return fast


def merged(record: _T, changes: dict[str, object]) -> _T:
    """``dataclasses.replace(record, **changes)`` for a frozen record of the wire (no
    ``__post_init__``, no slots): its instance dict copied and updated, without the
    class's one call per field in ``__init__`` (a card and its heartbeat, thousands a
    second). ``changes`` names fields only."""
    values = dict(vars(record))
    values.update(changes)
    made: _T = object.__new__(type(record))
    object.__setattr__(made, "__dict__", values)
    return made


def decoder(cls: type[_T]) -> Callable[[dict[str, Any]], _T]:
    """``from_map`` for ``cls``, written as one function (see the module's docstring):
    the same result, and the same error for a map it cannot take."""
    found = _DECODERS.get(cls)
    if found is not None:
        return cast("Callable[[dict[str, Any]], _T]", found)
    fast = _fast(cls)

    def decode(data: dict[str, Any]) -> _T:
        try:
            return cast("_T", fast(data))
        except (_Slow, KeyError, TypeError, AttributeError):
            return from_map(cls, data)

    _DECODERS[cls] = decode
    return decode
