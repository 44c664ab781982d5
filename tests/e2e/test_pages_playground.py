"""The playground in a real browser: a gateway key pasted into the page lists exactly
the models it may use (from /v1/models, as a client would see them), a wrong key shows
the gateway's own error, and a message streams an answer from the tiny model through
/v1 with its tokens, time to first token and tokens a second."""

from __future__ import annotations

import re

from playwright.sync_api import Browser, Page, expect

from tests.e2e.catalog import ctl_json
from tests.e2e.pages import Site, shoot, sign_in, watch_console


def use_key(page: Page, key: str) -> None:
    page.fill("#play-token", key)
    page.click("#play-key button[type=submit]")


def options(page: Page) -> list[str]:
    return list(page.locator("#play-model option").evaluate_all("os => os.map(o => o.value)"))


def test_playground_lists_a_keys_models_and_streams_an_answer(
    pages_site: Site, pages_browser: Browser
) -> None:
    site, browser = pages_site, pages_browser
    tiny = ctl_json(site.cluster, "keys", "create", "--name", "play", "--models", "tiny")["key"]
    none = ctl_json(site.cluster, "keys", "create", "--name", "play-none", "--models", "nothing*")[
        "key"
    ]
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    errors = watch_console(page)
    sign_in(site, page)
    page.wait_for_url(f"{site.base}/admin")
    page.click("nav >> text=Playground")
    page.wait_for_url(f"{site.base}/admin/playground")
    expect(page.locator("#playground")).to_be_visible()  # the script ran: no <noscript>
    status = page.locator("#play-status")

    # A wrong key: the gateway's own words, and no model to pick.
    use_key(page, "sk-llmgw-not-a-key")
    expect(status).to_have_text(re.compile("the API key is not valid"))
    expect(status).to_have_class(re.compile(r"\berror\b"))
    assert options(page) == []
    expect(page.locator("#play-go")).to_be_disabled()

    # A key allowed only models no one serves: an empty list, said in words.
    use_key(page, none)
    expect(status).to_have_text("This key may use no model.")
    assert options(page) == []
    expect(page.locator("#play-model")).to_be_disabled()

    # A key allowed only tiny: exactly tiny.
    use_key(page, tiny)
    expect(page.locator("#play-model")).to_be_enabled()
    assert options(page) == ["tiny"]
    expect(page.locator("#play-go")).to_be_enabled()

    expect(page.locator("#play-max")).to_have_value("256")
    page.fill("#play-max", "24")  # the tiny model's context is short: room for two turns
    page.fill("#play-input", "hello")
    page.click("#play-go")
    expect(page.locator(".play-user .play-text")).to_have_text("hello")
    answer = page.locator(".play-assistant .play-text")
    expect(answer).not_to_be_empty()
    expect(status).to_have_text("Done.")
    expect(page.locator("#play-completion")).to_have_text(re.compile(r"^[1-9]\d*$"))
    expect(page.locator("#play-prompt")).to_have_text(re.compile(r"^[1-9]\d*$"))
    expect(page.locator("#play-ttft")).to_have_text(re.compile(r"^\d+ ms$"))
    expect(page.locator("#play-rate")).to_have_text(re.compile(r"^(\d+(\.\d)?|not read)$"))
    expect(page.locator("#play-stop")).to_be_disabled()
    expect(page.locator("#play-go")).to_be_enabled()
    shoot(site, page, "playground")

    # The key never reaches the control plane's pages: it is in no URL and no cookie.
    assert tiny not in page.url
    assert all(tiny not in c["value"] for c in context.cookies())

    # A second turn carries the conversation; Clear empties it.
    page.fill("#play-input", "and again")
    page.click("#play-go")
    expect(page.locator(".play-assistant .play-text")).to_have_count(2)
    expect(status).to_have_text("Done.")
    expect(page.locator(".play-assistant .play-text").nth(1)).not_to_be_empty()
    page.click("#play-clear")
    expect(page.locator("#play-log .play-msg")).to_have_count(0)
    expect(page.locator("#play-completion")).to_have_text("—")

    # The wrong key's 401 from /v1/models is the one failed request the page made.
    assert [e for e in errors if e != f"401 {site.base}/v1/models"] == []
    context.close()


def test_playground_says_it_needs_javascript(pages_site: Site, pages_browser: Browser) -> None:
    site, browser = pages_site, pages_browser
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(f"{site.base}/admin/login?next=/admin/playground")
    page.fill("#token", site.cluster.admin_token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.base}/admin/playground")
    # Chromium's switch stops scripts but still parses <noscript> as if they ran, so
    # its words are read from the page as sent; the playground itself stays hidden.
    noscript = page.locator("main noscript")
    expect(noscript).to_have_count(1)
    assert "The playground needs JavaScript" in noscript.inner_html()
    expect(page.locator("#playground")).to_be_hidden()
    expect(page.locator("h1")).to_have_text("Playground")
    context.close()
