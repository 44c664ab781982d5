"""MCP tool servers as a service (``ctl mcp``, ``/api/v1/mcp/servers``): add, change,
remove, turn off and on, and test one, each change written to the store's ``"mcp"``
settings with its audit entry.

Who may: an operator reads the servers, tests one and turns one off or on; adding,
changing and removing one (its address and credentials, which reach whatever the
server guards) needs the cluster's admin. A credential is taken from a ``--secret-file``
(``Header-Name: value`` lines) or a ``--bearer-file`` (a token), sealed at once, and
never shown, logged or audited: an answer says ``{"name": H, "sealed": true}``, an audit
entry names the header only.

``llmgw:admin`` is always there: it can be turned off and on, its rate, timeout and
description changed, never removed or given an address.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from llmgw.server.mcp.calls import McpCalls
from llmgw.server.mcp.registry import (
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    Header,
    McpRegistry,
    McpServer,
    bad,
    bearer_header,
    checked_name,
    checked_url,
    merged,
    plain_header,
    secret_headers,
)
from llmgw.server.mcp.tools import ADMIN_SERVER, BuiltinServer
from llmgw.server.mcp.upstream import UpstreamError, Upstreams
from llmgw.server.principal import Principal, Role
from llmgw.server.refusal import Refusal, not_found
from llmgw.server.schema import Spec, spec
from llmgw.wire.admin import McpServerJson, McpServerRemovedJson, McpTestJson

# What ``clear`` may name: back to no rate, the default timeout, no description, no
# plain headers, no credential.
CLEARABLE = ("rate", "timeout", "description", "headers", "secret")


@dataclass(frozen=True)
class McpServerAdd:
    """A tool server for the gateway's /mcp."""

    name: str = spec(doc="its name, the SERVER of SERVER.TOOL", max_length=32)
    url: str = spec(doc="its streamable HTTP address (http or https)", max_length=2048)
    headers: tuple[str, ...] = spec(
        (),
        doc="plain headers sent with each request, NAME=VALUE",
        max_items=32,
        items=Spec(max_length=4200),
    )
    secret: str | None = spec(
        None, doc="'Header-Name: value' lines, each kept sealed", max_length=65536
    )
    bearer: str | None = spec(
        None, doc="a token sent as Authorization: Bearer, kept sealed", max_length=16384
    )
    timeout: float | None = spec(
        None, doc="a whole call's seconds (30 when not named)", minimum=0.1, maximum=MAX_TIMEOUT
    )
    rate: int | None = spec(None, doc="each caller's calls a minute", minimum=1, maximum=10**6)
    description: str | None = spec(None, doc="what it is for, in words", max_length=1024)


@dataclass(frozen=True)
class McpServerChange:
    """What to change of a server; what is not named stays."""

    url: str | None = spec(None, doc="its new address", max_length=2048)
    headers: tuple[str, ...] | None = spec(
        None, doc="plain headers to set, NAME=VALUE", max_items=32, items=Spec(max_length=4200)
    )
    secret: str | None = spec(None, doc="credential headers to set, sealed", max_length=65536)
    bearer: str | None = spec(None, doc="a new bearer token, sealed", max_length=16384)
    timeout: float | None = spec(
        None, doc="a whole call's seconds", minimum=0.1, maximum=MAX_TIMEOUT
    )
    rate: int | None = spec(None, doc="each caller's calls a minute", minimum=1, maximum=10**6)
    description: str | None = spec(None, doc="what it is for", max_length=1024)
    clear: tuple[str, ...] = spec(
        (),
        doc="rate, timeout, description, headers, secret: back to none",
        max_items=5,
        items=Spec(max_length=16),
    )


def _need(by: Principal, role: Role, what: str) -> None:
    if not by.may(role):
        raise Refusal(403, "forbidden", f"{what} needs the cluster's {role} role")


def _described(server: McpServer) -> str:
    """A change in words for the audit log: headers by name only."""
    parts = [] if server.builtin else [server.url]
    if server.headers:
        parts.append(
            "headers "
            + ", ".join(f"{h.name}{' (sealed)' if h.sealed else ''}" for h in server.headers)
        )
    parts.append(f"timeout {server.timeout:g} s")
    if server.rate is not None:
        parts.append(f"rate {server.rate}/min")
    return "; ".join(parts)


class McpService:
    def __init__(
        self,
        registry: McpRegistry,
        upstreams: Upstreams,
        calls: McpCalls,
        builtins: Mapping[str, BuiltinServer],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.store = registry.store
        self.secret = registry.secret
        self.upstreams = upstreams
        self.calls = calls
        self.builtins = builtins
        self.clock = clock

    # ------------------------------------------------------------------ reading

    def shown(self, server: McpServer) -> McpServerJson:
        out = self.calls.out_until(server.name)
        if server.builtin:
            builtin = self.builtins.get(server.name)
            tools: int | None = len(builtin.tools()) if builtin is not None else None
        else:
            kept = self.upstreams.kept.get(server.name)
            listed = kept.tools if kept is not None and kept.server is server else None
            tools = len(listed) if listed is not None else None
        return {
            "name": server.name,
            "url": None if server.builtin else server.url,
            "builtin": server.builtin,
            "enabled": server.enabled,
            "up": server.enabled and out is None,
            "out_until": out,
            "headers": [h.shown() for h in server.headers],
            "timeout": server.timeout,
            "rate": server.rate,
            "description": server.description
            or ("llmgw's own tools, answered by the control plane" if server.builtin else ""),
            "tools": tools,
            "updated_at": server.updated_at,
            "updated_by": server.updated_by,
        }

    def servers(self, by: Principal) -> list[McpServerJson]:
        _need(by, "operator", "reading MCP servers")
        return [self.shown(s) for _, s in sorted(self.registry.servers.items())]

    def _found(self, name: str) -> McpServer:
        server = self.registry.get(name)
        if server is None:
            raise not_found(f"no MCP server '{name}' (`llmgw ctl mcp list` lists them)")
        return server

    def show(self, name: str, by: Principal) -> McpServerJson:
        _need(by, "operator", "reading MCP servers")
        return self.shown(self._found(name))

    # ----------------------------------------------------------------- changing

    def _credentials(self, secret: str | None, bearer: str | None) -> list[Header]:
        found: list[Header] = []
        if secret is not None:
            found += secret_headers(secret, self.secret)
        if bearer is not None:
            found.append(bearer_header(bearer, self.secret))
        return found

    async def _write(self, server: McpServer, by: Principal, action: str, detail: str) -> None:
        await self.registry.write(self.registry.put(server))
        self.upstreams.forget(server.name)
        await self.store.audit(by.name, action, f"mcp:{server.name}", detail)

    async def add(self, ask: McpServerAdd, by: Principal) -> McpServerJson:
        _need(by, "admin", "adding an MCP server")
        name = checked_name(ask.name)
        if name == ADMIN_SERVER or name in self.registry.servers:
            raise Refusal(
                409,
                "conflict",
                f"an MCP server '{name}' is already there (`llmgw ctl mcp show {name}`)",
                "name",
            )
        plain = [plain_header(h) for h in ask.headers]
        server = McpServer(
            name=name,
            url=checked_url(ask.url),
            headers=merged(plain, self._credentials(ask.secret, ask.bearer)),
            timeout=ask.timeout if ask.timeout is not None else DEFAULT_TIMEOUT,
            rate=ask.rate,
            description=ask.description or "",
            updated_at=self.clock(),
            updated_by=by.name,
        )
        await self._write(server, by, "mcp.add", _described(server))
        return self.shown(server)

    async def update(self, name: str, ask: McpServerChange, by: Principal) -> McpServerJson:
        _need(by, "admin", "changing an MCP server")
        server = self._found(name)
        for what in ask.clear:
            if what not in CLEARABLE:
                raise bad("clear", f"{what!r}: name one of {', '.join(CLEARABLE)}")
        remote = (ask.url, ask.headers, ask.secret, ask.bearer)
        if server.builtin and any(v is not None for v in remote):
            raise Refusal(
                409,
                "conflict",
                f"{ADMIN_SERVER} is answered by the control plane itself: it has no address "
                "or headers to change (its rate, timeout and description can be)",
            )
        headers = server.headers
        if "headers" in ask.clear:
            headers = tuple(h for h in headers if h.sealed)
        if "secret" in ask.clear:
            headers = tuple(h for h in headers if not h.sealed)
        if ask.headers is not None:
            headers = merged(headers, [plain_header(h) for h in ask.headers])
        headers = merged(headers, self._credentials(ask.secret, ask.bearer))
        changed = replace(
            server,
            url=checked_url(ask.url) if ask.url is not None else server.url,
            headers=headers,
            timeout=DEFAULT_TIMEOUT
            if "timeout" in ask.clear
            else ask.timeout
            if ask.timeout is not None
            else server.timeout,
            rate=None if "rate" in ask.clear else ask.rate if ask.rate is not None else server.rate,
            description=""
            if "description" in ask.clear
            else ask.description
            if ask.description is not None
            else server.description,
            updated_at=self.clock(),
            updated_by=by.name,
        )
        await self._write(changed, by, "mcp.change", _described(changed))
        return self.shown(changed)

    async def remove(self, name: str, by: Principal) -> McpServerRemovedJson:
        _need(by, "admin", "removing an MCP server")
        server = self._found(name)
        if server.builtin:
            raise Refusal(
                409,
                "conflict",
                f"{ADMIN_SERVER} is built in and cannot be removed; "
                f"`llmgw ctl mcp off {ADMIN_SERVER}` turns it off",
            )
        servers = self.registry.without(name)
        await self.registry.write(servers)
        self.upstreams.forget(name)
        await self.store.audit(by.name, "mcp.remove", f"mcp:{name}", server.url)
        return {"name": name, "removed": True}

    async def switch(self, name: str, enabled: bool, by: Principal) -> McpServerJson:
        _need(by, "operator", "turning an MCP server off or on")
        server = self._found(name)
        changed = replace(server, enabled=enabled, updated_at=self.clock(), updated_by=by.name)
        if enabled:
            self.calls.succeeded(name)  # turned on again: its breaker starts closed
        word = "on" if enabled else "off"
        await self._write(changed, by, f"mcp.{word}", f"turned {word}")
        return self.shown(changed)

    async def test(self, name: str, by: Principal) -> McpTestJson:
        """Connect with the server's credential and list its tools, saying what failed."""
        _need(by, "operator", "testing an MCP server")
        server = self._found(name)
        start = time.perf_counter()
        builtin = self.builtins.get(name)
        if server.builtin:
            tools = builtin.tools() if builtin is not None else []
            ok = builtin is not None
            failure: UpstreamError | None = (
                None if ok else UpstreamError("error", f"{ADMIN_SERVER} is not served here")
            )
        else:
            try:
                tools = await self.upstreams.tools(server, fresh=True)
                ok, failure = True, None
            except UpstreamError as exc:
                tools, ok, failure = [], False, exc
        await self.store.audit(
            by.name, "mcp.test", f"mcp:{name}", "ok" if ok else (failure.kind if failure else "")
        )
        return {
            "name": name,
            "ok": ok,
            "ms": round((time.perf_counter() - start) * 1000, 1),
            "tools": [{"name": t.name, "description": t.description} for t in tools],
            "failure": failure.kind if failure else None,
            "message": failure.message if failure else None,
        }
