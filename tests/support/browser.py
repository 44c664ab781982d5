"""A real browser for tests: Playwright's sync API driving Debian's ``/usr/bin/chromium``
(the ``chromium`` package, which ``make test`` installs), headless. Playwright's own
browser downloads (``playwright install``) are not used.

``chromium_path()`` finds the executable; ``launched()`` is a context manager that yields a
launched ``playwright.sync_api.Browser`` and closes it (and Playwright's driver) on exit::

    def test_page() -> None:  # a plain sync test: see below
        with launched() as browser:
            page = browser.new_page()
            page.goto(url)

The sync API refuses to start inside a running asyncio event loop, so a test using it must
be a plain ``def`` test (not ``async def``) with no async fixtures in its chain that keep a
loop running around it; under this repository's ``asyncio_mode = "auto"`` a sync test
function runs outside any loop. A server under test that needs a loop should run in a
thread (or a subprocess) of its own, started by a sync fixture.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, expect, sync_playwright

DEBIAN_CHROMIUM = Path("/usr/bin/chromium")

# As root there is no user namespace sandbox to use; /dev/shm may be small in containers.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage"]


def chromium_path() -> str:
    """The chromium executable: Debian's /usr/bin/chromium, else ``chromium`` on PATH."""
    if DEBIAN_CHROMIUM.is_file():
        return str(DEBIAN_CHROMIUM)
    found = shutil.which("chromium")
    if found is None:
        raise RuntimeError(
            "chromium not found (neither /usr/bin/chromium nor on PATH): the browser tests "
            "use Debian's `chromium` package, which `make test` installs "
            "(or: apt-get install --no-install-recommends chromium)"
        )
    return found


@contextmanager
def launched(*, timeout_ms: float = 30_000) -> Iterator[Browser]:
    """A headless chromium driven by Playwright's sync API, closed on exit."""
    executable = chromium_path()
    # What a page is expected to show, it shows within 15 s: Playwright's 5 s is short
    # for a tiny model's answer on 2 cores that run four test workers.
    expect.set_options(timeout=15_000)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            timeout=timeout_ms,
        )
        try:
            yield browser
        finally:
            browser.close()
