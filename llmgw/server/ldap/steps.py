"""The steps of a sign-in against a directory, as plain data: which passed, who was
found, which failed and why; and the parts of a search that need no directory (a
filter's placeholders escaped, nested groups walked).

Apart from ``session.py`` so that a control plane without LDAP set up never loads
ldap3 (``docs/performance.md``, the gateway's memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from llmgw.server.ldap.settings import DN, LOGIN
from llmgw.wire.admin.ldap import LdapStep

# Nested groups are walked this many levels up at most.
DEPTH = 8
# And no more groups than this are read for one person.
MOST_GROUPS = 1000

# RFC 4515's escapes of a value in a filter; the backslash first.
_ESCAPES = (("\\", "\\5c"), ("*", "\\2a"), ("(", "\\28"), (")", "\\29"), ("\x00", "\\00"))


def escape_filter_value(text: str) -> str:
    """``text`` as a filter may hold it (RFC 4515): ``\\ * ( )`` and NUL escaped."""
    for char, escaped in _ESCAPES:
        text = text.replace(char, escaped)
    return text


class StepFailed(Exception):
    """A step of the sign-in failed: ``step`` is which, ``message`` what was found.
    ``refused``: the person's own doing (not in the directory, or not once; a password
    the directory refused), not a directory that cannot be asked or is set up wrong."""

    def __init__(self, step: LdapStep, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.step = step
        self.message = message
        self.refused = refused


@dataclass(frozen=True)
class Passed:
    step: LdapStep
    detail: str


@dataclass(frozen=True)
class Found:
    """The person the directory knows, and the DNs of every group they are in."""

    dn: str
    name: str
    email: str
    groups: tuple[str, ...] = field(default=())


def fill(template: str, login: str = "", dn: str = "") -> str:
    """A filter with its placeholders replaced by escaped values."""
    return template.replace(LOGIN, escape_filter_value(login)).replace(DN, escape_filter_value(dn))


def walk_groups(
    direct: Iterable[str],
    holders: Callable[[list[str]], list[str]],
    depth: int = DEPTH,
    most: int = MOST_GROUPS,
) -> list[str]:
    """Every group reached from ``direct`` up the groups that hold them: ``holders(dns)``
    answers the groups holding any of ``dns``. Each group once, in the order reached."""
    seen: dict[str, str] = {}  # by the DN folded: each group once

    def new(dns: Iterable[str]) -> list[str]:
        fresh: list[str] = []
        for dn in dns:
            if dn.casefold() not in seen and len(seen) < most:
                seen[dn.casefold()] = dn
                fresh.append(dn)
        return fresh

    level = new(direct)
    for _ in range(depth):
        if not level or len(seen) >= most:
            break
        level = new(holders(level))
    return list(seen.values())[:most]
