"""The gateway's client of MCP tool servers: streamable HTTP, the handshake era.

Our own, over the gateway's aiohttp session (the ``mcp`` SDK is for tests only). Per
server: ``initialize`` at ``PROTOCOL`` and ``notifications/initialized`` once, the
``Mcp-Session-Id`` it gave kept and sent with each request, and a new ``initialize``
when the server answers 404 to it (it forgot the session: restarted, or expired it).
A server may answer a request as ``application/json`` or as ``text/event-stream``;
events are read until the response of our id (its notifications and requests to us are
skipped).

Everything is bounded: the whole call within the server's ``timeout``, an answer within
``MAX_RESULT`` bytes. What goes wrong is an ``UpstreamError`` of one kind (``connect``,
``http_status``, ``not_mcp``, ``timeout``, ``too_large``, ``dropped``, ``error``: a
JSON-RPC error the server answered) whose message names the server; it never holds a
header's value.

A server's tools are cached for ``TOOLS_FOR`` seconds (and read afresh on ``test``).
What is kept of a server (session, tools) is for the ``McpServer`` it was made with: a
change of the server (its address, its headers) starts over.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from llmgw import __version__
from llmgw.jsonvalue import JSON, JSONObject
from llmgw.server.mcp.registry import McpServer
from llmgw.server.mcp.tools import Tool, ToolResult, object_schema
from llmgw.wire.admin import McpFailure

# The newest handshake-era revision (mcp_types.version.LATEST_HANDSHAKE_VERSION): what
# we offer a tool server in ``initialize``.
PROTOCOL = "2025-11-25"
# The largest answer taken from a tool server, in bytes.
MAX_RESULT = 8 * 2**20
# How long a server's tools list is used before it is read again.
TOOLS_FOR = 30.0
# At most this many pages of a server's tools list.
MAX_PAGES = 20
ACCEPT = "application/json, text/event-stream"


class UpstreamError(Exception):
    """A tool server call that failed: ``kind`` says how, the message (naming the server)
    says it in words; ``code``: the server's JSON-RPC error code where it answered one."""

    def __init__(self, kind: McpFailure, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.code = code


@dataclass
class Kept:
    """What is kept of one server: its session, and its tools when they were read."""

    server: McpServer
    session_id: str | None = None
    version: str | None = None
    initialized: bool = False
    tools: list[Tool] | None = None
    tools_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Upstreams:
    def __init__(
        self,
        session: Callable[[], aiohttp.ClientSession],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``session``: the gateway's (made when first asked)."""
        self.session = session
        self.clock = clock
        self.kept: dict[str, Kept] = {}
        self.ids = itertools.count(1)

    def _kept(self, server: McpServer) -> Kept:
        kept = self.kept.get(server.name)
        if kept is None or kept.server is not server:
            kept = self.kept[server.name] = Kept(server)
        return kept

    def forget(self, name: str) -> None:
        self.kept.pop(name, None)

    # ---------------------------------------------------------------- the calls

    async def tools(self, server: McpServer, fresh: bool = False) -> list[Tool]:
        """The server's tools, by their own names (cached ``TOOLS_FOR`` seconds)."""
        kept = self._kept(server)
        if not fresh and kept.tools is not None and self.clock() - kept.tools_at < TOOLS_FOR:
            return kept.tools
        found: list[Tool] = []
        cursor: str | None = None
        async with self._within(server):
            for _ in range(MAX_PAGES):
                params: JSONObject = {} if cursor is None else {"cursor": cursor}
                result = await self._request(kept, "tools/list", params)
                listed = result.get("tools")
                if not isinstance(listed, list):
                    raise self._not_mcp(server, "its tools/list answer has no tools")
                found += [t for t in (_tool(entry) for entry in listed) if t is not None]
                nxt = result.get("nextCursor")
                if not isinstance(nxt, str) or not nxt:
                    break
                cursor = nxt
        kept.tools, kept.tools_at = found, self.clock()
        return found

    async def call(self, server: McpServer, tool: str, arguments: Mapping[str, JSON]) -> ToolResult:
        kept = self._kept(server)
        async with self._within(server):
            result = await self._request(
                kept, "tools/call", {"name": tool, "arguments": dict(arguments)}
            )
        content = result.get("content")
        if not isinstance(content, list):
            raise self._not_mcp(server, "its tools/call answer has no content")
        structured = result.get("structuredContent")
        return ToolResult(
            [c for c in content if isinstance(c, dict)],
            result.get("isError") is True,
            structured if isinstance(structured, dict) else None,
        )

    def _within(self, server: McpServer) -> _Within:
        return _Within(server)

    # ------------------------------------------------------------- the protocol

    async def _request(self, kept: Kept, method: str, params: JSONObject) -> JSONObject:
        """One request of an initialized session; initialized again (once) when the
        server has forgotten ours."""
        await self._initialize(kept)
        sent = kept.session_id
        status, result = await self._post(kept, method, params)
        if status == 404 and sent is not None:
            async with kept.lock:
                if kept.session_id == sent:
                    kept.initialized, kept.session_id = False, None
            await self._initialize(kept)
            status, result = await self._post(kept, method, params)
        if result is None:
            raise self._status(kept.server, status)
        return result

    async def _initialize(self, kept: Kept) -> None:
        async with kept.lock:
            if kept.initialized:
                return
            kept.session_id = kept.version = None
            params: JSONObject = {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "llmgw", "version": __version__},
            }
            status, result = await self._post(kept, "initialize", params)
            if result is None:
                raise self._status(kept.server, status)
            version = result.get("protocolVersion")
            if not isinstance(version, str):
                raise self._not_mcp(kept.server, "its initialize answer has no protocolVersion")
            kept.version = version
            status, _ = await self._post(kept, "notifications/initialized", None)
            if status >= 400:
                raise self._status(kept.server, status)
            kept.initialized = True

    async def _post(
        self, kept: Kept, method: str, params: JSONObject | None
    ) -> tuple[int, JSONObject | None]:
        """POST one message: (the HTTP status, the result of a request; None for a
        notification or an HTTP error)."""
        server = kept.server
        headers = {
            **server.sent_headers(),
            "Content-Type": "application/json",
            "Accept": ACCEPT,
        }
        if kept.session_id is not None:
            headers["Mcp-Session-Id"] = kept.session_id
        if kept.version is not None:
            headers["MCP-Protocol-Version"] = kept.version
        message: JSONObject = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        ident: int | None = None
        if not method.startswith("notifications/"):
            ident = next(self.ids)
            message["id"] = ident
        body = json.dumps(message).encode()
        # aiohttp warns of raw bytes past 1 MiB (sent in one write); a file it streams.
        data: bytes | io.BytesIO = body if len(body) < 2**20 else io.BytesIO(body)
        try:
            # A redirect is not followed: the server's credential headers would go with
            # the request to wherever it points.
            post = self.session().post(
                server.url, data=data, headers=headers, allow_redirects=False
            )
            async with post as answer:
                if 300 <= answer.status < 400:
                    raise _redirected(server, answer.status, answer.headers.get("Location"))
                session_id = answer.headers.get("Mcp-Session-Id")
                if method == "initialize" and session_id:
                    kept.session_id = session_id
                if ident is None or answer.status >= 400:
                    return answer.status, None
                kind = answer.headers.get("Content-Type", "").split(";")[0].strip().lower()
                if kind == "text/event-stream":
                    reply = await self._from_events(server, answer, ident)
                elif kind == "application/json":
                    reply = _json(server, await _read(server, answer))
                else:
                    raise self._not_mcp(server, f"it answered {kind or 'no content type'}")
        except aiohttp.ClientPayloadError:
            raise UpstreamError(
                "dropped", f"the connection to MCP server '{server.name}' dropped mid-answer"
            ) from None
        except aiohttp.ServerDisconnectedError:
            raise UpstreamError(
                "dropped", f"MCP server '{server.name}' closed the connection mid-call"
            ) from None
        except aiohttp.ClientConnectionError as exc:
            raise UpstreamError(
                "connect",
                f"could not reach MCP server '{server.name}' at {server.url}: {type(exc).__name__}",
            ) from None
        return 200, _result(server, reply, ident)

    async def _from_events(
        self, server: McpServer, answer: aiohttp.ClientResponse, ident: int
    ) -> JSONObject:
        """Events until the one answering ``ident``, within ``MAX_RESULT`` bytes (split
        into lines here: aiohttp's own line reader refuses a line past 128 KiB, and one
        event of a large answer is one line)."""
        size = 0
        pending = b""
        data: list[bytes] = []
        async for chunk in answer.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > MAX_RESULT:
                raise _too_large(server)
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                message = self._event_line(server, raw.rstrip(b"\r"), data)
                if message is not None and message.get("id") == ident:
                    if "result" in message or "error" in message:
                        return message
        for raw in (pending, b""):
            message = self._event_line(server, raw.rstrip(b"\r"), data)
            if message is not None and message.get("id") == ident:
                return message
        raise UpstreamError(
            "dropped", f"MCP server '{server.name}' ended its event stream without an answer"
        )

    @staticmethod
    def _event_line(server: McpServer, line: bytes, data: list[bytes]) -> JSONObject | None:
        """One line of an event stream: a ``data:`` line kept, an empty line ending the
        event (its message), anything else (``event:``, ``id:``, comments) skipped."""
        if line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
        elif not line and data:
            message = _json(server, b"\n".join(data))
            data.clear()
            return message
        return None

    def _status(self, server: McpServer, status: int) -> UpstreamError:
        why = {401: " (is its credential right?)", 403: " (is its credential right?)"}
        return UpstreamError(
            "http_status",
            f"MCP server '{server.name}' answered HTTP {status}{why.get(status, '')}",
        )

    def _not_mcp(self, server: McpServer, why: str) -> UpstreamError:
        return UpstreamError("not_mcp", f"MCP server '{server.name}' does not speak MCP: {why}")


def _redirected(server: McpServer, status: int, where: str | None) -> UpstreamError:
    return UpstreamError(
        "http_status",
        f"MCP server '{server.name}' answered HTTP {status}, a redirect to {where or 'nowhere'}: "
        "not followed, since its credential would go along; give it its final address "
        f"(`llmgw ctl mcp set {server.name} --url URL`)",
    )


class _Within:
    """The server's timeout over a whole call, as an ``UpstreamError``."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.timeout = asyncio.timeout(server.timeout)

    async def __aenter__(self) -> None:
        await self.timeout.__aenter__()

    async def __aexit__(self, kind: object, exc: object, tb: object) -> None:
        try:
            await self.timeout.__aexit__(kind, exc, tb)  # type: ignore[arg-type]
        except TimeoutError:
            raise UpstreamError(
                "timeout",
                f"MCP server '{self.server.name}' did not answer within "
                f"{self.server.timeout:g} s (its --timeout)",
            ) from None


async def _read(server: McpServer, answer: aiohttp.ClientResponse) -> bytes:
    if answer.content_length is not None and answer.content_length > MAX_RESULT:
        raise _too_large(server)
    chunks: list[bytes] = []
    size = 0
    async for chunk in answer.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > MAX_RESULT:
            raise _too_large(server)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(server: McpServer) -> UpstreamError:
    return UpstreamError(
        "too_large",
        f"MCP server '{server.name}' answered more than {MAX_RESULT // 2**20} MiB "
        "(the gateway's MAX_RESULT); its answer was refused",
    )


def _json(server: McpServer, raw: bytes) -> JSONObject:
    try:
        message = json.loads(raw)
    except ValueError:
        message = None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise UpstreamError(
            "not_mcp", f"MCP server '{server.name}' answered something that is not JSON-RPC"
        )
    return message


def _result(server: McpServer, reply: JSONObject, ident: int) -> JSONObject:
    error = reply.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        text = str(error.get("message") or "")[:500]
        raise UpstreamError(
            "error",
            f"MCP server '{server.name}' answered an error: {text}",
            code if isinstance(code, int) else None,
        )
    result = reply.get("result")
    if reply.get("id") != ident or not isinstance(result, dict):
        raise UpstreamError(
            "not_mcp", f"MCP server '{server.name}' answered something that is not JSON-RPC"
        )
    return result


def _tool(entry: JSON) -> Tool | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    description = entry.get("description")
    schema = entry.get("inputSchema")
    return Tool(
        str(entry["name"]),
        description if isinstance(description, str) else "",
        schema if isinstance(schema, dict) else object_schema(),
    )
