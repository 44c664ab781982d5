"""The gateway's own client of tool servers against a server that keeps sessions (and
forgets them), answers as an event stream with notifications before its answer, and
the SDK's server in its JSON mode; and ``McpCalls``' rate, breaker and record with an
injected clock."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.server.audittrail import AuditTrail
from llmgw.server.mcp.calls import FAILURES, OUT_FOR, McpCalls
from llmgw.server.mcp.registry import Header, McpServer
from llmgw.server.mcp.upstream import PROTOCOL, UpstreamError, Upstreams
from tests.server.mcp.conftest import Door
from tests.support.mcptools import ToolServer
from tests.support.ports import free_port


class Sessions:
    """Gives a session id at initialize, 404s an id it forgot, answers tools/call as
    SSE with a progress notification first."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.made = 0
        self.versions: list[str | None] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        message: dict[str, Any] = await request.json()
        self.versions.append(request.headers.get("MCP-Protocol-Version"))
        if message["method"] == "initialize":
            self.made += 1
            sid = f"s{self.made}"
            self.live.add(sid)
            body = {
                "jsonrpc": "2.0",
                "id": message["id"],
                "result": {"protocolVersion": message["params"]["protocolVersion"]},
            }
            return web.json_response(body, headers={"Mcp-Session-Id": sid})
        if request.headers.get("Mcp-Session-Id") not in self.live:
            return web.Response(status=404)
        if "id" not in message:
            return web.Response(status=202)
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
        await answer.write(f"event: message\ndata: {json.dumps(note)}\n\n".encode())
        result = (
            {"tools": [{"name": "t", "description": "a tool"}]}
            if message["method"] == "tools/list"
            else {"content": [{"type": "text", "text": "done"}]}
        )
        body = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        await answer.write(f"event: message\ndata: {json.dumps(body)}\n\n".encode())
        return answer


@pytest.fixture
async def sessions() -> AsyncIterator[tuple[Sessions, McpServer, Upstreams]]:
    fake = Sessions()
    app = web.Application()
    app.router.add_post("/mcp", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    async with aiohttp.ClientSession() as session:
        yield fake, McpServer("s", f"http://127.0.0.1:{port}/mcp"), Upstreams(lambda: session)
    await runner.cleanup()


async def test_a_forgotten_session_is_initialized_again(
    sessions: tuple[Sessions, McpServer, Upstreams],
) -> None:
    fake, server, upstreams = sessions
    assert (await upstreams.call(server, "t", {})).content == [{"type": "text", "text": "done"}]
    assert fake.made == 1 and PROTOCOL in fake.versions
    fake.live.clear()  # the server restarted
    assert (await upstreams.call(server, "t", {})).content[0]["text"] == "done"  # type: ignore[index]
    assert fake.made == 2


async def test_tools_are_cached_and_read_again_when_fresh_is_asked(
    sessions: tuple[Sessions, McpServer, Upstreams],
) -> None:
    fake, server, upstreams = sessions
    assert [t.name for t in await upstreams.tools(server)] == ["t"]
    asked = len(fake.versions)
    await upstreams.tools(server)
    assert len(fake.versions) == asked
    await upstreams.tools(server, fresh=True)
    assert len(fake.versions) == asked + 1


async def test_the_sdk_servers_json_mode_is_read_too(gw: Door) -> None:
    with ToolServer(json_response=True) as tools:
        async with aiohttp.ClientSession() as session:
            upstreams = Upstreams(lambda: session)
            server = McpServer("j", tools.url)
            assert "echo" in [t.name for t in await upstreams.tools(server)]
            result = await upstreams.call(server, "echo", {"text": "json"})
            assert result.content[0]["text"] == "json"  # type: ignore[index]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_the_breaker_opens_after_five_failures_and_lets_one_through_after(
    gw: Door,
) -> None:
    clock = Clock()
    calls = McpCalls(AuditTrail(gw.store.audit_many), clock)
    for _ in range(FAILURES - 1):
        calls.failed("s")
    assert calls.out_until("s") is None
    calls.failed("s")
    assert calls.out_until("s") == clock.now + OUT_FOR
    clock.now += OUT_FOR
    assert calls.out_until("s") is None  # one call may go
    calls.failed("s")
    assert calls.out_until("s") == clock.now + OUT_FOR  # and its failure puts it out again
    clock.now += OUT_FOR
    calls.succeeded("s")
    calls.failed("s")
    assert calls.out_until("s") is None  # a success closed it: five again


async def test_a_rate_window_slides_by_the_second(gw: Door) -> None:
    clock = Clock()
    calls = McpCalls(AuditTrail(gw.store.audit_many), clock)
    assert calls.over_rate("k", "s", 2) is None
    clock.now += 30
    assert calls.over_rate("k", "s", 2) is None
    wait = calls.over_rate("k", "s", 2)
    assert wait is not None and 29 <= wait <= 31
    clock.now += 31
    assert calls.over_rate("k", "s", 2) is None
    assert calls.over_rate("k", "s", None) is None


async def test_the_record_is_written_in_batches_off_the_call_path(
    gw: Door,
) -> None:
    calls = McpCalls(AuditTrail(gw.store.audit_many))
    calls.record("k1", "alice", "jira", "create", 0.0123, "ok")
    calls.record("k1", "alice", "jira", "create", 0.5, "timeout")
    assert await gw.store.audit_log() == []  # nothing on the call's path
    await calls.trail.flush()
    entries = await gw.store.audit_log()
    assert sorted(e["detail"] for e in entries) == [
        "key alice; 12.3 ms; ok",
        "key alice; 500.0 ms; timeout",
    ]
    assert {(e["action"], e["target"]) for e in entries} == {("mcp.call", "jira.create")}
    lines = calls.metric_lines([("jira", True)])
    assert 'llmgw_mcp_calls_total{server="jira",outcome="timeout"} 1' in lines
    assert 'llmgw_mcp_call_seconds_count{server="jira"} 2' in lines
    assert 'llmgw_mcp_server_up{server="jira"} 1' in lines
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs Debian's prometheus package"
    checked = subprocess.run(
        [promtool, "check", "metrics"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


async def test_a_redirect_is_not_followed_so_the_credential_stays_with_its_server() -> None:
    """A tool server (or whatever answers at its address) that redirects elsewhere gets
    no second request: the sealed header would have gone with it. The error says where
    it pointed and how to give the server its final address."""
    seen: list[dict[str, str]] = []

    async def elsewhere(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(status=500)

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": f"{target}/mcp"})

    apps = []
    for handler in (elsewhere, redirect):
        app = web.Application()
        app.router.add_route("*", "/mcp", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        apps.append((runner, f"http://127.0.0.1:{port}"))
    target, source = apps[0][1], apps[1][1]
    server = McpServer("jira", f"{source}/mcp", (Header("X-Api-Key", "s3cr3t-k3y", "sealed1:..."),))
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(UpstreamError) as caught:
                await Upstreams(lambda: session).tools(server)
        assert caught.value.kind == "http_status"
        said = caught.value.message
        assert "HTTP 307, a redirect to " + target in said and "not followed" in said
        assert "llmgw ctl mcp set jira --url URL" in said and "s3cr3t-k3y" not in said
        assert seen == []  # nothing reached the other address, the credential least of all
    finally:
        for runner, _ in apps:
            await runner.cleanup()
