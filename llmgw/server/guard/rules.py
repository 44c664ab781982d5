"""The guard's pattern rules: personal data and planted instructions found in a text,
fast enough to read every prompt of a key with policies.

Each ``Finding`` is a kind and the span it covers; ``redact`` replaces each span with
``[REDACTED:KIND]``. Kinds of personal data:

- ``email``: ``local@domain.tld``, found from each ``@`` outwards (bounded on each side,
  so a long run of letters costs one pass, not a pass from each of its letters);
- ``card``: 13 to 19 digits, in one run or in groups split by spaces or dashes, that pass
  the Luhn check (a 16-digit number that fails it is not a card);
- ``ssn``: a US social security number, ``123-45-6789`` (or with spaces), never area
  000, 666 or 9xx, group 00 or serial 0000;
- ``tckn``: a Turkish TC kimlik number, 11 digits whose 10th and 11th are its checksums;
- ``phone``: an international number (``+`` and 8 to 15 digits), a North American one
  (``(555) 123-4567``, ``555-123-4567``, ``1 555 123 4567``), or a national one with a
  trunk 0 and 10 or 11 digits (``0532 123 45 67``, ``07700 900123``); never every digit
  run: a date, a version string or a count is not a phone number;
- ``nino``: a UK National Insurance number, ``QQ 12 34 56 C``, with its prefix rules;
- ``iban``: a country code, two check digits and up to 30 letters and digits (grouped by
  four or not) whose mod-97 check is 1.

``injection``: phrases that try to take over a model: "ignore (all|any|the) previous
instructions", "disregard the above", "you are now a/an/in/no longer...", "new
instructions:", "system prompt", and role markers written into text to pose as the
system ("<|im_start|>system", "### system", "[INST]", "<<SYS>>"). "You are now" alone is
not one: "you are now signed in" is what tools say.

Speed (``bench/guard.py``, ``docs/performance.md``): every rule is skipped by one C-speed
test when its text cannot hold it (no ``@``, no digit, no capital followed by digits, no
trigger word), digit runs are found by one linear regex and classified in Python only
when long enough, and no pattern can backtrack over what it matched.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Literal

Kind = Literal["email", "phone", "card", "ssn", "nino", "tckn", "iban", "injection"]
PII_KINDS: tuple[Kind, ...] = ("email", "phone", "card", "ssn", "nino", "tckn", "iban")
# The words each kind is named by in refusals and audit lines.
WORDS: dict[str, str] = {
    "email": "an email address",
    "phone": "a phone number",
    "card": "a card number",
    "ssn": "a US social security number",
    "nino": "a UK National Insurance number",
    "tckn": "a TC kimlik number",
    "iban": "an IBAN",
    "injection": "an instruction to the model",
}


@dataclass(frozen=True, slots=True)
class Finding:
    kind: Kind
    start: int
    end: int


# ------------------------------------------------------------------------- email

_LOCAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")
_DOMAIN = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.[A-Za-z]{2,24}\b"
)  # noqa: E501
MAX_LOCAL = 64


def emails(text: str) -> list[Finding]:
    found: list[Finding] = []
    at = text.find("@")
    while at != -1:
        start = at
        low = max(0, at - MAX_LOCAL)
        while start > low and text[start - 1] in _LOCAL:
            start -= 1
        while start < at and text[start] == ".":
            start += 1  # a local part does not begin with a dot
        domain = _DOMAIN.match(text, at + 1) if start < at else None
        if domain is not None:
            found.append(Finding("email", start, domain.end()))
            at = text.find("@", domain.end())
        else:
            at = text.find("@", at + 1)
    return found


# ----------------------------------------------------------------------- numbers

# The text as the number and letter rules scan it, one character for one: ASCII digits
# as "0", capitals as "A", a space, dot or dash as "\x01" (and "\x01" itself as
# "\x02"). str.translate does this in one C pass, and the patterns below then begin
# with a literal, which re finds by its fast search instead of trying every character
# against a class: that took most of the rules' time.
_SHAPE = str.maketrans(
    {
        **{ord(c): "0" for c in string.digits},
        **{ord(c): "A" for c in string.ascii_uppercase},
        **{ord(c): "\x01" for c in " .-"},
        1: "\x02",
    }
)
# Seven digits or more, each group joined to the next by one separator (a space, dash,
# dot, or a closing parenthesis and a space): fewer is no kind.
_RUN = re.compile(r"0(?:\x01?0|\)\x01?0){6,}")
_GROUPS = re.compile(r"([^0-9]+)")
# Groups looked at together: a card is at most 5 groups (4-4-4-4-3), a phone 5.
MAX_GROUPS = 6


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _tckn(d: str) -> bool:
    if len(d) != 11 or d[0] == "0":
        return False
    n = [ord(c) - 48 for c in d]
    tenth = ((n[0] + n[2] + n[4] + n[6] + n[8]) * 7 - (n[1] + n[3] + n[5] + n[7])) % 10
    return n[9] == tenth and n[10] == sum(n[:10]) % 10


def _ssn(groups: list[str], seps: list[str]) -> bool:
    if [len(g) for g in groups] != [3, 2, 4] or seps[0] != seps[1] or seps[0] not in "- ":
        return False
    area, group, serial = groups
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def _card(groups: list[str], seps: list[str]) -> bool:
    digits = "".join(groups)
    if not 13 <= len(digits) <= 19 or any(s not in (" ", "-") for s in seps):
        return False
    sizes = [len(g) for g in groups]
    shaped = (
        len(sizes) == 1
        or all(s == 4 for s in sizes[:-1])
        and 1 <= sizes[-1] <= 4
        or sizes in ([4, 6, 5], [4, 6, 4])
    )
    return shaped and _luhn(digits)


def _phone(groups: list[str], seps: list[str], plus: bool, paren: bool) -> bool:
    digits = "".join(groups)
    n = len(digits)
    if plus:
        return 8 <= n <= 15
    sizes = [len(g) for g in groups]
    if sizes == [3, 3, 4] or sizes == [1, 3, 3, 4] and groups[0] == "1":
        # North American: one separator kind between the last groups, or (555) 123-4567.
        return paren or seps[-1] == seps[-2] or seps[-2] == ") "
    dotted = "." in seps
    return digits[0] == "0" and 10 <= n <= 11 and not dotted and (len(groups) > 1 or n == 11)


def _classify(text: str, start: int, groups: list[str], seps: list[str]) -> Kind | None:
    if len(groups) == 1 and _tckn(groups[0]):
        return "tckn"
    if len(groups) == 3 and _ssn(groups, seps):
        return "ssn"
    if _card(groups, seps):
        return "card"
    plus = start > 0 and text[start - 1] == "+"
    paren = start > 0 and text[start - 1] == "(" and bool(seps) and seps[0].startswith(")")
    if _phone(groups, seps, plus, paren):
        return "phone"
    return None


def numbers(text: str, shape: str | None = None) -> list[Finding]:
    """Cards, SSNs, TC kimlik numbers and phone numbers in the text's digit runs
    (``shape``: the text translated by ``_SHAPE``, when the caller has it)."""
    found: list[Finding] = []
    for run in _RUN.finditer(text.translate(_SHAPE) if shape is None else shape):
        s, e = run.span()
        # The groups and what joins them, with where each group begins.
        parts = _GROUPS.split(text[s:e])
        groups, seps = parts[0::2], parts[1::2]
        offsets = [s]
        for g, sep in zip(groups, seps, strict=False):
            offsets.append(offsets[-1] + len(g) + len(sep))
        i = 0
        while i < len(groups):
            # The longest window from group i that is some kind; else move on a group.
            for j in range(min(len(groups), i + MAX_GROUPS), i, -1):
                begin = offsets[i]
                kind = _classify(text, begin, groups[i:j], seps[i : j - 1])
                if kind is not None:
                    # Not part of a longer number: the window's neighbours are not digits
                    # joined to it (those were other windows' and did not match).
                    end = offsets[j - 1] + len(groups[j - 1])
                    marked = kind == "phone" and begin > 0 and text[begin - 1] in "+("
                    first = begin - 1 if marked else begin
                    found.append(Finding(kind, first, end))
                    i = j
                    break
            else:
                i += 1
    return found


# --------------------------------------------------------- national ids by letter

_NINO = re.compile(
    r"\b(?!BG|GB|KN|NK|NT|TN|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
)
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b")
# Two capitals, maybe a space, two digits: where a NINO or an IBAN may begin.
_CAPITAL_DIGIT = re.compile("AA\x01?00")


def _mod97(iban: str) -> bool:
    moved = iban[4:] + iban[:4]
    total = 0
    for ch in moved:
        total = (total * (100 if ch.isalpha() else 10) + int(ch, 36)) % 97
    return total == 1


def lettered(text: str, shape: str | None = None) -> list[Finding]:
    """UK National Insurance numbers and IBANs: both begin with two capitals."""
    found: list[Finding] = []
    for start in _CAPITAL_DIGIT.finditer(text.translate(_SHAPE) if shape is None else shape):
        at = start.start()
        nino = _NINO.match(text, at)
        if nino is not None:
            found.append(Finding("nino", at, nino.end()))
            continue
        iban = _IBAN.match(text, at)
        if iban is not None:
            compact = iban.group().replace(" ", "")
            if 15 <= len(compact) <= 34 and _mod97(compact):
                found.append(Finding("iban", at, iban.end()))
    return found


# --------------------------------------------------------------------- injection

# Each phrase with the word that must be in the (lower-cased) text before its pattern
# is tried: the pattern begins with that word, so re finds it by its fast literal search.
_WORDS = r"(?:(?:all|any|the|my|your|of)\s+)*"
_PHRASES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (word, re.compile(pattern, re.MULTILINE))
    for word, pattern in (
        (
            "ignore",
            r"ignore\s+" + _WORDS + r"(?:previous|prior|above|earlier|preceding)\s+"
            r"(?:instructions?|prompts?|messages?|directions?|rules)",
        ),
        (
            "disregard",
            r"disregard\s+" + _WORDS + r"(?:above|previous|prior|preceding|instructions?)",
        ),
        (
            "now",
            r"you\s+are\s+now\s+(?:a|an|the|in|no\s+longer|dan|free|unrestricted|jailbroken)\b",
        ),
        ("instructions", r"new\s+instructions\s*:"),
        ("prompt", r"system\s+prompt"),
        ("<|im_start|>", r"<\|im_start\|>\s*system"),
        ("<|start_header_id|>", r"<\|start_header_id\|>\s*system"),
        ("<|system|>", r"<\|system\|>"),
        ("##", r"##+[ \t]*system\b"),
        ("inst]", r"\[/?inst\]"),
        ("<<sys>>", r"<<sys>>"),
    )
)


def injections(text: str) -> list[Finding]:
    lowered = text.lower()
    if len(lowered) != len(text):
        # lower() changed a length (Turkish İ): spans are read on a text of the same
        # length, with each character lowered on its own where that keeps one.
        lowered = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
    found: list[Finding] = []
    for word, pattern in _PHRASES:
        if word in lowered:
            for m in pattern.finditer(lowered):
                line = lowered.rfind("\n", 0, m.start()) + 1
                if word == "##" and lowered[line : m.start()].strip():
                    continue  # "### system" counts only at a line's beginning
                found.append(Finding("injection", m.start(), m.end()))
    found.sort(key=lambda f: f.start)
    return found


# ------------------------------------------------------------------------- all


def pii(text: str) -> list[Finding]:
    """Every piece of personal data in the text, by where it begins, none overlapping."""
    shape = text.translate(_SHAPE)
    found = emails(text) + numbers(text, shape) + lettered(text, shape)
    if len(found) < 2:
        return found
    found.sort(key=lambda f: (f.start, -f.end))
    kept = [found[0]]
    for f in found[1:]:
        if f.start >= kept[-1].end:
            kept.append(f)
    return kept


def redact(text: str, findings: list[Finding]) -> str:
    """The text with each finding replaced by ``[REDACTED:KIND]`` (findings in order,
    not overlapping, as ``pii`` gives them)."""
    out: list[str] = []
    at = 0
    for f in findings:
        out.append(text[at : f.start])
        out.append(f"[REDACTED:{f.kind.upper()}]")
        at = f.end
    out.append(text[at:])
    return "".join(out)


def masked(text: str, finding: Finding) -> str:
    """What an audit line may show of a finding: its shape, never the data."""
    found = text[finding.start : finding.end]
    if finding.kind == "email":
        return f"{found[0]}***@***"
    if finding.kind == "injection":
        return found[:40]  # the phrase itself is what was found, and holds no one's data
    return "***" + found[-2:]
