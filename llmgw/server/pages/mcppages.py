"""The MCP page (``/admin/mcp``), for administrators only, since a server's credential
reaches whatever it guards: each tool server the gateway's ``/mcp`` reaches with its
state (on, off, or out while its breaker has it out), address, the headers it is sent
by name with the sealed ones marked (never a value), rate, timeout and tools, and who
is granted its tools (``GET /api/v1/mcp/grants``); forms to add one (a bearer token or
``Header: value`` lines, kept sealed), test it (its tools listed), turn it off and on,
and remove it; and how a person points an agent at ``/mcp`` with a key of their own.

It reads and changes through ``McpService`` (``server/mcp/service.py``), as
``/api/v1/mcp/servers`` and ``ctl mcp`` do, with the signed-in caller as the
``Principal``: a refusal is the service's, shown with nothing changed. The credential
fields are named ``bearer`` and ``secret``, as the API's body names them, so nothing
that logs a form's fields by name would keep them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, TypedDict

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from llmgw.server import schema
from llmgw.server.mcp.service import McpServerAdd
from llmgw.server.pages.frame import Frame, Page, PageCall, PageHandler, form_body, site_origin
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.wire.admin import (
    McpGrantJson,
    McpServerJson,
    McpServerRemovedJson,
    McpTestJson,
)

State = Literal["on", "off", "out"]


class McpDesk(Protocol):
    """What the page asks of the MCP service (``server/mcp/service.py``)."""

    def servers(self, by: Principal) -> list[McpServerJson]: ...

    async def add(self, ask: McpServerAdd, by: Principal) -> McpServerJson: ...

    async def remove(self, name: str, by: Principal) -> McpServerRemovedJson: ...

    async def switch(self, name: str, enabled: bool, by: Principal) -> McpServerJson: ...

    async def test(self, name: str, by: Principal) -> McpTestJson: ...


# Who is granted a server's tools (``gateway/grants.py``'s ``grant_rows``): the levels
# and keys with a pattern reaching it, and the closed ones.
Grants = Callable[[str], list[McpGrantJson]]


class ShownServer(TypedDict):
    server: McpServerJson
    state: State
    granted: list[McpGrantJson]
    closed: list[McpGrantJson]


def state_of(server: McpServerJson) -> State:
    if not server["enabled"]:
        return "off"
    return "on" if server["up"] else "out"


def shown_servers(servers: list[McpServerJson], grants: Grants) -> list[ShownServer]:
    rows: list[ShownServer] = []
    for s in servers:
        found = grants(s["name"])
        rows.append(
            {
                "server": s,
                "state": state_of(s),
                "granted": [g for g in found if not g["closed"]],
                "closed": [g for g in found if g["closed"]],
            }
        )
    return rows


def added(form: dict[str, str]) -> McpServerAdd:
    """The add form as the service's request: a bearer token or ``Header: value`` lines
    (each sealed), plain ``NAME=VALUE`` headers one a line, blank fields left out."""
    body = form_body(form, texts=("name", "url", "description"), numbers=("timeout", "rate"))
    bearer, secret = form.get("bearer", "").strip(), form.get("secret", "").strip()
    if bearer and secret:
        raise Refusal(
            400,
            "bad_request",
            "bearer: give a bearer token or credential headers, not both",
            "bearer",
        )
    if bearer:
        body["bearer"] = bearer
    if secret:
        body["secret"] = secret
    headers = [h.strip() for h in form.get("headers", "").splitlines() if h.strip()]
    if headers:
        body["headers"] = headers
    return schema.read(McpServerAdd, body)


def pages(frame: Frame, mcp: McpDesk, grants: Grants) -> list[Page]:
    def render(call: PageCall, tested: McpTestJson | None = None, status: int = 200) -> Response:
        return frame.render(
            call.request,
            "mcp.html",
            call.session,
            status=status,
            rows=shown_servers(mcp.servers(call.principal), grants),
            tested=tested,
            endpoint=gateway_mcp(call.request, frame),
        )

    async def show(call: PageCall) -> Response:
        return render(call)

    async def add(call: PageCall) -> Response:
        made = await mcp.add(added(call.form), call.principal)
        return RedirectResponse(f"/admin/mcp#mcp-{made['name']}", status_code=303)

    async def test(call: PageCall) -> Response:
        return render(call, tested=await mcp.test(call.params["name"], call.principal))

    def switcher(enabled: bool) -> PageHandler:
        async def switch(call: PageCall) -> Response:
            await mcp.switch(call.params["name"], enabled, call.principal)
            return RedirectResponse("/admin/mcp", status_code=303)

        switch.__name__ = "mcp_on" if enabled else "mcp_off"
        return switch

    async def remove(call: PageCall) -> Response:
        await mcp.remove(call.params["name"], call.principal)
        return RedirectResponse("/admin/mcp", status_code=303)

    one = "/admin/mcp/servers/{name}"
    return [
        Page("GET", "/admin/mcp", show, role="admin"),
        Page("POST", "/admin/mcp/servers", add, role="admin"),
        Page("POST", one + "/test", test, role="admin"),
        Page("POST", one + "/off", switcher(False), role="admin"),
        Page("POST", one + "/on", switcher(True), role="admin"),
        Page("POST", one + "/remove", remove, role="admin"),
    ]


def gateway_mcp(request: Request, frame: Frame) -> str:
    """``/mcp`` as a person's agent reaches it: on the gateway's listener, which serves
    these pages and ``/v1`` too."""
    return site_origin(request, frame.behind_tls) + "/mcp"
