"""The Usage page in a real browser: one chat completion through /v1 with a new key,
then the page's table (by key and by model), its chart of tokens per day, its CSV file,
and a bad date shown as the page's error.

Usage is written by the gateway in batches; the API's usage handler, which the page runs
in-process, flushes them first, so the row is there without waiting.
"""

from __future__ import annotations

import csv
import io
import time

import openai
from playwright.sync_api import Browser, expect

from tests.e2e.catalog import ctl_json
from tests.e2e.pages import Client, Site, shoot, sign_in, watch_console


def test_usage_table_chart_and_csv(pages_site: Site, pages_browser: Browser) -> None:
    site, browser = pages_site, pages_browser
    made = ctl_json(site.cluster, "keys", "create", "--name", "usage-key")
    sdk = openai.OpenAI(base_url=f"{site.base}/v1", api_key=made["key"], max_retries=0)
    try:
        reply = sdk.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    finally:
        sdk.close()
    assert reply.usage is not None and reply.usage.total_tokens > 0

    context = browser.new_context(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    page = context.new_page()
    errors = watch_console(page)
    sign_in(site, page)
    page.wait_for_url(f"{site.base}/admin")
    page.click("nav >> text=Usage")
    page.wait_for_url(f"{site.base}/admin/usage")
    today = time.strftime("%Y-%m-%d", time.gmtime())
    expect(page.locator("input[name=to]")).to_have_value(today)
    expect(page.locator("table.usage")).to_contain_text(today)  # by day, the default

    page.select_option("select[name=by]", "key")
    page.click("form.usage-filter button[type=submit]")
    row = page.locator("table.usage tbody tr", has_text="usage-key")
    expect(row).to_contain_text(made["id"])
    total = int(row.locator("td").nth(4).inner_text())
    assert total >= reply.usage.total_tokens > 0
    assert "by=key" in page.url
    expect(page.locator(".usage-chart .chart")).to_be_visible()  # uPlot drew the days
    expect(page.locator(".usage-chart canvas")).to_have_count(1)
    expect(page.locator(".usage-chart .u-legend")).to_contain_text("tiny")
    shoot(site, page, "usage")

    with page.expect_download() as download_info:
        page.click("a.csv")
    download = download_info.value
    assert download.suggested_filename.startswith("llmgw-usage-")
    assert download.suggested_filename.endswith(f"-{today}.csv")
    lines = list(csv.reader(io.StringIO(download.path().read_text(encoding="utf-8"))))
    assert lines[0][:3] == ["day", "key_id", "key_name"]
    mine = [line for line in lines[1:] if line[1] == made["id"]]
    assert mine and mine[0][2] == "usage-key" and mine[0][3] == "tiny" and int(mine[0][8]) > 0

    page.select_option("select[name=by]", "model")
    page.click("form.usage-filter button[type=submit]")
    expect(page.locator("table.usage tbody tr", has_text="tiny")).to_be_visible()

    # A bad date: the page says which field, and nothing else breaks.
    page.goto(f"{site.base}/admin/usage?from=not-a-day")
    expect(page.locator("main")).to_contain_text("from: 'not-a-day' is not a date")
    page.goto(f"{site.base}/admin/usage?from=2026-02-01&to=2026-01-01")
    expect(page.locator("main")).to_contain_text("is after to")
    context.close()
    assert errors == [], errors

    # Without a session, the JSON and CSV are no more open than the page.
    status, headers, _ = Client(site.base).send("/admin/usage.csv")
    assert status == 303 and "/admin/login" in headers["location"]
