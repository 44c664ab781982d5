"""PCIe links: what each device's link can do, what it trained to, and what that costs.

``parse_lspci_link`` is pure. It reads ``lspci -vv`` (or ``-vvv``) output: a device
starts at an unindented line led by its bus id (``19:00.0``, or ``0000:19:00.0`` with
``-D``); within it, ``LnkCap:`` is what the link can do and ``LnkSta:`` what it runs
at now. ``LnkCap2:``/``LnkSta2:`` and devices with no link lines (conventional PCI) are
left out. Indentation may be tabs or spaces: both appear in real captures.

A link is ``degraded`` when it runs slower or narrower than it can, whether or not
this lspci says so (``(downgraded)`` came with pciutils 3.6; older ones print bare
figures). ``downgraded_words`` keeps lspci's own words when it did say so. Careful
with speed alone: many cards drop to 2.5 GT/s at idle to save power and train up under
load, so ``width_degraded`` is the stronger sign of a bad slot, riser or seating.

``bandwidth_gbs`` is the usable bandwidth per direction after line encoding (8b/10b
for Gen1-2, 128b/130b for Gen3-5, FLIT for Gen6+), so Gen4 x16 is ~31.5 GB/s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# GT/s per lane -> PCIe generation.
GEN_OF_SPEED: dict[float, int] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}
# Usable GB/s per lane per direction: GT/s x encoding efficiency / 8 bits.
_LANE_GBS: dict[int, float] = {
    1: 2.5 * 8 / 10 / 8,
    2: 5.0 * 8 / 10 / 8,
    3: 8.0 * 128 / 130 / 8,
    4: 16.0 * 128 / 130 / 8,
    5: 32.0 * 128 / 130 / 8,
    6: 64.0 * 242 / 256 / 8,  # FLIT mode: 236 data bytes + CRC/FEC in 256
    7: 128.0 * 242 / 256 / 8,
}

_DEVICE = re.compile(r"^(?P<bus>(?:[0-9a-fA-F]{4,}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")
_LNK = re.compile(r"^\s+(?P<kind>LnkCap|LnkSta):\s*(?P<body>.*)$")
_SPEED = re.compile(r"Speed (?P<speed>[\d.]+GT/s|unknown)(?P<note> \((?:ok|downgraded)\))?")
_WIDTH = re.compile(r"Width x(?P<width>\d+)(?P<note> \((?:ok|downgraded)\))?")


def gen_of(speed_gts: float | None) -> int | None:
    """The PCIe generation that runs at ``speed_gts`` per lane; None when not known."""
    if speed_gts is None:
        return None
    return GEN_OF_SPEED.get(speed_gts)


def bandwidth_gbs(gen: int, width: int) -> float:
    """Usable GB/s per direction of a Gen ``gen`` x``width`` link (Gen4 x16 -> ~31.5)."""
    lane = _LANE_GBS.get(gen)
    if lane is None:
        raise ValueError(f"no PCIe generation {gen}: known are 1 to {max(_LANE_GBS)}")
    if width < 0:
        raise ValueError(f"a link cannot be x{width} wide")
    return lane * width


@dataclass(frozen=True)
class PciLink:
    """One device's link: capability (``_cap``) and current state (``_sta``).

    Speeds are GT/s per lane, widths lanes; a figure lspci did not print is None.
    """

    speed_cap_gts: float | None
    width_cap: int | None
    speed_sta_gts: float | None
    width_sta: int | None
    gen_cap: int | None
    gen_sta: int | None
    degraded: bool
    downgraded_words: str | None

    @property
    def width_degraded(self) -> bool:
        """Fewer lanes trained than the device has: a slot, riser or seating fault."""
        return _less(self.width_sta, self.width_cap)

    @property
    def speed_degraded(self) -> bool:
        """Running slower than it can; at idle this is often power saving, not a fault."""
        return _less(self.speed_sta_gts, self.speed_cap_gts)

    @property
    def bandwidth_cap_gbs(self) -> float | None:
        return _bandwidth(self.gen_cap, self.width_cap)

    @property
    def bandwidth_sta_gbs(self) -> float | None:
        return _bandwidth(self.gen_sta, self.width_sta)


def _less(now: float | None, can: float | None) -> bool:
    return now is not None and can is not None and now < can


def _bandwidth(gen: int | None, width: int | None) -> float | None:
    """None for a figure not read, or a generation this version has no rate for."""
    if gen is None or width is None or gen not in _LANE_GBS or width < 0:
        return None
    return bandwidth_gbs(gen, width)


def link_warning(card: str, link: PciLink) -> str | None:
    """A one-line warning for a degraded link, e.g.
    "card 3 runs at x8 Gen4: 15.8 GB/s of 31.5 (x16 Gen5 possible)"; None when it is not."""
    if not link.degraded:
        return None
    now = link.bandwidth_sta_gbs
    can = link.bandwidth_cap_gbs
    running = f"x{_fig(link.width_sta)} Gen{_fig(link.gen_sta)}"
    possible = f"x{_fig(link.width_cap)} Gen{_fig(link.gen_cap)}"
    if now is None or can is None:
        return f"{card} runs at {running} of {possible} possible"
    return f"{card} runs at {running}: {now:.1f} GB/s of {can:.1f} ({possible} possible)"


def _fig(value: int | None) -> str:
    return "?" if value is None else str(value)


def _speed(body: str) -> tuple[float | None, bool]:
    m = _SPEED.search(body)
    if m is None or m["speed"] == "unknown":
        return None, bool(m and m["note"] == " (downgraded)")
    return float(m["speed"].removesuffix("GT/s")), m["note"] == " (downgraded)"


def _width(body: str) -> tuple[int | None, bool]:
    m = _WIDTH.search(body)
    if m is None:
        return None, False
    return int(m["width"]), m["note"] == " (downgraded)"


def _state_words(body: str) -> str:
    # "Speed 16GT/s (downgraded), Width x8 (downgraded)" without the flags that follow
    # on one line in older lspci ("..., TrErr- Train- ...").
    parts = [p.strip() for p in body.split(",")]
    return ", ".join(p for p in parts if p.startswith(("Speed", "Width")))


@dataclass
class _Lines:
    cap: str | None = None
    sta: str | None = None


def _link(lines: _Lines) -> PciLink:
    speed_cap, _ = _speed(lines.cap) if lines.cap is not None else (None, False)
    width_cap, _ = _width(lines.cap) if lines.cap is not None else (None, False)
    speed_sta, speed_said = _speed(lines.sta) if lines.sta is not None else (None, False)
    width_sta, width_said = _width(lines.sta) if lines.sta is not None else (None, False)
    said = speed_said or width_said
    degraded = said or _less(speed_sta, speed_cap) or _less(width_sta, width_cap)
    return PciLink(
        speed_cap_gts=speed_cap,
        width_cap=width_cap,
        speed_sta_gts=speed_sta,
        width_sta=width_sta,
        gen_cap=gen_of(speed_cap),
        gen_sta=gen_of(speed_sta),
        degraded=degraded,
        downgraded_words=_state_words(lines.sta) if said and lines.sta is not None else None,
    )


def parse_lspci_link(text: str) -> dict[str, PciLink]:
    """Each device's PCIe link from ``lspci -vv``, by bus id as lspci printed it."""
    found: dict[str, _Lines] = {}
    current: _Lines | None = None
    for line in text.splitlines():
        if m := _DEVICE.match(line):
            current = _Lines()
            found[m["bus"]] = current
            continue
        if current is None:
            continue
        if (m := _LNK.match(line)) is None:
            continue
        if m["kind"] == "LnkCap" and current.cap is None:
            current.cap = m["body"]
        elif m["kind"] == "LnkSta" and current.sta is None:
            current.sta = m["body"]
    return {
        bus: _link(lines)
        for bus, lines in found.items()
        if lines.cap is not None or lines.sta is not None
    }
