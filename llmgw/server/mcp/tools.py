"""What the MCP gateway, its built-in server and the guard share: a tool as a client
sees it, a tool call's result, and what a guard said of a call's arguments or answer.

Plain data and two protocols, no IO, so the gateway (``gateway.py``), ``llmgw:admin``
(``admintools.py``) and the guard (``server/guard/``) meet here without importing one
another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from llmgw.jsonvalue import JSON
from llmgw.server.gateway.limits import Key

# The one server every control plane answers itself.
ADMIN_SERVER = "llmgw:admin"


def object_schema() -> JSON:
    """The input schema of a tool that takes no arguments."""
    return {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    """A tool as listed to a client: ``name`` is ``SERVER.TOOL`` where the gateway lists
    it, the bare tool name where a server lists its own."""

    name: str
    description: str = ""
    input_schema: JSON = field(default_factory=lambda: object_schema())


@dataclass(frozen=True)
class ToolResult:
    """An MCP ``CallToolResult``: its content blocks as JSON (``{"type": "text",
    "text": ...}``, images, resources), whether the tool said it failed, and its
    structured content when it gave one."""

    content: list[JSON]
    is_error: bool = False
    structured: JSON | None = None


class BuiltinServer(Protocol):
    """A tool server answered in the control plane's own process (``llmgw:admin``)."""

    @property
    def name(self) -> str: ...

    def tools(self) -> list[Tool]:
        """Its tools, named without the server's prefix."""
        ...

    async def call(self, tool: str, arguments: Mapping[str, JSON]) -> ToolResult: ...


# What a guard made of what it read: let through, let through and flagged, redacted,
# refused, withheld (a tool's answer kept from the prompt it would become), or refused
# or flagged because the judge did not answer within the policy's wait.
Verdict = Literal["pass", "flag", "redact", "block", "withhold", "timeout"]


@dataclass(frozen=True)
class Reading:
    """A guard's verdict on one text: the strongest of the key's policies'."""

    verdict: Verdict
    # The text to use in its place (redacted, or the withheld notice); None: as it was.
    text: str | None = None
    # The policy that decided; None when no policy applies.
    policy: str | None = None
    # Why, for the caller and the audit log: never the matched data itself.
    reason: str = ""
    # Refused because the judge did not answer within the policy's wait (``fail:
    # closed``), not for what the text holds: the caller may try again.
    late: bool = False

    @property
    def refused(self) -> bool:
        """Whether nothing may pass: blocked, or timed out under ``fail: closed``."""
        return self.verdict == "block"


PASS = Reading("pass")


class ToolGuard(Protocol):
    """The guard as the MCP gateway asks it, on every call of a key with policies."""

    async def tool_arguments(
        self, key: Key, tool: str, arguments: Mapping[str, JSON]
    ) -> tuple[Reading, Mapping[str, JSON]]:
        """A call's arguments before they leave: the reading, and the arguments to send
        (redacted where the reading says so)."""
        ...

    async def tool_answer(
        self, key: Key, tool: str, result: ToolResult
    ) -> tuple[Reading, ToolResult]:
        """A tool's answer before it is returned (and becomes part of a prompt): the
        reading, and the result to return (withheld or redacted where it says so)."""
        ...
