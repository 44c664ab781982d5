"""``McpService`` over a real SQLite store: what it refuses (naming the field and what to
do), who may do what, ``llmgw:admin`` kept, every change audited without a credential,
and a standby's registry reading what the leader wrote."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from llmgw.server.mcp.registry import McpRegistry
from llmgw.server.mcp.service import McpServerAdd, McpServerChange
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from tests.server.mcp.conftest import ADMIN, SECRET, Door

OPERATOR = Principal("op@10.0.0.6", "operator", "token")
VIEWER = Principal("viewer@10.0.0.7", "viewer", "token")
URL = "https://tools.example.com/mcp"


async def refused(gw: Door, ask: McpServerAdd) -> Refusal:
    with pytest.raises(Refusal) as caught:
        await gw.parts.service.add(ask, ADMIN)
    return caught.value


async def test_an_address_with_a_credential_is_refused_saying_where_it_goes(gw: Door) -> None:
    found = await refused(gw, McpServerAdd("jira", "https://bob:hunter2@jira.example.com/mcp"))
    assert found.status == 400 and found.field == "url"
    assert "--bearer-file or --secret-file" in found.message and "hunter2" not in found.message


@pytest.mark.parametrize(
    ("ask", "field"),
    [
        (McpServerAdd("jira", "ftp://jira.example.com/mcp"), "url"),
        (McpServerAdd("jira", "not an address"), "url"),
        (McpServerAdd("Jira!", URL), "name"),
        (McpServerAdd("-jira", URL), "name"),
        (McpServerAdd("jira", URL, secret="X-Api-Key=abc\n"), "secret"),
        (McpServerAdd("jira", URL, secret="X-Api-Key:\n"), "secret"),
        (McpServerAdd("jira", URL, secret="\n# nothing\n"), "secret"),
        (McpServerAdd("jira", URL, headers=("Authorization=Bearer abc",)), "headers"),
        (McpServerAdd("jira", URL, headers=("no-equals",)), "headers"),
        (McpServerAdd("jira", URL, bearer="two\nlines"), "bearer"),
    ],
)
async def test_bad_input_is_refused_naming_the_field(
    gw: Door, ask: McpServerAdd, field: str
) -> None:
    found = await refused(gw, ask)
    assert found.status == 400 and found.field == field and found.message.startswith(field)
    assert "abc" not in found.message  # a credential is never said back
    assert await gw.store.get_setting("mcp") is None  # nothing written


async def test_a_secret_files_lines_are_sealed_and_named_only(gw: Door) -> None:
    shown = await gw.parts.service.add(
        McpServerAdd(
            "jira",
            URL,
            headers=("X-Org=acme",),
            secret="X-Api-Key: abc123\nX-Other: def456\n",
            rate=10,
            description="tickets",
        ),
        ADMIN,
    )
    assert shown["headers"] == [
        {"name": "X-Org", "sealed": False, "value": "acme"},
        {"name": "X-Api-Key", "sealed": True, "value": None},
        {"name": "X-Other", "sealed": True, "value": None},
    ]
    kept = await gw.store.get_setting("mcp")
    assert kept is not None and "abc123" not in kept and "def456" not in kept
    (entry,) = await gw.store.audit_log()
    assert entry["action"] == "mcp.add" and "X-Api-Key (sealed)" in entry["detail"]
    assert "abc123" not in json.dumps(entry)
    # A standby's registry reads the same document with the cluster's key.
    standby = McpRegistry(gw.store, SECRET)
    await standby.load()
    assert standby.servers["jira"].sent_headers()["X-Api-Key"] == "abc123"
    assert standby.servers["jira"].rate == 10


async def test_a_change_replaces_a_credential_and_clears_what_it_names(gw: Door) -> None:
    await gw.parts.service.add(McpServerAdd("jira", URL, bearer="old", rate=3), ADMIN)
    shown = await gw.parts.service.update(
        "jira", McpServerChange(bearer="new", clear=("rate",), timeout=5.0), ADMIN
    )
    assert shown["rate"] is None and shown["timeout"] == 5.0
    assert gw.parts.registry.servers["jira"].sent_headers() == {"Authorization": "Bearer new"}
    shown = await gw.parts.service.update("jira", McpServerChange(clear=("secret",)), ADMIN)
    assert shown["headers"] == []
    with pytest.raises(Refusal) as caught:
        await gw.parts.service.update("jira", McpServerChange(clear=("everything",)), ADMIN)
    assert caught.value.field == "clear"


async def test_the_builtin_is_listed_and_cannot_be_removed_moved_or_added_again(
    gw: Door,
) -> None:
    names = [s["name"] for s in gw.parts.service.servers(ADMIN)]
    assert names == ["llmgw:admin"]
    service = gw.parts.service
    with pytest.raises(Refusal) as caught:
        await service.remove("llmgw:admin", ADMIN)
    assert caught.value.status == 409 and "ctl mcp off llmgw:admin" in caught.value.message
    with pytest.raises(Refusal) as caught:
        await service.update("llmgw:admin", McpServerChange(url=URL), ADMIN)
    assert caught.value.status == 409
    with pytest.raises(Refusal) as caught:
        await service.add(McpServerAdd("llmgw:admin", URL), ADMIN)
    assert caught.value.status == 409
    shown = await service.switch("llmgw:admin", False, OPERATOR)
    assert shown["enabled"] is False and shown["up"] is False
    await gw.parts.registry.load()  # kept: read again, still off
    assert gw.parts.registry.servers["llmgw:admin"].enabled is False


async def test_who_may_do_what(gw: Door) -> None:
    service = gw.parts.service
    with pytest.raises(Refusal) as caught:
        service.servers(VIEWER)
    assert caught.value.status == 403
    with pytest.raises(Refusal):
        await service.add(McpServerAdd("jira", URL), OPERATOR)
    await service.add(McpServerAdd("jira", URL), ADMIN)
    assert (await service.switch("jira", False, OPERATOR))["enabled"] is False
    with pytest.raises(Refusal):
        await service.remove("jira", OPERATOR)
    assert await service.remove("jira", ADMIN) == {"name": "jira", "removed": True}
    with pytest.raises(Refusal) as caught:
        service.show("jira", ADMIN)
    assert caught.value.status == 404
    with pytest.raises(Refusal) as caught:
        await service.add(McpServerAdd("dup", URL), ADMIN)
        await service.add(McpServerAdd("dup", URL), ADMIN)
    assert caught.value.status == 409


async def test_test_says_what_failed_connecting(gw: Door) -> None:
    # A port nothing listens on (the discard port, closed on a test machine).
    await gw.parts.service.add(McpServerAdd("gone", "http://127.0.0.1:9/mcp", timeout=5), ADMIN)
    found = await gw.parts.service.test("gone", ADMIN)
    assert found["ok"] is False and found["failure"] == "connect"
    assert "could not reach MCP server 'gone'" in (found["message"] or "")


async def test_a_server_this_key_cannot_open_is_not_used_and_never_written_away(
    gw: Door,
) -> None:
    """An entry whose credential another cluster key sealed (a restored store, a damaged
    document) is left out of the servers, and kept in the store through later changes."""
    await gw.parts.service.add(McpServerAdd("jira", URL, bearer="t0ken"), ADMIN)
    other = McpRegistry(gw.store, b"another cluster's key, 32 bytes!")
    await other.load()
    assert "jira" not in other.servers and [e["name"] for e in other.unread] == ["jira"]
    await other.write(other.put(replace(other.servers["llmgw:admin"], enabled=False)))
    raw = await gw.store.get_setting("mcp")
    assert raw is not None
    assert sorted(e["name"] for e in json.loads(raw)["servers"]) == ["jira", "llmgw:admin"]
    await gw.parts.registry.load()  # the right key still opens it, unchanged
    assert gw.parts.registry.servers["jira"].sent_headers() == {"Authorization": "Bearer t0ken"}
