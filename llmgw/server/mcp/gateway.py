"""``POST /mcp``: the gateway as one MCP server over every tool server a key is granted.

On the gateway's own listener (the port of ``/v1``), with the same keys: the gateway
authorises the ``Authorization: Bearer`` key and hands the request here. Stateless:
every POST stands alone (no ``Mcp-Session-Id``, no server-sent stream: GET and DELETE
are 405), so any control plane answers any request. The handshake era only:
``initialize`` answers the client's ``protocolVersion`` when we take it, else our
newest; ``server/discover`` (the modern era's probe) is -32601, on which the SDK's
client falls back to ``initialize``.

``tools/list``: exactly the tools the key is granted (``key.tools.allows("S.T")``) of
servers that are on and not out (their breaker). ``tools/call``, in this order: the
name checked, granted (an ungranted tool and an unknown one are told alike), the
server in, the key's rate to it, the guard on the arguments (only for a key with
policies), the call (in process for ``llmgw:admin``, else upstream), the guard on the
answer. Each call is counted and recorded (``calls.py``).

Errors are JSON-RPC errors naming what was wrong: -32700 not JSON, -32600 not one
request (a batch is refused whole, nothing of it sent), -32601 no such method, -32602
bad params (a bad or ungranted tool name), and ours: ``GUARD_REFUSED`` (a policy),
``RATE_LIMITED``, ``UNAVAILABLE`` (off or out), ``UPSTREAM`` (the server failed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence

from aiohttp import web

from llmgw import __version__
from llmgw.jsonvalue import JSON, JSONObject
from llmgw.server.gateway.limits import Key
from llmgw.server.gateway.toolgrants import ToolGrant, reaches
from llmgw.server.mcp.calls import McpCalls, Outcome
from llmgw.server.mcp.registry import McpRegistry, McpServer
from llmgw.server.mcp.tools import BuiltinServer, Tool, ToolGuard, ToolResult
from llmgw.server.mcp.upstream import UpstreamError, Upstreams

log = logging.getLogger("llmgw.mcp")

# The largest JSON-RPC body taken, and how long it may take to arrive.
MAX_BODY = 4 * 2**20
BODY_WAIT = 30.0
# The handshake-era revisions we answer, oldest to newest (mcp_types.version's).
VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
PARSE_ERROR, INVALID_REQUEST, NO_METHOD, INVALID_PARAMS = -32700, -32600, -32601, -32602
GUARD_REFUSED, RATE_LIMITED, UNAVAILABLE, UPSTREAM = -32001, -32002, -32003, -32004
# A tool's name as asked: SERVER.TOOL, no control characters.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_NAME = 200


class Failed(Exception):
    """A request answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str, outcome: Outcome | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.outcome = outcome


def grant_reaches(grant: ToolGrant, server: str) -> bool:
    """Whether any tool of ``server`` could be granted (else it is not even asked)."""
    return grant.any and all(
        any(reaches(p, server) for p in patterns) for _, patterns in grant.lists
    )


def checked_tool_name(name: JSON) -> tuple[str, str]:
    """``SERVER.TOOL`` as (server, tool), or -32602 saying what is wrong with it."""
    if not isinstance(name, str) or not name:
        raise Failed(INVALID_PARAMS, "params.name: give the tool's name, as SERVER.TOOL")
    if len(name) > MAX_NAME or CONTROL.search(name) or ".." in name or name.startswith("/"):
        raise Failed(
            INVALID_PARAMS,
            "params.name: not a tool name (no control characters, '..' or leading '/'; "
            f"at most {MAX_NAME} characters)",
        )
    server, dot, tool = name.partition(".")
    if not dot or not server or not tool:
        raise Failed(INVALID_PARAMS, f"params.name: {name!r} is not SERVER.TOOL")
    return server, tool


def _answer(body: JSONObject, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/json"
    )


def _error(ident: JSON, code: int, message: str, status: int = 200) -> web.Response:
    return _answer(
        {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}, status
    )


def result_json(result: ToolResult) -> JSONObject:
    out: JSONObject = {"content": list(result.content), "isError": result.is_error}
    if result.structured is not None:
        out["structuredContent"] = result.structured
    return out


class McpGateway:
    def __init__(
        self,
        registry: McpRegistry,
        upstreams: Upstreams,
        calls: McpCalls,
        builtins: Sequence[BuiltinServer] = (),
        guard: ToolGuard | None = None,
    ) -> None:
        self.registry = registry
        self.upstreams = upstreams
        self.calls = calls
        self.builtins = {b.name: b for b in builtins}
        self.guard = guard

    # ---------------------------------------------------------------- requests

    async def handle(self, request: web.BaseRequest, key: Key) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(
                status=405,
                text="/mcp takes POST (stateless: no event stream, no session to end)\n",
                headers={"Allow": "POST"},
            )
        raw = await self._body(request)
        if isinstance(raw, web.Response):
            return raw
        try:
            message = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return _error(None, PARSE_ERROR, "the body is not JSON", 400)
        if isinstance(message, list):
            return _error(None, INVALID_REQUEST, "batches are not taken: send one request", 400)
        if (
            not isinstance(message, dict)
            or message.get("jsonrpc") != "2.0"
            or not isinstance(message.get("method"), str)
        ):
            return _error(
                None,
                INVALID_REQUEST,
                "not a JSON-RPC 2.0 request: an object with jsonrpc '2.0' and a method",
                400,
            )
        if "id" not in message:
            return web.Response(status=202)  # a notification: nothing to answer
        ident = message["id"]
        if not isinstance(ident, str | int) or isinstance(ident, bool):
            return _error(None, INVALID_REQUEST, "id: a string or a number", 400)
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return _error(ident, INVALID_PARAMS, "params: an object")
        try:
            result = await self._dispatch(str(message["method"]), params, key)
        except Failed as exc:
            return _error(ident, exc.code, exc.message)
        return _answer({"jsonrpc": "2.0", "id": ident, "result": result})

    async def _body(self, request: web.BaseRequest) -> bytes | web.Response:
        length = request.content_length
        too_large = _error(
            None, INVALID_REQUEST, f"the body is over {MAX_BODY // 2**20} MiB; send less", 413
        )
        if length is not None and length > MAX_BODY:
            too_large.force_close()
            return too_large
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(BODY_WAIT):
                while chunk := await request.content.readany():
                    size += len(chunk)
                    if size > MAX_BODY:
                        too_large.force_close()
                        return too_large
                    chunks.append(chunk)
        except TimeoutError:
            late = _error(
                None, INVALID_REQUEST, f"the body did not arrive within {BODY_WAIT:g} s", 408
            )
            late.force_close()
            return late
        return b"".join(chunks)

    async def _dispatch(self, method: str, params: JSONObject, key: Key) -> JSONObject:
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {
                "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "llmgw", "version": __version__},
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": [self._listed(t) for t in await self.tools_of(key)]}
        if method == "tools/call":
            return await self.call(key, params.get("name"), params.get("arguments"))
        raise Failed(NO_METHOD, f"no method {method[:64]!r} here (tools/list, tools/call, ping)")

    @staticmethod
    def _listed(tool: Tool) -> JSONObject:
        return {
            "name": tool.name,
            "description": tool.description,
            "inputSchema": tool.input_schema,
        }

    # ------------------------------------------------------------------- tools

    def _in(self, key: Key) -> list[McpServer]:
        """The servers on, not out, of which the key could be granted a tool."""
        return [
            s
            for s in self.registry.servers.values()
            if s.enabled
            and grant_reaches(key.tools, s.name)
            and (s.builtin and s.name in self.builtins or not s.builtin)
            and self.calls.out_until(s.name) is None
        ]

    async def _server_tools(self, server: McpServer) -> list[Tool]:
        if server.builtin:
            return self.builtins[server.name].tools()
        return await self.upstreams.tools(server)

    async def tools_of(self, key: Key) -> list[Tool]:
        """The tools ``key`` is granted, named ``SERVER.TOOL``; a server that does not
        list its tools now is left out (and counted towards its breaker)."""
        servers = self._in(key)
        lists = await asyncio.gather(
            *(self._server_tools(s) for s in servers), return_exceptions=True
        )
        found: list[Tool] = []
        for server, listed in zip(servers, lists, strict=True):
            if isinstance(listed, UpstreamError):
                self.calls.failed(server.name)
                log.warning("%s", listed.message)
                continue
            if isinstance(listed, BaseException):
                raise listed
            for tool in listed:
                name = f"{server.name}.{tool.name}"
                if key.tools.allows(name):
                    found.append(Tool(name, tool.description, tool.input_schema))
        return found

    async def call(self, key: Key, name: JSON, arguments: JSON) -> JSONObject:
        server_name, tool = checked_tool_name(name)
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise Failed(INVALID_PARAMS, "params.arguments: an object")
        full = f"{server_name}.{tool}"
        server = self.registry.get(server_name)
        unknown = Failed(INVALID_PARAMS, f"no tool {full!r} granted to this key")
        if (
            not key.tools.allows(full)
            or server is None
            or not server.enabled
            or (server.builtin and server.name not in self.builtins)
        ):
            raise unknown
        start = time.perf_counter()
        outcome: Outcome = "error"
        try:
            result = await self._call(key, server, tool, full, arguments)
            outcome = "error" if result.is_error else "ok"
            return result_json(result)
        except Failed as exc:
            outcome = exc.outcome or "error"
            raise
        finally:
            seconds = time.perf_counter() - start
            self.calls.record(key.record.id, key.record.name, server.name, tool, seconds, outcome)

    async def _call(
        self, key: Key, server: McpServer, tool: str, full: str, arguments: Mapping[str, JSON]
    ) -> ToolResult:
        out = self.calls.out_until(server.name)
        if out is not None:
            until = time.strftime("%H:%M:%S UTC", time.gmtime(out))
            raise Failed(
                UNAVAILABLE,
                f"MCP server '{server.name}' is out until {until} after failing "
                "5 times in a row; try again then",
                "unavailable",
            )
        if not server.builtin:
            try:
                known = await self.upstreams.tools(server)
            except UpstreamError as exc:
                self.calls.failed(server.name)
                raise Failed(UPSTREAM, exc.message, _outcome(exc)) from None
            if not any(t.name == tool for t in known):
                raise Failed(INVALID_PARAMS, f"no tool {full!r} granted to this key", "refused")
        wait = self.calls.over_rate(key.record.id, server.name, server.rate)
        if wait is not None:
            raise Failed(
                RATE_LIMITED,
                f"this key's calls to MCP server '{server.name}' are at its rate of "
                f"{server.rate} a minute; try again in {wait} s",
                "rate_limited",
            )
        guard = self.guard if key.policies else None
        if guard is not None:
            reading, arguments = await guard.tool_arguments(key, full, arguments)
            if reading.refused:
                raise Failed(
                    GUARD_REFUSED,
                    f"the guard policy '{reading.policy}' refused this call's arguments"
                    + (f": {reading.reason}" if reading.reason else ""),
                    "refused",
                )
        result = await self._send(server, tool, arguments)
        if guard is not None:
            reading, result = await guard.tool_answer(key, full, result)
            if reading.refused:
                raise Failed(
                    GUARD_REFUSED,
                    f"the guard policy '{reading.policy}' refused this tool's answer"
                    + (f": {reading.reason}" if reading.reason else ""),
                    "refused",
                )
        return result

    async def _send(
        self, server: McpServer, tool: str, arguments: Mapping[str, JSON]
    ) -> ToolResult:
        if server.builtin:
            try:
                async with asyncio.timeout(server.timeout):
                    return await self.builtins[server.name].call(tool, arguments)
            except TimeoutError:
                raise Failed(
                    UPSTREAM, f"{server.name} did not answer within {server.timeout:g} s", "timeout"
                ) from None
        try:
            result = await self.upstreams.call(server, tool, arguments)
        except UpstreamError as exc:
            if exc.kind != "error":
                self.calls.failed(server.name)
            else:
                self.calls.succeeded(server.name)
            raise Failed(UPSTREAM, exc.message, _outcome(exc)) from None
        self.calls.succeeded(server.name)
        return result

    # ----------------------------------------------------------------- metrics

    def metric_lines(self) -> list[str]:
        return self.calls.metric_lines((s.name, s.enabled) for s in self.registry.servers.values())


def _outcome(exc: UpstreamError) -> Outcome:
    return "timeout" if exc.kind == "timeout" else "error"
