"""The guard page in a real browser, on the pages' cluster: a policy added through its
form, listed with what it does, taken by a key (``ctl keys limits --guard``), and
removed; the page in Turkish; no console error, no refused script or style (CSP)."""

from __future__ import annotations

from playwright.sync_api import Browser, expect

from tests.e2e.catalog import ctl_json
from tests.e2e.pages import Site, shoot, sign_in, watch_console


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
