"""SCIM's filters and PATCH paths (RFC 7644 3.4.2.2, 3.5.2), the part of them llmgw
takes: terms ``ATTR eq VALUE`` joined by ``and``, on an attribute or a sub-attribute
(``emails.value``, ``members[value eq "ID"]``); a PATCH path is an attribute, a
sub-attribute, or a multi-valued attribute with a filter of its values
(``members[value eq "ID"]``, ``emails[type eq "work"].value``).

Attribute names are case-insensitive (RFC 7643 2.1), so they are kept lower-cased. A
name qualified by the core schema's URN loses it; one of an extension keeps it and
matches nothing llmgw keeps. Anything else is a ``Refusal`` with SCIM's ``scimType``
as its code (``invalidFilter``, ``invalidPath``), saying what was wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from llmgw.server.refusal import Refusal

USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
# What a filter compares with: a JSON string, true, false or null.
Value = str | bool | None

_TERM = re.compile(
    r"""\s*(?P<attr>[A-Za-z0-9:._$-]+)
        \s+(?P<op>[A-Za-z]{2})
        \s+(?P<value>"(?:[^"\\]|\\.)*"|true|false|null)\s*""",
    re.IGNORECASE | re.VERBOSE,
)
_VALUES = re.compile(r"\s*(?P<attr>[A-Za-z0-9:._$-]+)\[(?P<where>[^\]]*)\]\s*")
_PATH = re.compile(
    r"""(?P<attr>[A-Za-z0-9:._$-]+?)
        (?:\[(?P<where>[^\]]*)\])?
        (?:\.(?P<sub>[A-Za-z0-9_$-]+))?""",
    re.VERBOSE,
)
_AND = re.compile(r"\s+and\s+", re.IGNORECASE)


@dataclass(frozen=True)
class Term:
    """``attr eq value``: ``attr`` lower-cased, dotted for a sub-attribute."""

    attr: str
    value: Value


@dataclass(frozen=True)
class Path:
    """A PATCH path: an attribute, its values that match ``where`` (all when empty), and
    a sub-attribute of them."""

    attr: str
    where: tuple[Term, ...] = ()
    sub: str | None = None


def bare(name: str) -> str:
    """An attribute's name lower-cased, without the core schemas' URN."""
    low = name.lower()
    for urn in (USER.lower(), GROUP.lower()):
        if low.startswith(urn + ":"):
            return low[len(urn) + 1 :]
    return low


def _value(raw: str, text: str) -> Value:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        found = None
    if not isinstance(found, str):
        raise invalid_filter(text, f"{raw} is not a JSON string")
    return found


def invalid_filter(text: str, why: str) -> Refusal:
    return Refusal(
        400,
        "invalidFilter",
        f"filter {text!r}: {why}; llmgw takes ATTR eq \"VALUE\" terms joined by 'and'",
    )


def parse_filter(text: str) -> tuple[Term, ...]:
    """A filter's terms (all must hold); a Refusal for what llmgw does not take."""
    terms: list[Term] = []
    for part in _AND.split(text.strip()):
        values = _VALUES.fullmatch(part)
        if values is not None:
            # members[value eq "ID"]: a member whose value is ID.
            attr = bare(values["attr"])
            terms += [Term(f"{attr}.{t.attr}", t.value) for t in parse_filter(values["where"])]
            continue
        found = _TERM.fullmatch(part)
        if found is None:
            raise invalid_filter(text, f"{part.strip()!r} is not ATTR eq VALUE")
        if found["op"].lower() != "eq":
            raise invalid_filter(text, f"the operator {found['op']!r} is not taken, only eq")
        terms.append(Term(bare(found["attr"]), _value(found["value"], text)))
    return tuple(terms)


def parse_path(text: str) -> Path:
    """A PATCH operation's path; a Refusal (``invalidPath``) for one llmgw cannot read."""
    found = _PATH.fullmatch(text.strip())
    if found is None or not found["attr"]:
        raise Refusal(400, "invalidPath", f"path {text!r} is not ATTR, ATTR.SUB or ATTR[FILTER]")
    where = parse_filter(found["where"]) if found["where"] is not None else ()
    attr = bare(found["attr"])
    sub = found["sub"].lower() if found["sub"] else None
    if sub is None and found["where"] is None and "." in attr and not attr.startswith("urn:"):
        attr, sub = attr.split(".", 1)
    return Path(attr, where, sub)
