"""The MCP gateway's parts, each handed what it uses: the servers kept in the store, the
client of tool servers, the calls' rates, breakers and record, ``/mcp`` and the service
the admin API calls."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from llmgw.server.audittrail import AuditTrail
from llmgw.server.mcp.calls import McpCalls
from llmgw.server.mcp.gateway import McpGateway
from llmgw.server.mcp.registry import McpRegistry
from llmgw.server.mcp.service import McpService
from llmgw.server.mcp.tools import BuiltinServer, ToolGuard
from llmgw.server.mcp.upstream import Upstreams
from llmgw.server.store import Store


@dataclass(frozen=True)
class McpParts:
    registry: McpRegistry
    calls: McpCalls
    gateway: McpGateway
    service: McpService


def mcp_parts(
    store: Store,
    trail: AuditTrail,
    cluster_secret: bytes,
    session: Callable[[], aiohttp.ClientSession],
    builtins: Sequence[BuiltinServer] = (),
    guard: ToolGuard | None = None,
) -> McpParts:
    """``trail``: where each call's audit entry goes; ``session``: the gateway's (read
    when first used); ``builtins``: the servers answered in process (``llmgw:admin``);
    ``guard``: what reads a key's calls."""
    registry = McpRegistry(store, cluster_secret)
    upstreams = Upstreams(session)
    calls = McpCalls(trail)
    gateway = McpGateway(registry, upstreams, calls, builtins, guard)
    service = McpService(registry, upstreams, calls, {b.name: b for b in builtins})
    return McpParts(registry, calls, gateway, service)
