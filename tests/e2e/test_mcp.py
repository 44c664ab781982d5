"""The MCP gateway against a real control plane (``llmgw server run``): the SDK's own
tool servers (MCPServer over streamable HTTP, in this process's threads) added with
``ctl mcp add`` and a sealed credential, and the SDK's own client through the gateway's
``/mcp`` with a gateway key.

A key is granted tools as a person would grant them: ``POST /api/v1/keys/{id}/limits``
(``ctl keys limits KEY --tools``).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.e2e.cluster import Cluster, run, wait_for
from tests.support.mcptools import PLANTED, Hostile, ToolServer

pytestmark = pytest.mark.e2e

CREDENTIAL = "e2e-k3y-0f-the-t00l-server"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("mcp"))
    c.init()
    c.start_server()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def tools(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolServer]:
    """The SDK's tool server, demanding its key, added as ``tickets`` with the key in a
    --secret-file, and a second, ``slow``, with a 2 s timeout."""
    secret = tmp_path_factory.mktemp("secret") / "tickets.secret"
    secret.write_text(f"X-Api-Key: {CREDENTIAL}\n")
    with ToolServer("X-Api-Key", CREDENTIAL) as server, ToolServer() as slow:
        ctl(cluster, "mcp", "add", "tickets", server.url, "--secret-file", str(secret))
        ctl(cluster, "mcp", "add", "slow", slow.url, "--timeout", "2")
        server.slow = slow  # type: ignore[attr-defined]
        yield server


def ctl(cluster: Cluster, *args: str) -> Any:
    given = ["--server", cluster.listen, "--token", cluster.admin_token, "--json"]
    return json.loads(run("ctl", *args, *given).stdout)


def new_key(cluster: Cluster, name: str) -> tuple[str, str]:
    made = cluster.api("/api/v1/keys", body={"name": name})
    return made["id"], made["key"]


def grant(cluster: Cluster, key_id: str, patterns: list[str]) -> None:
    """Grant a key tools (``ctl keys limits KEY --tools``)."""
    status, _, body = cluster.post(
        f"/api/v1/keys/{key_id}/limits",
        json.dumps({"tools": patterns}).encode(),
        cluster.admin_token,
    )
    assert status == 200, body


def mcp_post(cluster: Cluster, key: str, message: object) -> tuple[int, Any]:
    status, _, body = cluster.post("/mcp", json.dumps(message).encode(), key)
    return status, body


async def sdk_tools(cluster: Cluster, key: str) -> list[str]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(
            streamable_http_client(f"http://{cluster.listen}/mcp", http_client=http)
        ) as client:
            return sorted(t.name for t in (await client.list_tools()).tools)


def test_the_credential_reaches_the_server_sealed_and_is_shown_nowhere(
    cluster: Cluster, tools: ToolServer
) -> None:
    found = ctl(cluster, "mcp", "test", "tickets")
    assert found["ok"] is True and {t["name"] for t in found["tools"]} >= {"echo", "ticket"}
    assert CREDENTIAL in tools.seen
    listed = json.dumps(cluster.api("/api/v1/mcp/servers"))
    audit = json.dumps(cluster.api("/api/v1/audit"))
    log = (cluster.root / "server.log").read_text()
    for where in (listed, audit, log, json.dumps(found)):
        assert CREDENTIAL not in where
    assert '"sealed": true' in listed


def test_the_sdk_client_handshakes_and_a_key_without_grants_sees_nothing(
    cluster: Cluster, tools: ToolServer
) -> None:
    _, key = new_key(cluster, "nogrant")
    assert asyncio.run(sdk_tools(cluster, key)) == []
    status, body = mcp_post(
        cluster,
        key,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "tickets.echo", "arguments": {"text": "x"}},
        },
    )
    assert status == 200 and "no tool 'tickets.echo' granted" in body["error"]["message"]
    assert "echo" not in tools.calls


def test_bounds_and_auth_hold_on_the_gateway_listener(cluster: Cluster, tools: ToolServer) -> None:
    key_id, key = new_key(cluster, "bounds")
    batch = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(10_000)]
    status, body = mcp_post(cluster, key, batch)
    assert status == 400 and body["error"]["message"] == "batches are not taken: send one request"
    status, _, body = cluster.post("/mcp", b"x" * (5 * 2**20), key)
    assert status == 413
    request = urllib.request.Request(
        f"http://{cluster.listen}/mcp", headers={"Authorization": f"Bearer {key}"}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    with caught.value as refused:
        assert refused.code == 405
    cluster.api(f"/api/v1/keys/{key_id}", method="DELETE")
    status, _ = mcp_post(cluster, key, {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert status == 401


def test_the_metrics_say_each_server_up(cluster: Cluster, tools: ToolServer) -> None:
    req = urllib.request.Request(
        f"http://{cluster.listen}/metrics",
        headers={"Authorization": f"Bearer {cluster.admin_token}"},
    )
    with urllib.request.urlopen(req, timeout=10) as answer:
        text = answer.read().decode()
    assert 'llmgw_mcp_server_up{server="tickets"} 1' in text


def test_a_granted_key_sees_and_calls_only_its_tools(cluster: Cluster, tools: ToolServer) -> None:
    key_id, key = new_key(cluster, "granted")
    grant(cluster, key_id, ["tickets.echo", "tickets.ticket", "slow.*"])
    assert asyncio.run(sdk_tools(cluster, key)) == [
        "slow.echo",
        "slow.person",
        "slow.stall",
        "slow.ticket",
        "tickets.echo",
        "tickets.ticket",
    ]

    async def calls() -> None:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http:
            url = f"http://{cluster.listen}/mcp"
            async with Client(streamable_http_client(url, http_client=http)) as client:
                answer = await client.call_tool("tickets.ticket", {})
                assert PLANTED in answer.content[0].text  # type: ignore[union-attr]
                with pytest.raises(MCPError, match="no tool 'tickets.person' granted"):
                    await client.call_tool("tickets.person", {})
                # A stalling server times out at its --timeout; the other answers meanwhile.
                stalled = asyncio.create_task(client.call_tool("slow.stall", {}))
                quick = await client.call_tool("tickets.echo", {"text": "meanwhile"})
                assert quick.content[0].text == "meanwhile"  # type: ignore[union-attr]
                with pytest.raises(MCPError, match=r"within 2 s \(its --timeout\)"):
                    await stalled

    asyncio.run(calls())
    assert "person" not in tools.calls


def test_hostile_servers_give_clear_errors(cluster: Cluster, tools: ToolServer) -> None:
    async def each() -> list[str]:
        said = []
        for mode in ("garbage", "huge", "drop"):
            async with Hostile(mode) as hostile:
                ctl(cluster, "mcp", "add", mode, hostile.url)
                message = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/call",
                    "params": {"name": f"{mode}.answer"},
                }
                # Off this loop: the hostile server answers on it.
                _, _, body = await asyncio.to_thread(
                    cluster.post, "/mcp", json.dumps(message).encode(), key
                )
                said.append(body["error"]["message"])
                ctl(cluster, "mcp", "remove", mode)
        return said

    key_id, key = new_key(cluster, "hostile")
    grant(cluster, key_id, ["garbage.*", "huge.*", "drop.*"])
    garbage, huge, drop = asyncio.run(each())
    assert "'garbage'" in garbage and "not JSON-RPC" in garbage
    assert "'huge'" in huge and "more than 8 MiB" in huge
    assert "'drop'" in drop and "mid-" in drop


def test_a_rate_cuts_off_each_key(cluster: Cluster, tools: ToolServer) -> None:
    key_id, key = new_key(cluster, "rated")
    grant(cluster, key_id, ["rated.*"])
    ctl(cluster, "mcp", "add", "rated", tools.slow.url, "--rate", "2")  # type: ignore[attr-defined]
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "rated.echo", "arguments": {"text": "x"}},
    }
    assert "result" in mcp_post(cluster, key, call)[1]
    assert "result" in mcp_post(cluster, key, call)[1]
    message = mcp_post(cluster, key, call)[1]["error"]["message"]
    assert "rate of 2 a minute" in message and "try again in" in message
    ctl(cluster, "mcp", "remove", "rated")


def test_a_keys_guard_policy_reads_its_tool_calls(cluster: Cluster, tools: ToolServer) -> None:
    ctl(cluster, "guard", "policy", "add", "strict", "--pii", "redact", "--injection", "block")
    key_id, key = new_key(cluster, "guarded")
    status, _, body = cluster.post(
        f"/api/v1/keys/{key_id}/limits",
        json.dumps({"tools": ["tickets.*"], "guard": ["strict"]}).encode(),
        cluster.admin_token,
    )
    assert status == 200, body

    def call(name: str, arguments: dict[str, str] | None = None) -> str:
        message = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments or {}},
        }
        return json.dumps(mcp_post(cluster, key, message)[1])

    # The tool's answer, read as the prompt it becomes: the email redacted, the planted
    # instruction kept from the caller.
    person = call("tickets.person")
    assert "jane.roe@example.com" not in person and "Jane Roe" in person
    ticket = call("tickets.ticket")
    assert "IGNORE ALL PREVIOUS INSTRUCTIONS" not in ticket and "strict" in ticket
    # The arguments, read before they leave: the tool server never sees the email.
    echoed = call("tickets.echo", {"text": "write to bob@example.org"})
    assert "bob@example.org" not in echoed
    assert tools.texts[-1].startswith("write to ") and "bob@example.org" not in tools.texts[-1]


def test_a_standbys_tool_calls_are_audited_on_the_leader(pair: tuple[Cluster, Cluster]) -> None:
    """A standby answers /mcp from its copy of the store (the key and its grant made on
    the leader) and sends each call's audit entry to the leader, whose store is the
    only one written: the entry is there, naming the key, the tool and the outcome."""
    leader, standby = pair
    key_id, key = new_key(leader, "roaming")
    grant(leader, key_id, ["llmgw:admin.cluster_status"])
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "llmgw:admin.cluster_status", "arguments": {}},
    }

    def answered() -> bool:
        status, body = mcp_post(standby, key, call)  # the standby's copy has caught up
        return status == 200 and "result" in body

    wait_for(answered, 30, "the standby to answer with the key the leader made")
    wait_for(
        lambda: any(
            e["action"] == "mcp.call"
            and e["target"] == "llmgw:admin.cluster_status"
            and e["detail"].startswith("key roaming;")
            and e["detail"].endswith("; ok")
            for e in leader.api("/api/v1/audit")
        ),
        30,
        "the standby's call in the leader's audit log",
    )
