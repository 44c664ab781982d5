"""The admin pages' end-to-end support: one cluster serving the tiny model and one
browser for every page test of the session (fixtures ``pages_site``, ``pages_browser``
in conftest.py), and what the tests do with them.

Screenshots of every page at 1440x900 and 390x844 go to ``$LLMGW_SCREENSHOTS`` (default:
the cluster's temporary directory, ``screens/``).
"""

from __future__ import annotations

import http.cookiejar
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

from tests.e2e.catalog import SCHEDULING, serve_tiny
from tests.e2e.cluster import Cluster, engine_ports

SIZES = {"desktop": (1440, 900), "phone": (390, 844)}


@dataclass
class Site:
    cluster: Cluster
    base: str
    node: str
    shots: Path


def running_site(root: Path, binary: Path) -> Iterator[Site]:
    """A control plane, an agent and llama-server serving ``tiny``; stopped after."""
    cluster = Cluster(root)
    cluster.init()
    config = cluster.data_dir / "server.yaml"
    # Engine ports of its own, apart from the other tests' of this worker and every
    # other worker's: no other test's engine holds them.
    scheduling = SCHEDULING.replace(engine_ports(1), engine_ports(2))
    config.write_text(config.read_text() + scheduling)
    cluster.start_server()
    try:
        serve_tiny(cluster, binary, "page-node")
        shots = Path(os.environ.get("LLMGW_SCREENSHOTS") or root / "screens")
        shots.mkdir(parents=True, exist_ok=True)
        yield Site(cluster, f"http://{cluster.listen}", "page-node", shots)
    finally:
        cluster.stop()


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
