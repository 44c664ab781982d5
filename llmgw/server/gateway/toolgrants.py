"""Which MCP tools a gateway key may see and call, from what it and its levels grant.

A tool is named ``SERVER.TOOL`` (``jira.create_issue``, ``llmgw:admin.list_nodes``);
a grant is a list of patterns matched against that name (``jira.*``, ``search.web``,
shell-style: ``*`` and ``?``). The key and each level it is under (project, team,
organisation: ``levels.py``) may name a list or say nothing (None). A tool is granted
when at least one of them names a list and every list named matches it: a level grants
only within what the levels above it grant, and an empty list closes a level (and every
key beneath it) to every tool until it is opened again. Nothing named anywhere: no
tools at all.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

# A pattern's server part and tool part, as ``SERVER.TOOL`` (the first dot splits):
# letters, digits and ``_ - : *  ?`` for the server, and ``.`` and ``/`` in the tool
# too. No control characters, spaces or ``..``.
PATTERN = re.compile(r"^[A-Za-z0-9_:*?-]{1,64}\.[A-Za-z0-9_.:/*?-]{1,128}$")


def bad_pattern(pattern: str) -> str | None:
    """Why ``pattern`` is not a tool pattern, in words, or None when it is one."""
    if not PATTERN.match(pattern) or ".." in pattern:
        return (
            f"{pattern!r} is not a tool pattern: SERVER.TOOL, such as 'jira.*' or "
            "'search.web' (letters, digits, '_-:*?', and '.' or '/' in the tool's part)"
        )
    return None


def server_of(pattern: str) -> str:
    """The server part of a pattern (before its first dot)."""
    return pattern.split(".", 1)[0]


def reaches(pattern: str, server: str) -> bool:
    """Whether ``pattern`` can match a tool of ``server`` (what revoking it removes)."""
    return fnmatch.fnmatchcase(server, server_of(pattern))


@dataclass
class ToolGrant:
    """The lists that bear on one key, narrowest first: (who named it, its patterns)."""

    lists: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # What ``allows`` said of each name asked (the tools known: bounded).
    seen: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, named: Sequence[tuple[str, tuple[str, ...] | None]]) -> ToolGrant:
        return cls(tuple((label, tools) for label, tools in named if tools is not None))

    def allows(self, name: str) -> bool:
        allowed = self.seen.get(name)
        if allowed is None:
            lists = self.lists
            allowed = self.seen[name] = bool(lists) and all(
                any(fnmatch.fnmatchcase(name, p) for p in patterns) for _, patterns in lists
            )
        return allowed

    @property
    def closed(self) -> str | None:
        """Who closed the key to every tool (a level whose list is empty), or None."""
        return next((label for label, patterns in self.lists if not patterns), None)

    @property
    def any(self) -> bool:
        """Whether anything names tools for this key (else it has none)."""
        return bool(self.lists)
