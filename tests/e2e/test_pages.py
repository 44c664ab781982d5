"""The admin pages in a real browser: Playwright driving Debian's chromium against a real
control plane, an agent and llama-server serving the tiny model, all on loopback (one
cluster and one browser for every page test: ``pages_site``, ``pages_browser``).

Every page without a session, and the limit on failed sign-ins, are walked in-process
(tests/server/api/test_authorisation.py, tests/server/pages/).
"""

from __future__ import annotations

import re

from playwright.sync_api import Browser, expect

from tests.e2e.catalog import ctl_json
from tests.e2e.pages import Client, Site, shoot, sign_in, watch_console


def test_sign_in_every_page_a_key_and_sign_out(pages_site: Site, pages_browser: Browser) -> None:
    site, browser = pages_site, pages_browser
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    errors = watch_console(page)

    sign_in(site, page, "not-the-token")
    expect(page.locator(".error")).to_contain_text("not an admin token")
    assert "/admin/login" in page.url
    shoot(site, page, "login")

    page.fill("#token", site.cluster.admin_token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.base}/admin")
    overview = page.locator("#overview")
    expect(overview).to_contain_text("Serving")
    expect(overview).to_contain_text("tiny")
    expect(overview).to_contain_text("Ready")
    # The gateway's last hour, drawn by uPlot from /admin/gateway.json.
    expect(page.locator(".charts[data-gateway] .chart").first).to_be_visible()
    shoot(site, page, "overview")

    page.click("nav >> text=Nodes")
    expect(page.locator("table.nodes")).to_contain_text(site.node)
    page.fill("#q", "no-such-node")
    expect(page.locator("#nodes")).to_contain_text("No node matches.")
    page.fill("#q", site.node)
    expect(page.locator("table.nodes")).to_contain_text(site.node)
    shoot(site, page, "nodes")

    page.click(f"table.nodes >> text={site.node}")
    expect(page.locator("#node")).to_contain_text("llama.cpp")
    expect(page.locator("#node")).to_contain_text("tiny")  # its shard
    expect(page.locator(".charts .chart").first).to_be_visible()  # uPlot drew the hour
    shoot(site, page, "node")

    page.click("nav >> text=Models")
    expect(page.locator("table.models")).to_contain_text("tiny")
    page.click("table.models >> text=tiny")
    expect(page.locator("#model")).to_contain_text(site.node)  # explain: its verdict
    shoot(site, page, "model")

    page.click("nav >> text=Keys")
    page.fill("input[name=name]", "browser-key")
    page.fill("input[name=models]", "tiny")
    page.click("form.create button[type=submit]")
    key = page.locator("#new-key").inner_text().strip()
    assert key.startswith("sk-llmgw-")
    shoot(site, page, "keys")
    row = page.locator("table.keys tr", has_text="browser-key")
    expect(row).to_contain_text("active")
    # Shown once: the next view of the page has the key's name, never the key.
    page.goto(f"{site.base}/admin/keys")
    assert key not in page.content()
    keys = {k["name"]: k for k in ctl_json(site.cluster, "keys", "list")}
    assert keys["browser-key"]["models"] == ["tiny"]
    page.locator("table.keys tr", has_text="browser-key").locator("button.danger").click()
    expect(page.locator("table.keys tr", has_text="browser-key")).to_contain_text("revoked")
    assert {k["name"]: k for k in ctl_json(site.cluster, "keys", "list")}["browser-key"][
        "state"
    ] == "revoked"

    page.click("nav >> text=Audit log")
    expect(page.locator("table.audit")).to_contain_text("key.revoke")
    expect(page.locator("table.audit")).to_contain_text("admin.sign_in")
    shoot(site, page, "audit")

    page.click("text=Sign out")
    page.wait_for_url(re.compile(r".*/admin/login$"))
    page.goto(f"{site.base}/admin/keys")
    assert "/admin/login" in page.url
    assert errors == [], f"the pages logged errors (a CSP refusal?): {errors}"
    context.close()


def test_pages_speak_turkish_when_asked(pages_site: Site, pages_browser: Browser) -> None:
    site, browser = pages_site, pages_browser
    context = browser.new_context(locale="tr-TR", extra_http_headers={"Accept-Language": "tr"})
    page = context.new_page()
    page.goto(f"{site.base}/admin")
    expect(page.locator("h1")).to_have_text("Oturum aç")
    page.fill("#token", site.cluster.admin_token)
    page.click("button[type=submit]")
    expect(page.locator("nav")).to_contain_text("Düğümler")
    page.click("a[lang=en]")
    expect(page.locator("nav")).to_contain_text("Nodes")
    context.close()


def test_a_change_needs_its_form_token(pages_site: Site) -> None:
    site = pages_site
    keys_before = len(ctl_json(site.cluster, "keys", "list"))
    signed = Client(site.base)
    status, headers, _ = signed.send("/admin/login", {"token": site.cluster.admin_token})
    assert status == 303 and headers.get("Location") == "/admin"
    status, _, body = signed.send("/admin/keys", {"name": "forged"})
    assert status == 403 and "form token" in body
    status, _, _ = signed.send(f"/admin/nodes/{site.node}/cordon", {"csrf": "forged"})
    assert status == 403
    status, _, _ = signed.send("/admin/models/tiny/stop", {})
    assert status == 403
    assert len(ctl_json(site.cluster, "keys", "list")) == keys_before
    assert not site.cluster.nodes()[site.node]["cordoned"]
    assert not site.cluster.api("/api/v1/models/tiny")["stopped"]


def test_serve_with_the_estimate_scale_and_follow_the_nodes_log(
    pages_site: Site, pages_browser: Browser
) -> None:
    site = pages_site
    context = pages_browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    errors = watch_console(page)
    sign_in(site, page)
    page.wait_for_url(f"{site.base}/admin")

    # The agent's log, open before the agent writes of the model served below.
    log = context.new_page()
    log_errors = watch_console(log)
    log.goto(f"{site.base}/admin/nodes/{site.node}/log")
    expect(log.locator("pre.log")).to_contain_text("registered with")
    assert "tiny-form" not in log.locator("pre.log").inner_text()

    page.goto(f"{site.base}/admin/models")
    source = str(site.cluster.root / "tiny.gguf")
    page.fill("#serve input[name=source]", source)
    page.fill("#serve input[name=name]", "tiny-form")
    page.fill("#serve input[name=context]", "256")
    page.click("#serve >> text=Estimate")
    estimate = page.locator("#plan")
    expect(estimate).to_contain_text("Fits on")
    expect(estimate.locator("table")).to_contain_text(site.node)
    shoot(site, page, "serve")
    page.click("#serve button[type=submit]")
    page.wait_for_url(f"{site.base}/admin/models/tiny-form")
    expect(page.locator("#model")).to_contain_text(source)

    # The agent starts it, and says so in the log page opened before: followed live.
    expect(log.locator("pre.log")).to_contain_text("tiny-form", timeout=20_000)
    shoot(site, log, "log")

    page.fill("input[name=replicas]", "0")
    page.click("text=Scale")
    page.wait_for_url(f"{site.base}/admin/models/tiny-form")
    shown = site.cluster.api("/api/v1/models/tiny-form")
    assert [p["replicas"] for p in shown["profiles"]] == [0]
    expect(page.locator("#model")).to_contain_text("Longest answer")

    # Removing asks for the model's name; a wrong one removes nothing.
    page.fill("form.remove input[name=confirm]", "tiny")
    page.click("form.remove button")
    expect(page.locator(".error")).to_contain_text("type the model's name, tiny-form")
    assert "tiny-form" in {m["name"] for m in site.cluster.api("/api/v1/models")}
    page.goto(f"{site.base}/admin/models/tiny-form")
    page.fill("form.remove input[name=confirm]", "tiny-form")
    page.click("form.remove button")
    page.wait_for_url(f"{site.base}/admin/models")
    assert "tiny-form" not in {m["name"] for m in site.cluster.api("/api/v1/models")}
    expect(page.locator("table.models")).not_to_contain_text("tiny-form")

    page.click("nav >> text=Replicas")
    expect(page.locator("table.replicas")).to_contain_text("tiny.default")
    expect(page.locator("table.replicas")).to_contain_text(site.node)
    shoot(site, page, "replicas")

    page.click("nav >> text=GPU map")
    expect(page.locator("#gpus")).to_contain_text("No cards.")  # a CPU-only node
    page.click("nav.figures >> text=temperature")
    expect(page.locator(".legend")).to_contain_text("30 °C")
    shoot(site, page, "gpus")
    assert errors == [] and log_errors == [], errors + log_errors
    context.close()
