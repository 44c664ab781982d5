"""Who is granted which MCP tools, as an admin API route: every organisation, team,
project and key that names tools (``gateway/grants.py``), for the cluster's staff."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.gateway.grants import grant_rows
from llmgw.server.people.asks import SERVER_NAME
from llmgw.server.people.directory import Directory
from llmgw.server.schema import spec
from llmgw.server.store import ApiKeyRecord
from llmgw.wire.admin import McpGrantJson


@dataclass(frozen=True)
class GrantsQuery:
    server: str | None = spec(
        None,
        doc="only the patterns that reach this MCP server (and the closed levels)",
        pattern=SERVER_NAME,
        pattern_doc="an MCP server's name (lower-case letters, digits, '_' or '-'; llmgw:admin)",
    )


def routes(directory: Directory, keys: Callable[[], list[ApiKeyRecord]]) -> Ops:
    async def grants(call: Call[None, GrantsQuery]) -> list[McpGrantJson]:
        return grant_rows(directory.now, keys(), call.query.server)

    return [
        Op(
            "GET",
            "/api/v1/mcp/grants",
            grants,
            "Every level and key that names MCP tools, with its patterns (closed: none)",
            query=GrantsQuery,
            answer={"type": "array", "items": {"type": "object"}},
            access="viewer",
        ),
    ]
