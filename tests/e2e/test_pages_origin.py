"""A page change sent by another site's page is refused, in a real browser.

SameSite=Strict keeps the session cookie from other sites, but a page on another port
of the same host is the same *site*: chromium sends the cookie with its form. Here such
a page holds a form with a valid CSRF token (as if one had leaked) and posts it to the
control plane; the Origin check refuses it (403) and no key is made.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.catalog import ctl_json
from tests.e2e.pages import Site, sign_in

pytestmark = pytest.mark.e2e


class Elsewhere:
    """Another origin on this host (another port) serving one page."""

    def __init__(self) -> None:
        self.page = b""
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(owner.page)))
                self.end_headers()
                self.wfile.write(owner.page)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def elsewhere() -> Iterator[Elsewhere]:
    served = Elsewhere()
    try:
        yield served
    finally:
        served.close()


def test_a_form_posted_by_another_origins_page_is_refused(
    pages_site: Site, pages_browser: Browser, elsewhere: Elsewhere
) -> None:
    site = pages_site
    assert site.base.startswith("http://127.0.0.1:")  # the same site as `elsewhere`
    context = pages_browser.new_context()
    page = context.new_page()
    sign_in(site, page)
    page.wait_for_url(f"{site.base}/admin")
    page.goto(f"{site.base}/admin/keys")
    token = page.locator("form.create input[name=csrf]").get_attribute("value")
    assert token
    elsewhere.page = (
        f'<!doctype html><form method="post" action="{site.base}/admin/keys">'
        f'<input name="csrf" value="{token}"><input name="name" value="from-elsewhere">'
        '<button type="submit">go</button></form>'
    ).encode()
    page.goto(elsewhere.base)
    with page.expect_response(f"{site.base}/admin/keys") as answered:
        page.click("button[type=submit]")
    assert answered.value.status == 403
    expect(page.locator("main")).to_contain_text("nothing was changed")
    expect(page.locator("main")).to_contain_text(elsewhere.base)
    names = {k["name"] for k in ctl_json(site.cluster, "keys", "list")}
    assert "from-elsewhere" not in names
    # The session is still good on the site's own pages: the same form there is taken.
    page.goto(f"{site.base}/admin/keys")
    page.fill("form.create input[name=name]", "from-here")
    page.click("form.create button[type=submit]")
    expect(page.locator("#new-key")).to_contain_text("sk-llmgw-")
    assert "from-here" in {k["name"] for k in ctl_json(site.cluster, "keys", "list")}
    context.close()
