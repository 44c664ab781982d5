"""The MCP page of a real control plane, called in process over its SQLite store
through the pages' own steps (session, role, CSRF, headers): the real ``McpService``
(with ``llmgw:admin`` built in), keys and their grants set through the admin API as
``ctl keys limits`` sets them."""

from __future__ import annotations

import html
import re

from tests.server.pages.inprocess import Site, row, text

BEARER = "tok-3f9a-never-shown"


async def test_the_mcp_page_is_for_admins_and_shows_llmgw_admin(site: Site) -> None:
    for role in ("viewer", "operator"):
        answer = await site.client.get("/admin/mcp", headers=site.as_(role))
        assert answer.status_code == 403 and "it needs the admin role" in answer.text
    page = await site.page("/admin/mcp")
    assert 'href="/admin/mcp"' in page and 'href="/admin/guard"' in page
    own = row(page, "mcp-llmgw-admin")
    assert own.startswith("llmgw:admin llmgw's own tools, answered by the control plane on")
    assert "in the control plane" in own and " 6 " in own
    assert 'id="remove-llmgw:admin"' not in page
    # How a person's agent reaches /mcp here, with a key of their own.
    assert '"url": "http://cp/mcp"' in html.unescape(page)
    assert "--tools SERVER.*" in page


async def test_adding_a_server_keeps_its_token_sealed_and_shows_who_is_granted(
    site: Site,
) -> None:
    answer = await site.post(
        "/admin/mcp/servers",
        "admin",
        name="tickets",
        url="http://127.0.0.1:9/mcp",
        bearer=BEARER,
        headers="X-Org=acme",
        rate="5",
        timeout="10",
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/admin/mcp#mcp-tickets"
    key = await site.api("POST", "/api/v1/keys", {"name": "ci"})
    assert isinstance(key, dict)
    await site.api("POST", f"/api/v1/keys/{key['id']}/limits", {"tools": ["tickets.*"]})
    page = await site.page("/admin/mcp")
    tickets = row(page, "mcp-tickets")
    assert "http://127.0.0.1:9/mcp" in tickets
    assert "X-Org Authorization sealed" in tickets
    assert "5/min per caller 10.0 s not listed yet" in tickets
    assert "key ci: tickets.*" in tickets
    assert "no one" in row(page, "mcp-llmgw-admin")
    # The token is in no page and no audit entry.
    assert BEARER not in page
    audit = await site.client.get("/admin/audit", headers=site.as_("admin"))
    assert "mcp.add" in audit.text and BEARER not in audit.text
    assert all(BEARER not in str(e) for e in await site.cp.store.audit_log(100))


async def test_a_credential_in_the_address_is_refused_naming_where_it_belongs(
    site: Site,
) -> None:
    answer = await site.post(
        "/admin/mcp/servers", "admin", name="leaky", url="http://u:pw@127.0.0.1:9/mcp"
    )
    assert answer.status_code == 400
    assert "--bearer-file or --secret-file" in html.unescape(answer.text)
    assert "pw@" not in answer.text
    assert 'id="mcp-leaky"' not in await site.page("/admin/mcp")


async def test_test_off_on_and_remove(site: Site) -> None:
    answer = await site.post("/admin/mcp/servers/llmgw:admin/test", "admin")
    assert answer.status_code == 200
    tested = text(answer.text)
    assert re.search(r"Test of llmgw:admin Answered in [\d.]+ ms with 6 tools", tested)
    assert "llmgw:admin.list_nodes" in tested and "llmgw:admin.node_logs" in tested
    answer = await site.post("/admin/mcp/servers/llmgw:admin/off", "admin")
    assert answer.status_code == 303
    page = await site.page("/admin/mcp")
    assert 'class="state-off"' in page and 'id="on-llmgw-admin"' in page
    await site.post("/admin/mcp/servers/llmgw:admin/on", "admin")
    assert 'id="off-llmgw-admin"' in await site.page("/admin/mcp")
    await site.post("/admin/mcp/servers", "admin", name="gone", url="http://127.0.0.1:9/mcp")
    assert 'id="mcp-gone"' in await site.page("/admin/mcp")
    answer = await site.post("/admin/mcp/servers/gone/remove", "admin")
    assert answer.status_code == 303
    assert 'id="mcp-gone"' not in await site.page("/admin/mcp")
    # The built-in one stays: the service's refusal is shown.
    answer = await site.post("/admin/mcp/servers/llmgw:admin/remove", "admin")
    assert answer.status_code == 409 and "ctl mcp off llmgw:admin" in answer.text


async def test_a_form_without_its_token_changes_nothing(site: Site) -> None:
    headers = site.as_("admin")
    answer = await site.client.post(
        "/admin/mcp/servers/llmgw:admin/off", data={"csrf": "old"}, headers=headers
    )
    assert answer.status_code == 403
    assert site.cp.mcp.registry.servers["llmgw:admin"].enabled


async def test_the_mcp_page_speaks_turkish(site: Site) -> None:
    headers = {**site.as_("admin"), "accept-language": "tr-TR,tr;q=0.9"}
    mcp = html.unescape((await site.client.get("/admin/mcp", headers=headers)).text)
    assert "MCP araç sunucuları" in mcp and "Bir ajanı /mcp'ye yöneltin" in mcp
