"""NVLink state and error counters from ``nvidia-smi nvlink -s`` and ``nvidia-smi nvlink -e``.

``nvidia-smi -q -x`` holds neither, so where NVML does not answer they come from these
two texts. Both print one section per card, a header line and then per-link lines::

    GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5269b708-...)
             Link 0: 25 GB/s                  (-s: the link's speed)
             Link 4: <inactive>               (-s: a link that is down)
             Link 0: Replay Errors: 0         (-e: one counter of one link; tab-indented)

Cards are keyed by their UUID when the header gives one (``GPU-...``), else by
``"index:N"`` (N the index in the header; some drivers or trimmed logs print
``GPU 0: NVIDIA GB300`` with no UUID). ``card_key`` makes the same key from a card's
UUID and index, so a caller holding both can look a card up either way.

``parse_nvlink_status`` gives each card's links in link order, True for a link that
shows a speed (``25 GB/s``, ``26.562 GB/s``) and False for anything else (``<inactive>``,
``N/A``, ``[N/A]``, ``0 GB/s``). A card whose section has no link lines (nvidia-smi's
"NVLink is not supported" or "Unable to retrieve NVLink information as all links are
inActive" in their place) is kept with an empty list: the card was named, no link was.

``parse_nvlink_errors`` sums each counter over a card's links, under NVML's names
(``NVLINK_COUNTERS`` in ``nvml.py``): "Replay Errors" -> ``replay``, "Recovery Errors"
-> ``recovery``, "CRC Errors" (the only CRC line in the captures, driver 535; read as
the per-link flow-control CRC count NVML calls CRC_FLIT, which is an assumption) and
"CRC Flit Errors" -> ``crc_flit``, "CRC Data Errors" -> ``crc_data``. A counter the
driver does not print, or prints as N/A, is absent, never 0. The NVLink 5 (Blackwell)
layout (reported for driver 595 on B300; no capture of it is at hand) prints other
counters ("Rx Errors", "Effective Errors", "Link recovery failed events", "FEC Errors -
N", BER figures ...) on the same ``Link N: <name>: <value>`` lines and none of those
four; as none of them means the same as NVML's counters, they are not mapped, and such
a card's dict is empty.

A card with NVLink whose links are all down may print the "all links are inActive"
line rather than its links, which reads the same as a card without NVLink: no links.

Lines that are neither a card header nor a link line (blank lines, banners, warnings)
are skipped; link lines before the first header are skipped too. All pure: text in,
figures out; nothing here raises on odd text.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"^\s*GPU\s+(?P<index>\d+):(?P<rest>.*)$")
_UUID = re.compile(r"\(UUID:\s*(?P<uuid>[^)\s]+)\s*\)")
_STATUS = re.compile(r"^\s*Link\s+(?P<link>\d+):\s*(?P<value>.*?)\s*$")
_COUNTER = re.compile(r"^\s*Link\s+(?P<link>\d+):\s*(?P<name>.+?):\s*(?P<value>\S+)\s*$")
_SPEED = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*[KMGT]?B/s$", re.IGNORECASE)
_COUNT = re.compile(r"^\d[\d,]*$")

# nvidia-smi's counter labels (lower case) -> NVML's counter names (NVLINK_COUNTERS).
COUNTER_LABELS = {
    "replay errors": "replay",
    "recovery errors": "recovery",
    "crc errors": "crc_flit",
    "crc flit errors": "crc_flit",
    "crc data errors": "crc_data",
}


def card_key(uuid: str | None, index: int) -> str:
    """The key the parsers give a card: its UUID when known, else ``"index:N"``."""
    return uuid if uuid else f"index:{index}"


def _header(line: str) -> str | None:
    m = _HEADER.match(line)
    if m is None:
        return None
    u = _UUID.search(m["rest"])
    return card_key(u["uuid"] if u else None, int(m["index"]))


def _active(value: str) -> bool:
    m = _SPEED.match(value)
    return m is not None and float(m["num"]) > 0


def parse_nvlink_status(text: str) -> dict[str, list[bool]]:
    """``nvidia-smi nvlink -s``: each card's links in link order, True where active."""
    cards: dict[str, dict[int, bool]] = {}
    links: dict[int, bool] | None = None
    for line in text.splitlines():
        key = _header(line)
        if key is not None:
            links = cards.setdefault(key, {})
            continue
        m = _STATUS.match(line)
        if m is None or links is None:
            continue
        links[int(m["link"])] = _active(m["value"])
    return {key: [found[n] for n in sorted(found)] for key, found in cards.items()}


def parse_nvlink_errors(text: str) -> dict[str, dict[str, int]]:
    """``nvidia-smi nvlink -e``: each card's counters summed over its links (NVML names)."""
    cards: dict[str, dict[str, int]] = {}
    counts: dict[str, int] | None = None
    for line in text.splitlines():
        key = _header(line)
        if key is not None:
            counts = cards.setdefault(key, {})
            continue
        m = _COUNTER.match(line)
        if m is None or counts is None:
            continue
        name = COUNTER_LABELS.get(" ".join(m["name"].lower().split()))
        value = m["value"]
        if name is None or not _COUNT.match(value):
            continue  # a counter we do not map, or N/A
        counts[name] = counts.get(name, 0) + int(value.replace(",", ""))
    return cards


def nvlink_health(
    status: dict[str, list[bool]], errors: dict[str, dict[str, int]] | None
) -> dict[str, tuple[int, int, dict[str, int] | None]]:
    """(links, active links, summed counters) per card key, for ``GpuHealth``.

    Only cards with at least one link in ``status`` are given: a card without NVLink
    (or whose links nvidia-smi would not list) is left out, so its figures stay None, as
    through NVML. The counters are None where ``errors`` does not hold the card or holds
    no counter for it.
    """
    out: dict[str, tuple[int, int, dict[str, int] | None]] = {}
    for key, links in status.items():
        if not links:
            continue
        counts = (errors or {}).get(key)
        out[key] = (len(links), sum(links), dict(counts) if counts else None)
    return out
