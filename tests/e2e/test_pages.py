"""The admin pages in a real browser: Playwright driving Debian's chromium against a real
control plane, an agent and llama-server serving the tiny model, all on loopback.

One cluster and one browser for the module. Screenshots of every page at 1440x900 and
390x844 go to ``$LLMGW_SCREENSHOTS`` (default: the test's own temporary directory).
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.catalog import SCHEDULING, ctl_json, serve_tiny
from tests.e2e.cluster import Cluster
from tests.support.browser import launched

SIZES = {"desktop": (1440, 900), "phone": (390, 844)}


@dataclass
class Site:
    cluster: Cluster
    base: str
    node: str
    shots: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("pages")
    cluster = Cluster(root)
    cluster.init()
    config = cluster.data_dir / "server.yaml"
    # Engine ports of its own: no other test's engine can hold them.
    config.write_text(config.read_text() + SCHEDULING.replace("42100-42199", "42600-42649"))
    cluster.start_server()
    try:
        serve_tiny(cluster, binary, "page-node")
        shots = Path(os.environ.get("LLMGW_SCREENSHOTS") or root / "screens")
        shots.mkdir(parents=True, exist_ok=True)
        yield Site(cluster, f"http://{cluster.listen}", "page-node", shots)
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launched() as b:
        yield b


def sign_in(site: Site, page: Page, token: str | None = None) -> None:
    page.goto(f"{site.base}/admin")
    assert "/admin/login" in page.url
    page.fill("#token", token or site.cluster.admin_token)
    page.click("button[type=submit]")


def watch_console(page: Page) -> list[str]:
    """Errors the page logs (a CSP refusal is one) and files it failed to load; a page
    answered with an error status (a refused sign-in's 401) is the test's to check."""
    errors: list[str] = []

    def console(message: Any) -> None:
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            errors.append(message.text)

    def response(answer: Any) -> None:
        if answer.status >= 400 and answer.request.resource_type != "document":
            errors.append(f"{answer.status} {answer.url}")

    page.on("console", console)
    page.on("response", response)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def shoot(site: Site, page: Page, name: str) -> None:
    for size, (width, height) in SIZES.items():
        page.set_viewport_size({"width": width, "height": height})
        page.screenshot(path=str(site.shots / f"{name}-{size}.png"), full_page=True)
    page.set_viewport_size({"width": 1440, "height": 900})


def test_sign_in_every_page_a_key_and_sign_out(site: Site, browser: Browser) -> None:
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


def test_pages_speak_turkish_when_asked(site: Site, browser: Browser) -> None:
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


class Client:
    """Plain HTTP with a cookie jar, redirects not followed."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()

        class Keep(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), Keep()
        )

    def send(self, path: str, form: dict[str, str] | None = None) -> tuple[int, Message, str]:
        """Status, headers (their names in any case) and body."""
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        ask = urllib.request.Request(self.base + path, data=data)
        try:
            with self.opener.open(ask, timeout=10) as answer:
                return answer.status, answer.headers, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read().decode()


def test_a_change_needs_its_form_token(site: Site) -> None:
    """(Every page without a session goes to sign-in: tests/server/api/test_authorisation.py
    walks them in-process.)"""
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


def test_failed_sign_ins_are_limited_per_address(site: Site) -> None:
    client = Client(site.base)
    statuses = [client.send("/admin/login", {"token": f"wrong-{i}"})[0] for i in range(5)]
    assert statuses == [401] * 5
    status, headers, body = client.send("/admin/login", {"token": site.cluster.admin_token})
    assert status == 429 and int(headers.get("Retry-After", "0")) > 0
    assert "Too many failed sign-ins" in body
