"""``/mcp`` in process: the SDK's own tool server behind it and the SDK's own client in
front, a key's grants deciding what it sees and calls, and each bound and cut-off
holding with an error that says what was wrong."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from llmgw.jsonvalue import JSON
from llmgw.server.gateway.limits import Key
from llmgw.server.mcp.calls import FAILURES
from llmgw.server.mcp.gateway import (
    GUARD_REFUSED,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_BODY,
    PARSE_ERROR,
    RATE_LIMITED,
    UNAVAILABLE,
    UPSTREAM,
)
from llmgw.server.mcp.service import McpServerAdd, McpServerChange
from llmgw.server.mcp.tools import Reading, Tool, ToolResult
from tests.server.mcp.conftest import ADMIN, Door, door, sdk_client
from tests.support.mcptools import PERSON, PLANTED, Hostile, ToolServer


async def add(gw: Door, name: str, url: str, **more: object) -> None:
    await gw.parts.service.add(McpServerAdd(name=name, url=url, **more), ADMIN)  # type: ignore[arg-type]


def error_of(body: Mapping[str, object]) -> tuple[int, str]:
    error = body["error"]
    assert isinstance(error, dict), body
    return error["code"], error["message"]


async def test_the_sdk_client_sees_and_calls_only_its_granted_tools(gw: Door) -> None:
    with ToolServer() as tools:
        await add(gw, "tickets", tools.url)
        secret = gw.key("alice", ("tickets.echo", "tickets.stall"))
        # The SDK's client in auto mode: server/discover (-32601 here), then initialize.
        async with sdk_client(gw.url, secret) as client:
            listed = await client.list_tools()
            assert sorted(t.name for t in listed.tools) == ["tickets.echo", "tickets.stall"]
            answer = await client.call_tool("tickets.echo", {"text": "hello"})
            assert [c.text for c in answer.content] == ["hello"]  # type: ignore[union-attr]
            with pytest.raises(MCPError, match="no tool 'tickets.ticket' granted to this key"):
                await client.call_tool("tickets.ticket", {})
            # An unknown tool is told just as an ungranted one.
            with pytest.raises(MCPError, match="no tool 'tickets.nothing' granted to this key"):
                await client.call_tool("tickets.nothing", {})
        assert tools.calls == ["echo"]


async def test_a_key_with_no_grant_sees_no_tool_and_its_servers_are_not_asked(gw: Door) -> None:
    with ToolServer() as tools:
        await add(gw, "tickets", tools.url)
        none, closed = gw.key("none", None), gw.key("closed", ())
        for secret in (none, closed):
            _, body = await gw.post(secret, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert body["result"] == {"tools": []}
        assert tools.seen == []  # not one request reached the tool server


async def test_the_sealed_credential_reaches_the_server_and_nothing_shows_it(gw: Door) -> None:
    with ToolServer("X-Api-Key", "k3y-s3cr3t") as tools:
        shown = await gw.parts.service.add(
            McpServerAdd(name="tickets", url=tools.url, secret="X-Api-Key: k3y-s3cr3t\n"), ADMIN
        )
        assert shown["headers"] == [{"name": "X-Api-Key", "sealed": True, "value": None}]
        secret = gw.key("alice", ("tickets.*",))
        body = await gw.call(secret, "tickets.echo", {"text": "hi"})
        assert body["result"]["content"][0]["text"] == "hi"  # type: ignore[index]
        assert "k3y-s3cr3t" in tools.seen
        kept = await gw.store.get_setting("mcp")
        assert kept is not None and "k3y-s3cr3t" not in kept and "sealed1:" in kept
        await gw.parts.calls.trail.flush()
        audit = json.dumps(await gw.store.audit_log())
        assert "k3y-s3cr3t" not in audit and "mcp.call" in audit
        assert "k3y-s3cr3t" not in json.dumps(gw.parts.service.servers(ADMIN))
        # Read back by a fresh registry (a standby's): still opens, still hidden.
        await gw.parts.registry.load()
        assert gw.parts.registry.servers["tickets"].sent_headers() == {"X-Api-Key": "k3y-s3cr3t"}


async def test_a_wrong_credential_is_said_by_test_without_the_credential(gw: Door) -> None:
    with ToolServer("X-Api-Key", "right") as tools:
        await add(gw, "tickets", tools.url, bearer="wrong-token")
        found = await gw.parts.service.test("tickets", ADMIN)
        assert not found["ok"] and found["failure"] == "http_status"
        assert "401" in (found["message"] or "") and "wrong-token" not in json.dumps(found)


async def test_batches_bad_json_and_big_bodies_are_refused_before_anything_is_sent(
    gw: Door,
) -> None:
    with ToolServer() as tools:
        await add(gw, "tickets", tools.url)
        secret = gw.key("alice", ("tickets.*",))
        call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "tickets.echo"}}
        batch = [
            {**call, "id": i, "params": {"name": "tickets.echo", "arguments": {"text": "x"}}}
            for i in range(10_000)
        ]
        status, body = await gw.post(secret, batch)
        assert status == 400 and error_of(body) == (
            INVALID_REQUEST,
            "batches are not taken: send one request",
        )
        status, body = await gw.post(secret, b"{not json")
        assert status == 400 and error_of(body)[0] == PARSE_ERROR
        status, body = await gw.post(secret, b" " * (MAX_BODY + 1))
        assert status == 413 and "4 MiB" in error_of(body)[1]
        assert tools.seen == [] and tools.calls == []


@pytest.mark.parametrize(
    "name",
    ["tickets.ec\x00ho", "tickets..echo", "/tickets.echo", "echo", "tickets.", ".echo", 7],
)
async def test_a_bad_tool_name_is_refused_naming_the_field(gw: Door, name: object) -> None:
    secret = gw.key("alice", ("*",))
    body = await gw.call(secret, name)  # type: ignore[arg-type]
    code, message = error_of(body)
    assert code == INVALID_PARAMS and message.startswith("params.name")


async def test_get_and_delete_are_405_and_a_revoked_key_401(gw: Door) -> None:
    secret = gw.key("alice", ("*",))
    for method in ("GET", "DELETE"):
        async with gw.session.request(
            method, gw.url, headers={"Authorization": f"Bearer {secret}"}
        ) as answer:
            assert answer.status == 405 and answer.headers["Allow"] == "POST"
    status, _ = await gw.post("sk-llmgw-unknown", {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert status == 401


async def test_initialize_answers_the_clients_version_when_taken_else_the_newest(
    gw: Door,
) -> None:
    secret = gw.key("alice", ("*",))
    for asked, answered in (("2025-03-26", "2025-03-26"), ("1999-01-01", "2025-11-25")):
        _, body = await gw.post(
            secret,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {"protocolVersion": asked},
            },
        )
        assert body["result"]["protocolVersion"] == answered  # type: ignore[index]
    status, body = await gw.post(secret, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert status == 202 and body == {}
    _, body = await gw.post(secret, {"jsonrpc": "2.0", "id": 2, "method": "server/discover"})
    assert error_of(body)[0] == -32601


async def test_a_rate_refuses_past_n_a_minute_naming_it_and_the_wait(gw: Door) -> None:
    with ToolServer() as tools:
        await add(gw, "tickets", tools.url, rate=2)
        alice, bob = gw.key("alice", ("tickets.*",)), gw.key("bob", ("tickets.*",))
        for _ in range(2):
            assert "result" in await gw.call(alice, "tickets.echo", {"text": "x"})
        code, message = error_of(await gw.call(alice, "tickets.echo", {"text": "x"}))
        assert (
            code == RATE_LIMITED and "rate of 2 a minute" in message and "try again in" in message
        )
        assert "result" in await gw.call(bob, "tickets.echo", {"text": "x"})  # each key its own
        assert tools.calls == ["echo"] * 3


async def test_five_failures_take_a_server_out_and_its_tools_off_the_list(gw: Door) -> None:
    async with Hostile("garbage") as hostile:
        await add(gw, "bad", hostile.url)
        secret = gw.key("alice", ("bad.*",))
        for _ in range(FAILURES):
            code, message = error_of(await gw.call(secret, "bad.answer"))
            assert code == UPSTREAM and "'bad'" in message and "not JSON-RPC" in message
        posts = hostile.posts
        code, message = error_of(await gw.call(secret, "bad.answer"))
        assert code == UNAVAILABLE and "out until" in message
        assert hostile.posts == posts  # refused here, nothing sent
        _, body = await gw.post(secret, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert body["result"] == {"tools": []}
        assert 'llmgw_mcp_server_up{server="bad"} 0' in gw.parts.gateway.metric_lines()
        # Turned on again (by an operator), it is in again.
        await gw.parts.service.switch("bad", True, ADMIN)
        assert gw.parts.calls.out_until("bad") is None


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("garbage", "not JSON-RPC"),
        ("huge", "more than 8 MiB"),
        ("drop", "mid-"),
    ],
)
async def test_a_hostile_server_gives_a_clear_error(gw: Door, mode: str, words: str) -> None:
    async with Hostile(mode) as hostile:
        await add(gw, "bad", hostile.url)
        secret = gw.key("alice", ("bad.*",))
        code, message = error_of(await gw.call(secret, "bad.answer"))
        assert code == UPSTREAM and "MCP server 'bad'" in message and words in message


async def test_a_stalling_server_times_out_while_another_answers(gw: Door) -> None:
    with ToolServer() as slow, ToolServer() as quick:
        await add(gw, "slow", slow.url, timeout=1.0)
        await add(gw, "quick", quick.url)
        secret = gw.key("alice", ("slow.*", "quick.*"))
        stalled = asyncio.create_task(gw.call(secret, "slow.stall"))
        while "stall" not in slow.calls:  # the slow call is under way
            await asyncio.sleep(0.02)
        answer = await gw.call(secret, "quick.echo", {"text": "meanwhile"})
        assert answer["result"]["content"][0]["text"] == "meanwhile"  # type: ignore[index]
        assert not stalled.done()
        code, message = error_of(await stalled)
        assert code == UPSTREAM and "within 1 s (its --timeout)" in message
        assert gw.parts.calls.outcomes[("slow", "timeout")] == 1


class Guard:
    """A guard double: blocks arguments holding 'password', withholds an answer holding
    'IGNORE ALL', redacts an email."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def tool_arguments(
        self, key: Key, tool: str, arguments: Mapping[str, JSON]
    ) -> tuple[Reading, Mapping[str, JSON]]:
        self.asked.append(f"args {tool}")
        if "password" in json.dumps(arguments):
            return Reading("block", policy="strict", reason="a password"), arguments
        return Reading("pass"), arguments

    async def tool_answer(
        self, key: Key, tool: str, result: ToolResult
    ) -> tuple[Reading, ToolResult]:
        self.asked.append(f"answer {tool}")
        text = json.dumps(result.content)
        if "IGNORE ALL" in text:
            notice = "[withheld by llmgw: an instruction to the model]"
            return Reading("withhold", notice, "strict"), ToolResult(
                [{"type": "text", "text": notice}]
            )
        if "@" in text:
            out = [{"type": "text", "text": "Customer: Jane Roe, j***@***, +44 20 7946 0958"}]
            return Reading("redact", None, "strict"), ToolResult(out)  # type: ignore[list-item]
        return Reading("pass"), result


async def test_the_guard_reads_a_key_with_policies_and_only_such_a_key(tmp_path: Path) -> None:
    guard = Guard()
    async with door(tmp_path, guard=guard) as gw:
        with ToolServer() as tools:
            await add(gw, "tickets", tools.url)
            guarded = gw.key("guarded", ("tickets.*",), guard=("strict",))
            plain = gw.key("plain", ("tickets.*",))
            code, message = error_of(
                await gw.call(guarded, "tickets.echo", {"text": "my password is x"})
            )
            assert code == GUARD_REFUSED and "'strict'" in message and "a password" in message
            assert tools.calls == []  # blocked: not sent
            answer = await gw.call(guarded, "tickets.ticket")
            assert "withheld" in json.dumps(answer) and PLANTED not in json.dumps(answer)
            answer = await gw.call(guarded, "tickets.person")
            assert "j***@***" in json.dumps(answer) and PERSON not in json.dumps(answer)
            asked = len(guard.asked)
            answer = await gw.call(plain, "tickets.ticket")
            assert PLANTED in json.dumps(answer)
            assert len(guard.asked) == asked  # no policies: the guard is not asked


class Admin:
    """A built-in server double (part C writes llmgw:admin)."""

    name = "llmgw:admin"

    def tools(self) -> list[Tool]:
        return [Tool("list_nodes", "The nodes")]

    async def call(self, tool: str, arguments: Mapping[str, JSON]) -> ToolResult:
        return ToolResult([{"type": "text", "text": "node01"}])


async def test_the_builtin_server_is_answered_in_process_and_can_be_turned_off(
    tmp_path: Path,
) -> None:
    async with door(tmp_path, builtins=[Admin()]) as gw:
        secret = gw.key("alice", ("llmgw:admin.*",))
        body = await gw.call(secret, "llmgw:admin.list_nodes")
        assert body["result"]["content"] == [{"type": "text", "text": "node01"}]  # type: ignore[index]
        await gw.parts.service.switch("llmgw:admin", False, ADMIN)
        code, _ = error_of(await gw.call(secret, "llmgw:admin.list_nodes"))
        assert code == INVALID_PARAMS
        await gw.parts.service.update("llmgw:admin", McpServerChange(rate=5), ADMIN)
        assert gw.parts.registry.servers["llmgw:admin"].rate == 5


async def test_an_answer_of_one_long_event_line_is_read_whole(gw: Door) -> None:
    # The SDK's server answers in an event stream: one `data:` line of over a MiB here,
    # past aiohttp's own line reader's limit (128 KiB).
    with ToolServer() as tools:
        await add(gw, "tickets", tools.url)
        secret = gw.key("alice", ("tickets.echo",))
        text = "x" * (3 * 2**19)
        answer = await gw.call(secret, "tickets.echo", {"text": text})
        assert answer["result"]["content"][0]["text"] == text  # type: ignore[index]


async def test_a_body_that_stalls_is_refused_in_its_time(
    gw: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("llmgw.server.mcp.gateway.BODY_WAIT", 0.5)
    secret = gw.key("alice", ("*",))
    host, port = gw.url.split("//")[1].split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {secret}\r\nContent-Length: 100\r\n\r\n".encode()
        + b'{"jsonrpc": '
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 408")
