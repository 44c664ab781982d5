"""``/api/v1/mcp/servers``: the MCP tool servers the gateway's ``/mcp`` reaches (``llmgw
ctl mcp``): list, add, show, change, remove, test, turn off and on. Reading, testing
and turning off or on need an operator; adding, changing and removing (a server's
address and credentials) the cluster's admin."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.mcp.service import McpServerAdd, McpServerChange, McpService
from llmgw.wire.admin import McpServerJson, McpServerRemovedJson, McpTestJson

SERVER = {
    "type": "object",
    "required": ["name", "url", "builtin", "enabled", "up", "headers", "timeout", "rate"],
}
SERVERS = {"type": "array", "items": SERVER}
TEST = {"type": "object", "required": ["name", "ok", "ms", "tools", "failure", "message"]}
PATH = "/api/v1/mcp/servers/{name}"


def routes(mcp: McpService) -> Ops:
    async def listing(call: Call[None, None]) -> list[McpServerJson]:
        return mcp.servers(call.principal)

    async def add(call: Call[McpServerAdd, None]) -> McpServerJson:
        return await mcp.add(call.body, call.principal)

    async def show(call: Call[None, None]) -> McpServerJson:
        return mcp.show(call.params["name"], call.principal)

    async def change(call: Call[McpServerChange, None]) -> McpServerJson:
        return await mcp.update(call.params["name"], call.body, call.principal)

    async def remove(call: Call[None, None]) -> McpServerRemovedJson:
        return await mcp.remove(call.params["name"], call.principal)

    async def test(call: Call[None, None]) -> McpTestJson:
        return await mcp.test(call.params["name"], call.principal)

    async def off(call: Call[None, None]) -> McpServerJson:
        return await mcp.switch(call.params["name"], False, call.principal)

    async def on(call: Call[None, None]) -> McpServerJson:
        return await mcp.switch(call.params["name"], True, call.principal)

    return [
        Op(
            "GET",
            "/api/v1/mcp/servers",
            listing,
            "The MCP tool servers /mcp reaches (llmgw:admin always), credentials named only",
            access="operator",
            answer=SERVERS,
        ),
        Op(
            "POST",
            "/api/v1/mcp/servers",
            add,
            "Add an MCP tool server; its credential headers are kept sealed (audited)",
            body=McpServerAdd,
            status=201,
            answer=SERVER,
            access="admin",
            errors=(409,),
        ),
        Op("GET", PATH, show, "One MCP server", access="operator", answer=SERVER, errors=(404,)),
        Op(
            "PATCH",
            PATH,
            change,
            "Change an MCP server: address, headers, credential, timeout, rate (audited)",
            body=McpServerChange,
            answer=SERVER,
            access="admin",
            errors=(404, 409),
        ),
        Op(
            "DELETE",
            PATH,
            remove,
            "Remove an MCP server (not llmgw:admin; audited)",
            access="admin",
            errors=(404, 409),
        ),
        Op(
            "POST",
            PATH + "/test",
            test,
            "Connect to an MCP server with its credential and list its tools",
            access="operator",
            answer=TEST,
            errors=(404,),
        ),
        Op(
            "POST",
            PATH + "/off",
            off,
            "Turn an MCP server off: its tools leave /mcp (audited)",
            access="operator",
            answer=SERVER,
            errors=(404,),
        ),
        Op(
            "POST",
            PATH + "/on",
            on,
            "Turn an MCP server on again (audited)",
            access="operator",
            answer=SERVER,
            errors=(404,),
        ),
    ]
