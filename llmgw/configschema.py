"""Settings maps checked against the configuration's dataclasses: the strict builder.

An unknown key or a value of the wrong kind is refused, naming the file, the key and
what is allowed, and every problem of one map is named at once, so a typo never silently
falls back to a default and a user fixes them all in one go. ``llmgw.config`` holds the
dataclasses and their checks (a field's ``check`` in its metadata, run on its value).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

_T = TypeVar("_T")

# A settings document as YAML or JSON gives it (a file, a layer of ``ctl config``):
# nothing in it is trusted until ``build`` has checked it against the dataclass.
Settings = Mapping[str, object]


class ConfigError(ValueError):
    """A configuration file or value that cannot be used, with what to do about it."""


def _describe(tp: object) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        (inner,) = typing.get_args(tp)
        return f"a list of {_describe(inner)}"
    if origin is dict:
        key, value = typing.get_args(tp)
        return f"a map of {_describe(key)} to {_describe(value)}"
    args = typing.get_args(tp)
    if args and type(None) in args:
        return " or ".join(_describe(a) for a in args if a is not type(None)) + " (or null)"
    if dataclasses.is_dataclass(tp):
        return "a map"
    names: dict[object, str] = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
    }
    return names.get(tp, str(tp))


class _Problems:
    """Every problem found in one file, so a user fixes them all in one go."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, text: str) -> None:
        self.found.append(text)

    def raise_if_any(self, where: str) -> None:
        if len(self.found) == 1:
            raise ConfigError(self.found[0])
        if self.found:
            lines = "\n".join(f"  - {p}" for p in self.found)
            raise ConfigError(f"{where}: {len(self.found)} problems:\n{lines}")


class _Bad(Exception):
    """A value that cannot be used; the problem is already noted."""


def _convert(value: object, tp: object, where: str, problems: _Problems) -> object:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if args and type(None) in args:
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, where, problems)

    def bad() -> _Bad:
        problems.add(f"{where}: expected {_describe(tp)}, got {value!r}")
        return _Bad()

    if origin is dict:
        if not isinstance(value, dict):
            raise bad()
        out: dict[object, object] = {}
        for k, v in value.items():
            try:
                out[_convert(k, args[0], f"{where} key", problems)] = _convert(
                    v, args[1], f"{where}.{k}", problems
                )
            except _Bad:
                pass
        return out
    if origin is list:
        if not isinstance(value, list):
            raise bad()
        items: list[object] = []
        for i, v in enumerate(value):
            try:
                items.append(_convert(v, args[0], f"{where}[{i}]", problems))
            except _Bad:
                pass
        return items
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise bad()
        return _build(tp, value, where, problems)
    if tp is Any:
        return value  # checked by the field's own check
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad()
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if value != value or value in (float("inf"), float("-inf")):
                raise bad()
            return float(value)
        raise bad()
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad()
    raise bad()


def _build(cls: type[_T], data: Settings, where: str, problems: _Problems) -> _T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, object] = {}
    for key, value in data.items():
        f = fields.get(str(key))
        if f is None:
            allowed = ", ".join(sorted(fields))
            problems.add(f"{where}: unknown key {key!r} (allowed: {allowed})")
            continue
        name = f"{where}.{key}" if where.endswith(".yaml") is False else f"{where}: {key}"
        try:
            converted = _convert(value, hints[f.name], name, problems)
        except _Bad:
            continue
        check = f.metadata.get("check")
        if check is not None and converted is not None:
            problem = check(converted)
            if problem:
                problems.add(f"{name}: {problem} (got {value!r})")
                continue
        kwargs[f.name] = converted
    return cls(**kwargs)


def build(cls: type[_T], data: Settings, where: str) -> _T:
    """Make ``cls`` from a map, refusing unknown keys and values of the wrong kind: every
    problem in the map is named in one ConfigError, not only the first."""
    problems = _Problems()
    built = _build(cls, data, where, problems)
    problems.raise_if_any(where)
    return built


def load(cls: type[_T], path: Path) -> _T:
    """Read a YAML file into ``cls``; a missing file is an error the caller decides on."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a map of settings at the top level")
    return build(cls, data, str(path))
