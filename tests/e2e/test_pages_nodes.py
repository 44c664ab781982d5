"""Every node's page and its live part (the ``#node`` fragment htmx polls every 5 s) in
a real browser, for every node shape there is: real agents whose ``nvidia-smi`` is a
stand-in answering from each shared capture (``tests/support/smicaptures.py``: 8x H100
and 4x GB200 in an NVLink domain from ``-q -x``, an A100 with MIG on, two RTX A5000, an
RTX 4090, 8x H100 and an H100's MIG instances from the plain ``-q``, an H200 from the
CSV query, and a card with every figure ``[N/A]``), a node with no cards and one whose
``nvidia-smi`` fails; then the recorded 64-node fleet (``tests/support/fleet64.py``),
served from this process (``tests/support/pagesserver.py``).

A page fails the test by any answer of 500 or more (the page, its live part, its
history), any error the browser logs, or a card shown with a figure it did not read.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Response, expect

from llmgw.server.sessions import COOKIE
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.pages import Site, sign_in, watch_console
from tests.support import fleet64
from tests.support.pagesserver import serving
from tests.support.smicaptures import SHAPES, Shape, install

NO_CARDS = "no-cards"  # no nvidia-smi on its PATH: a CPU node
FAILING = "smi-fails"  # an nvidia-smi that fails every command (exit 9)
# Every page that lists or draws nodes or cards, besides a node's own.
FLEET_PAGES = (
    "/admin",
    "/admin/nodes",
    "/admin/nodes?sort=cards",
    *(f"/admin/gpus?by={by}" for by in ("work", "busy", "memory", "temperature", "power")),
    "/admin/nvlink",
    "/admin/fabrics",
)
# A node page polls its live part every 5 s: this many are open at once.
TABS = 16


@dataclass
class Opened:
    node: str
    page: Page
    errors: list[str]
    polled: list[Response]


@pytest.fixture(scope="module")
def shapes_cluster(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> Iterator[Cluster]:
    """A control plane and one agent per card shape, each Ready with its cards. Each
    agent is given the built llama-server, as the pages' own cluster's is, so none tries
    to download one."""
    root = tmp_path_factory.mktemp("node-shapes")
    cluster = Cluster(root)
    cluster.init()
    cluster.start_server()
    try:
        # The first agent measures this machine's memory read rate (seconds of every
        # core); the others find it in their state folder, as a restarted agent does.
        engine = ["--engine", f"llama.cpp={binary}"]
        cluster.start_agent(NO_CARDS, cluster.token(), engine)
        measured = cluster.state_dir(NO_CARDS) / "memrate.json"
        wait_for(measured.is_file, 60, "the first agent's memory read rate")
        path = os.environ["PATH"]
        started = [*((s, s.name) for s in SHAPES), (Shape(FAILING, {}, 0, ""), FAILING)]
        for shape, node in started:
            install(shape, root / "bin" / node)
            cluster.state_dir(node).mkdir()
            shutil.copy(measured, cluster.state_dir(node) / measured.name)
            env = {**os.environ, "PATH": f"{root / 'bin' / node}:{path}"}
            cluster.start_agent(node, cluster.token(), engine, env=env)
        yield cluster
    finally:
        cluster.stop()


def cards_read(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Every node, once each is Ready and every shape's cards are in its figures."""
    deadline = time.monotonic() + 90
    while True:
        nodes = cluster.nodes()
        short = [
            f"{name}: {node and node['state']}, {node and len(node['gpus'])} card(s)"
            for shape in [*SHAPES, Shape(NO_CARDS, {}, 0, ""), Shape(FAILING, {}, 0, "")]
            for name, node in [(shape.name, nodes.get(shape.name))]
            if node is None or node["state"] != "Ready" or len(node["gpus"]) != shape.cards
        ]
        if not short:
            return nodes
        if time.monotonic() > deadline:
            raise AssertionError(f"after 90 s, nodes not Ready with their cards: {short}")
        time.sleep(0.5)


def open_node(context: BrowserContext, base: str, node: str) -> Opened:
    page = context.new_page()
    errors = watch_console(page)
    url = f"{base}/admin/nodes/{node}"
    polled: list[Response] = []
    page.on(
        "response",
        lambda r: (
            polled.append(r)
            if r.url == url and r.request.headers.get("hx-request") == "true"
            else None
        ),
    )
    answer = page.goto(url)
    assert answer is not None and answer.status == 200, f"{url}: {answer and answer.status}"
    expect(page.locator("h1")).to_contain_text(node)
    # Marks the live part as loaded; htmx's swap (outerHTML) puts a new one in its place.
    page.evaluate("document.getElementById('node').dataset.loaded = 'first'")
    return Opened(node, page, errors, polled)


def walk_nodes(context: BrowserContext, base: str, nodes: list[str]) -> dict[str, Page]:
    """Open each node's page, a few at a time, and wait for its live part to be polled
    and swapped in; fail on any 5xx or logged error. The pages, still open, by node."""
    shown: dict[str, Page] = {}
    for first in range(0, len(nodes), TABS):
        batch = [open_node(context, base, n) for n in nodes[first : first + TABS]]
        deadline = time.monotonic() + 20
        for opened in batch:
            while not opened.polled and time.monotonic() < deadline:
                opened.page.wait_for_timeout(100)
            assert opened.polled, f"{opened.node}: its live part was not polled in 20 s"
            status = opened.polled[0].status
            assert status == 200, f"{opened.node}: its live part answered {status}"
            # The fragment was swapped in (and htmx logged nothing doing it).
            opened.page.wait_for_function("!document.getElementById('node').dataset.loaded")
            expect(opened.page.locator("#node")).to_contain_text("Cards")
            expect(opened.page.locator(".charts .chart").first).to_be_visible()
            assert opened.errors == [], f"{opened.node}: {opened.errors}"
            shown[opened.node] = opened.page
    return shown


def card_rows(page: Page) -> list[list[str]]:
    """The cards table of a node's page: each row's cells' text."""
    table = page.locator("#node article.wide").first.locator("tbody tr")
    return [row.locator("td").all_inner_texts() for row in table.all()]


def walk_fleet_pages(context: BrowserContext, base: str, paths: tuple[str, ...]) -> None:
    page = context.new_page()
    errors = watch_console(page)
    for path in paths:
        answer = page.goto(base + path)
        assert answer is not None and answer.status == 200, f"{path}: {answer and answer.status}"
    assert errors == [], errors
    page.close()


def test_every_card_shape_from_the_captures_renders_its_node_page(
    shapes_cluster: Cluster, pages_browser: Browser
) -> None:
    cluster = shapes_cluster
    nodes = cards_read(cluster)
    assert nodes[NO_CARDS]["gpus"] == [] and nodes[FAILING]["gpus"] == []
    assert any(w.startswith("nvidia-smi:") for w in nodes[FAILING]["warnings"])

    context = pages_browser.new_context(viewport={"width": 1440, "height": 900})
    login = context.new_page()
    base = f"http://{cluster.listen}"
    sign_in(Site(cluster, base, NO_CARDS, cluster.root), login)
    login.wait_for_url(f"{base}/admin")
    shown = walk_nodes(context, base, [s.name for s in SHAPES] + [NO_CARDS, FAILING])
    walk_fleet_pages(context, base, FLEET_PAGES)

    for shape in SHAPES:
        rows = card_rows(shown[shape.name])
        assert len(rows) == shape.cards, (shape.name, rows)
        assert all(row[1].startswith(shape.model) for row in rows), (shape.name, rows)
    # A MIG instance is a card of its own, named by its class.
    mig = [row[1] for row in card_rows(shown["h100-mig-text"])]
    assert mig[0] == "h100-80g-mig-3g.40gb", mig
    # Every figure absent: each shown as not read, none as a zero.
    (unread,) = card_rows(shown["unread-csv"])
    assert unread[2:] == ["not read"] * 4, unread
    # utilization.gpu is "busy" on every page, as in the console and docs/telemetry.md.
    heads = shown["h100x8-xml"].locator("#node article.wide").first.locator("th")
    assert heads.all_inner_texts()[:3] == ["Card", "Model", "Busy"]
    login.goto(f"{base}/admin")
    expect(login.locator("#overview")).to_contain_text("Mean busy")
    for node in (NO_CARDS, FAILING):
        expect(shown[node].locator("#node")).to_contain_text("No cards.")
    expect(shown[FAILING].locator("#node .alerts")).to_contain_text("nvidia-smi: failed (exit 9)")
    context.close()


def test_every_node_of_the_recorded_fleet_renders_its_node_page(pages_browser: Browser) -> None:
    maps = fleet64.fabric_maps()
    with serving(maps) as served:
        context = pages_browser.new_context(viewport={"width": 1440, "height": 900})
        context.add_cookies(
            [{"name": COOKIE, "value": served.session, "url": f"{served.base}/admin"}]
        )
        shown = walk_nodes(context, served.base, list(fleet64.NODES))
        # Not the overview: it reads the catalog and the gateway, which this fleet has none
        # of (tests/server/pages/test_fleetpages.py counts its figures over 100 nodes).
        walk_fleet_pages(context, served.base, FLEET_PAGES[1:])
        assert len(card_rows(shown["nvl-13"])) == fleet64.GB200_CARDS
        assert len(card_rows(shown["a-07"])) == fleet64.H100_CARDS
        context.close()
