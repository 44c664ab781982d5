"""The admin API's answers about MCP tool servers (``/api/v1/mcp/servers``, ``ctl mcp``):
each server as kept (its credentials named, never shown), and what a test found."""

from typing import Literal, TypedDict


class McpHeaderJson(TypedDict):
    """A header sent to a server: a sealed one's value is never shown (null)."""

    name: str
    sealed: bool
    value: str | None


class McpServerJson(TypedDict):
    """A tool server. ``builtin``: answered in the control plane's own process
    (``llmgw:admin``: no url, no headers). ``up``: false while it is off or its breaker
    has it out; ``out_until`` then says until when (epoch seconds), else null. ``rate``:
    each caller's calls a minute (null: no limit); ``timeout``: a whole call's seconds."""

    name: str
    url: str | None
    builtin: bool
    enabled: bool
    up: bool
    out_until: float | None
    headers: list[McpHeaderJson]
    timeout: float
    rate: int | None
    description: str
    tools: int | None
    updated_at: float | None
    updated_by: str | None


class McpServerRemovedJson(TypedDict):
    name: str
    removed: bool


class McpToolJson(TypedDict):
    """A tool a server lists, by its own name (without the server's)."""

    name: str
    description: str


McpFailure = Literal[
    "connect", "http_status", "not_mcp", "timeout", "too_large", "dropped", "error"
]


class McpTestJson(TypedDict):
    """What ``test`` found: ``ok`` and the tools listed, or what failed (``failure``, a
    kind, and ``message``, in words); ``ms``: how long it took."""

    name: str
    ok: bool
    ms: float
    tools: list[McpToolJson]
    failure: McpFailure | None
    message: str | None
