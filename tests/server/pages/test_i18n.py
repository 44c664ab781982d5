"""Every string a page shows has its Turkish; the language follows the switch, then the
browser."""

from __future__ import annotations

import re
from pathlib import Path

from llmgw.server.pages import i18n

PAGES = Path(i18n.__file__).parent
# _("...") and _('...') in templates and page modules (the English text is the key).
CALL = re.compile(r"""\b_\(\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')""")


def said() -> set[str]:
    found: set[str] = set()
    files = [*PAGES.glob("templates/*.html"), *PAGES.glob("*.py")]
    for path in files:
        for double, single in CALL.findall(path.read_text()):
            found.add(double or single)
    return found


def test_every_string_the_pages_show_has_its_turkish() -> None:
    strings = said()
    assert len(strings) > 60, "the page strings were not found"
    missing = sorted(s for s in strings if s not in i18n.TURKISH)
    assert missing == [], f"no Turkish for: {missing}"


def test_each_translation_keeps_its_placeholders() -> None:
    for english, turkish in i18n.TURKISH.items():
        assert set(re.findall(r"{\w+}", english)) == set(re.findall(r"{\w+}", turkish)), english


def test_the_language_is_the_switch_then_the_browser_then_english() -> None:
    assert i18n.pick("tr", "en-US,en;q=0.9") == "tr"
    assert i18n.pick(None, "tr-TR,tr;q=0.9,en;q=0.8") == "tr"
    assert i18n.pick(None, "de-DE,en;q=0.5") == "en"
    assert i18n.pick("xx", "") == "en"
    _ = i18n.translator("tr")
    assert _("{n} of {total} nodes", n=3, total=5) == "3 / 5 düğüm"
    assert i18n.translator("en")("Nodes") == "Nodes"
