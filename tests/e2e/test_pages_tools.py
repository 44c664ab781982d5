"""The guard and MCP pages in a real browser, on the pages' cluster, and llmgw:admin
through the gateway's /mcp with the SDK's client.

The guard page: a policy added through its form, listed with what it does, taken by a
key (``ctl keys limits --guard``), and removed; the page in Turkish. The MCP page: a
server added with a bearer token (kept sealed: in no page, no audit entry), llmgw:admin
tested with its tools listed, an unreachable server's test failing in words, the server
removed. No console error, no refused script or style (CSP). Then a key granted
``llmgw:admin.*`` reads the cluster's real node, its status and its agent's log."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from playwright.sync_api import Browser, expect

from tests.e2e.catalog import ctl_json
from tests.e2e.pages import Site, shoot, sign_in, watch_console

TOKEN = "page-bearer-5e7c-never-shown"


def test_guard_page_adds_lists_and_removes_a_policy(
    pages_site: Site, pages_browser: Browser
) -> None:
    site, browser = pages_site, pages_browser
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    errors = watch_console(page)
    sign_in(site, page)
    page.wait_for_url(f"{site.base}/admin")
    page.click("nav >> text=Guard")
    page.wait_for_url(f"{site.base}/admin/guard")
    form = page.locator("#guard-add")
    form.locator("input[name=name]").fill("page-pii")
    form.locator("select[name=pii]").select_option("block")
    form.locator("select[name=injection]").select_option("flag")
    form.locator("input[name=wait_ms]").fill("750")
    form.locator("button[type=submit]").click()
    row = page.locator("#policy-page-pii")
    expect(row).to_contain_text("pattern rules only")
    expect(row).to_contain_text("750 ms")
    # What the page added is the policy the API and ctl see.
    (policy,) = [
        p for p in ctl_json(site.cluster, "guard", "policy", "list") if p["name"] == "page-pii"
    ]
    assert (policy["pii"], policy["injection"], policy["wait_ms"]) == ("block", "flag", 750)
    made = ctl_json(site.cluster, "keys", "create", "--name", "guarded-key")
    ctl_json(site.cluster, "keys", "limits", made["id"], "--guard", "page-pii")
    shoot(site, page, "guard")

    page.goto(f"{site.base}/admin/lang/tr?next=/admin/guard")
    expect(page.locator("h2").first).to_have_text("Politikalar")
    page.goto(f"{site.base}/admin/lang/en?next=/admin/guard")

    # A judge not in the catalog: the service's refusal, shown, nothing added.
    form.locator("input[name=name]").fill("judged")
    form.locator("input[name=judge]").fill("no-such-model")
    form.locator("button[type=submit]").click()
    expect(page.locator("main")).to_contain_text("no model named no-such-model")
    page.goto(f"{site.base}/admin/guard")
    expect(page.locator("#policy-judged")).to_have_count(0)

    page.locator("#remove-page-pii").click()
    page.wait_for_url(f"{site.base}/admin/guard")
    expect(page.locator("#policy-page-pii")).to_have_count(0)
    context.close()
    assert errors == [], errors


def test_mcp_page_adds_tests_and_removes_a_server(pages_site: Site, pages_browser: Browser) -> None:
    site, browser = pages_site, pages_browser
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    errors = watch_console(page)
    sign_in(site, page)
    page.wait_for_url(f"{site.base}/admin")
    page.click("nav >> text=MCP")
    page.wait_for_url(f"{site.base}/admin/mcp")
    expect(page.locator("#mcp-llmgw-admin")).to_contain_text("in the control plane")
    expect(page.locator("#mcp-endpoint")).to_contain_text(f"{site.base}/mcp")

    form = page.locator("#mcp-add")
    form.locator("input[name=name]").fill("page-tickets")
    form.locator("input[name=url]").fill("http://127.0.0.1:9/mcp")
    form.locator("input[name=bearer]").fill(TOKEN)
    form.locator("input[name=rate]").fill("7")
    form.locator("button[type=submit]").click()
    row = page.locator("#mcp-page-tickets")
    expect(row).to_contain_text("Authorization sealed")
    expect(row).to_contain_text("7/min per caller")
    assert TOKEN not in page.content()
    shoot(site, page, "mcp")

    page.locator("#test-llmgw-admin").click()
    expect(page.locator("#mcp-tested")).to_contain_text("with 6 tools")
    expect(page.locator("#mcp-tested")).to_contain_text("llmgw:admin.explain_placement")
    # Nothing listens there: the test says how it failed, in the service's words.
    page.locator("#test-page-tickets").click()
    expect(page.locator("#mcp-tested")).to_contain_text("Failed (connect)")

    page.locator("#remove-page-tickets").click()
    page.wait_for_url(f"{site.base}/admin/mcp")
    expect(page.locator("#mcp-page-tickets")).to_have_count(0)
    context.close()
    assert errors == [], errors
    audit = json.dumps(site.cluster.api("/api/v1/audit"))
    assert "mcp.add" in audit and TOKEN not in audit


async def admin_calls(url: str, key: str) -> tuple[Any, Any, Any]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            nodes = await client.call_tool("llmgw:admin.list_nodes", {})
            status = await client.call_tool("llmgw:admin.cluster_status", {})
            logs = await client.call_tool(
                "llmgw:admin.node_logs", {"node": "page-node", "lines": 5}
            )
            return nodes, status, logs


def test_llmgw_admin_lists_the_real_node_through_mcp(pages_site: Site) -> None:
    site = pages_site
    made = ctl_json(site.cluster, "keys", "create", "--name", "admin-tools-key")
    ctl_json(site.cluster, "keys", "limits", made["id"], "--tools", "llmgw:admin.*")
    # The SDK's client on a loop of its own: the pages' browser keeps one in this thread.
    with ThreadPoolExecutor(1) as pool:
        nodes, status, logs = pool.submit(
            asyncio.run, admin_calls(f"{site.base}/mcp", made["key"])
        ).result(timeout=60)
    assert not nodes.is_error, nodes
    (node,) = [n for n in nodes.structured_content["nodes"] if n["id"] == site.node]
    assert node["state"] == "Ready" and node["connected"] is True
    assert node["memory_total"] and node["memory_total"] > 0
    assert [s["model"] for s in node["serves"]] == ["tiny"]
    # The text block carries the same JSON, for a client that reads text only.
    assert json.loads(nodes.content[0].text) == nodes.structured_content
    assert status.structured_content["nodes"]["ready"] >= 1
    assert status.structured_content["plane"]["leader"] is True
    assert not logs.is_error, logs
    assert 0 < len(logs.structured_content["lines"]) <= 5
