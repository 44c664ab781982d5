"""The Slurm page and a node's Slurm part in a real browser (Debian's chromium through
Playwright), over a real control plane (its admin app and pages, its SQLite store,
``SlurmService`` and its keeper) served on loopback from a thread, with two fake agents
that report what Slurm says of them (``tests/server/slurm/fleet.py``): node b lent to
Slurm is shown lent, with its job; the lend form on node a sends it to Slurm (the
service's stage and audit say so, and the page shows it); node b's own page shows its
part and stage. A page fails the test by an error the browser logs or a file it could
not load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from llmgw.server.requests import SlurmNodes, SlurmSetup
from llmgw.wire.messages import SlurmJob
from tests.server.slurm.fleet import Plane
from tests.support.browser import launched
from tests.support.slurmplane import Served, served
from tests.support.wiring import ADMIN

JOB = SlurmJob(id="41", name="train", user="ayse", state="RUNNING", end=None)


async def a_and_b(plane: Plane) -> None:
    """Nodes a (slurmctld and slurmd) and b (slurmd) in Slurm's set, b lent with a job
    running."""
    cp = plane.cp
    for node, address in (("a", "127.0.0.1"), ("b", "127.0.0.2")):
        await plane.node(node, address)
        plane.slurm(node)
    slurm = cp.slurm.service
    await slurm.setup(SlurmSetup(controller="a", nodes=("a", "b")), ADMIN)
    await cp.slurm.keeper.pass_once()
    await slurm.lend(SlurmNodes(nodes=("b",)), ADMIN)
    # b runs no replica: the next pass makes it Slurm's, and its agent resumes it.
    await cp.slurm.keeper.pass_once()
    plane.slurm("b", state="MIXED", reason=None, jobs=[JOB], steps=1)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Served]:
    with served(tmp_path, a_and_b) as s:
        yield s


def watch(page: Page) -> list[str]:
    """Errors the page logs (a CSP refusal is one), and files it could not load."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "response",
        lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
    )
    return errors


def sign_in(site: Served, page: Page) -> None:
    page.goto(f"{site.base}/admin/slurm")
    assert "/admin/login" in page.url
    page.fill("#token", site.token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.base}/admin/slurm")


def test_a_lent_node_is_shown_and_the_lend_form_lends_another(site: Served) -> None:
    slurm = site.plane.cp.slurm.service
    assert slurm.stage_of("b") == "lent" and slurm.stage_of("a") == "serving"
    with launched() as browser:
        page = browser.new_page()
        errors = watch(page)
        sign_in(site, page)
        b = page.locator("#slurm-b")
        expect(b.locator("td.stage")).to_have_text("lent")
        expect(b).to_contain_text("MIXED")
        expect(b).to_contain_text("41 train · ayse · RUNNING")
        expect(page.locator("#slurm-a td.stage")).to_have_text("serving")
        expect(page.locator("#slurm-a")).to_contain_text("both")
        # The files, folded away until asked for.
        files = page.locator("#slurm-files")
        expect(files.locator("#file-slurm-conf")).not_to_be_visible()
        files.locator("summary").click()
        expect(files.locator("#file-slurm-conf")).to_contain_text("SlurmctldHost=a(127.0.0.1)")

        # An operator's form: a serving node offers lend, a lent one reclaim.
        expect(page.locator("#reclaim-b")).to_be_visible()
        expect(page.locator("#lend-b")).to_have_count(0)
        page.locator("#lend-a button").click()
        page.wait_for_url(f"{site.base}/admin/slurm")
        assert slurm.stage_of("a") in ("lending", "lent")
        stage = page.locator("#slurm-a td.stage")
        expect(stage).to_have_text(slurm.stage_of("a") or "")
        expect(page.locator("#lend-a")).to_have_count(0)
        entries = site.run(site.plane.cp.store.audit_log(limit=20))
        lends = [(e["actor"], e["detail"]) for e in entries if e["action"] == "slurm.lend"]
        # The first lend (b) the test's own; then a, by whoever signed in to the page.
        assert lends[0] == ("admin@127.0.0.1", "a"), lends

        # b's own page: its part and stage, and the form that takes it back.
        page.goto(f"{site.base}/admin/nodes/b")
        part = page.locator("#node-slurm")
        expect(part).to_contain_text("slurmd")
        expect(part.locator("dd.stage-lent")).to_have_text("lent")
        expect(part).to_contain_text("41 train · ayse")
        expect(page.locator("#reclaim-b")).to_be_visible()
        assert errors == []
