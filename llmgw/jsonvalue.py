"""JSON as ``json.loads`` gives it: the type of a value whose shape is not ours to know.

Where a document's shape is ours (a settings file, a message, an engine's answer we
rely on), a TypedDict or a dataclass says it. ``JSON`` is for the rest: what another
program printed (``nft -j``), a document we pass along unread. A reader narrows it
with ``isinstance`` before it uses a part, and so says what it expects to find.
"""

from __future__ import annotations

from typing import TypeAlias

JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"
JSONObject: TypeAlias = "dict[str, JSON]"


def as_object(value: JSON) -> JSONObject:
    """``value`` as a JSON object; TypeError (as indexing it would raise) when it is not."""
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def as_list(value: JSON) -> list[JSON]:
    """``value`` as a JSON array; TypeError when it is not."""
    if not isinstance(value, list):
        raise TypeError(f"expected a JSON array, got {type(value).__name__}")
    return value


def as_str(value: JSON) -> str:
    """``value`` as a JSON string; TypeError when it is not."""
    if not isinstance(value, str):
        raise TypeError(f"expected a JSON string, got {type(value).__name__}")
    return value


def as_int(value: JSON) -> int:
    """``int(value)`` for a number, numeric text or a bool, as a reader of JSON would
    take it; TypeError, as ``int()`` raises, for null, an array or an object."""
    if value is None or isinstance(value, list | dict):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return int(value)
