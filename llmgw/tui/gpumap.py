"""GPU map: every card of the fleet as a cell, grouped by node and coloured by one figure:
work (SM active where the card reads it, else busy), busy (``utilization.gpu``: the share
of time any kernel ran), memory, temperature, or power against its limit. ``f`` steps
through the figures, ``m`` flips between work and memory. A card whose figure was not
read is drawn as "not read", never as idle. Nodes are laid side by side as wide as the
panel allows and the map scrolls, so hundreds of nodes stay readable."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.events import Resize
from textual.widgets import Static

from llmgw.tui.api import Snapshot
from llmgw.tui.base import Pane
from llmgw.wire.admin import CardJson, NodeJson

CELL = "■"
UNKNOWN = "grey50"
Shades = tuple[tuple[float, str, str], ...]
# (below this share, colour, legend); the last catches the rest.
SHADES: Shades = (
    (0.25, "green", "<25%"),
    (0.60, "yellow", "25-60%"),
    (0.85, "dark_orange", "60-85%"),
    (1.01, "red", "≥85%"),
)
# Temperature as a share of 100 °C.
TEMPERATURE_SHADES: Shades = (
    (0.50, "green", "<50°C"),
    (0.70, "yellow", "50-70°C"),
    (0.85, "dark_orange", "70-85°C"),
    (math.inf, "red", "≥85°C"),
)
POWER_SHADES: Shades = (
    (0.25, "green", "<25% of limit"),
    (0.60, "yellow", "25-60%"),
    (0.85, "dark_orange", "60-85%"),
    (math.inf, "red", "≥85%"),
)
# In the order ``f`` steps through them.
MODES = ("work", "busy", "memory", "temperature", "power")
MODE_SHADES: dict[str, Shades] = {
    "work": SHADES,
    "busy": SHADES,
    "memory": SHADES,
    "temperature": TEMPERATURE_SHADES,
    "power": POWER_SHADES,
}


def shade(share: float | None, shades: Shades = SHADES) -> str:
    if share is None:
        return UNKNOWN
    for limit, colour, _ in shades:
        if share < limit:
            return colour
    return shades[-1][1]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def work_source(card: CardJson) -> str | None:
    """Which figure "work" reads on this card: SM active where read, else busy."""
    if _number(card.get("sm_active")) is not None:
        return "SM active"
    if _number(card.get("utilization")) is not None:
        return "busy"
    return None


def card_share(card: CardJson, mode: str) -> float | None:
    """The card's figure for ``mode`` as a share (temperature: of 100 °C; power: of
    its limit); None when not read."""
    if mode == "work":
        sm = _number(card.get("sm_active"))
        if sm is not None:
            return sm
        mode = "busy"
    if mode == "busy":
        u = _number(card.get("utilization"))
        return None if u is None else u / 100
    if mode == "temperature":
        t = _number(card.get("temperature"))
        return None if t is None else t / 100
    if mode == "power":
        power, limit = _number(card.get("power")), _number(card.get("power_limit"))
        return power / limit if power is not None and limit else None
    total, used = _number(card.get("memory_total")), _number(card.get("memory_used"))
    return used / total if total and used is not None else None


def describe(mode: str, cards: Sequence[CardJson]) -> str:
    """The figure that colours the map, for its legend; for work, which one was read."""
    if mode == "work":
        sources = [work_source(c) for c in cards]
        sm, busy = sources.count("SM active"), sources.count("busy")
        if sm and busy:
            return f"work (SM active on {sm} cards, busy on {busy})"
        if sm:
            return "work (SM active)"
        if busy:
            return "work (busy: SM active not read)"
        return "work"
    return {
        "busy": "busy (share of time a kernel ran)",
        "temperature": "temperature",
        "power": "power of its limit",
    }.get(mode, mode)


def mean_text(mode: str, shares: Sequence[float]) -> str:
    if not shares:
        return "not read"
    mean = sum(shares) / len(shares)
    if mode == "temperature":
        return f"{mean * 100:.0f}°C"
    if mode == "power":
        return f"{mean * 100:.0f}% of limit"
    return f"{mean * 100:.0f}%"


def legend(mode: str, cards: Sequence[CardJson] = ()) -> Text:
    text = Text(f"Coloured by {describe(mode, cards)} · f: next figure, m: work / memory\n")
    for _, colour, label in MODE_SHADES[mode]:
        text.append(CELL, style=colour)
        text.append(f" {label}  ")
    text.append(CELL, style=UNKNOWN)
    text.append(" not read")
    return text


def node_block(n: NodeJson, mode: str, name_width: int) -> Text:
    """One node: its name (red when not Ready), then one cell per card."""
    name = str(n["id"])
    if len(name) > name_width:
        name = name[: name_width - 1] + "…"
    text = Text(f"{name:<{name_width}} ", style="" if n.get("state") == "Ready" else "red")
    # Figures that are not live (too old, or nvidia-smi not answering) are not coloured.
    live = "gpus" not in (n.get("stale_figures") or [])
    for card in n.get("gpus") or []:
        share = card_share(card, mode) if live else None
        text.append(CELL, style=shade(share, MODE_SHADES[mode]))
    return text


def fleet_map(nodes: list[NodeJson], mode: str, width: int) -> Text:
    """The whole map for a panel ``width`` cells wide: a summary, the legend, then the
    nodes with cards packed into as many columns as fit."""
    with_cards = [n for n in nodes if n.get("gpus")]
    cards = [c for n in with_cards for c in n["gpus"]]
    live = [
        c for n in with_cards if "gpus" not in (n.get("stale_figures") or []) for c in n["gpus"]
    ]
    shares = [s for s in (card_share(c, mode) for c in live) if s is not None]
    text = Text()
    if not cards:
        text.append("No cards in the fleet.")
        return text
    text.append(
        f"{len(cards)} cards on {len(with_cards)} nodes · mean {mode} {mean_text(mode, shares)}"
        f" · {len(nodes) - len(with_cards)} nodes without cards\n"
    )
    text.append_text(legend(mode, cards))
    text.append("\n\n")
    name_width = min(16, max(len(str(n["id"])) for n in with_cards))
    most = max(len(n["gpus"]) for n in with_cards)
    block = name_width + 1 + most
    gap = 3
    columns = max(1, (width + gap) // (block + gap))
    for start in range(0, len(with_cards), columns):
        row = with_cards[start : start + columns]
        for i, n in enumerate(row):
            part = node_block(n, mode, name_width)
            text.append_text(part)
            if i < len(row) - 1:
                text.append(" " * (block - len(part.plain) + gap))
        text.append("\n")
    text.rstrip()
    return text


class GpuMapPane(Pane):
    TITLE = "GPU map"
    ID = "gpumap"
    KEY = "5"
    KEYS = (("f", "next figure"), ("m", "work / memory"))
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "next_mode", "Next figure"),
        Binding("m", "toggle_mode", "Work / memory"),
    ]

    DEFAULT_CSS = """
    GpuMapPane #gpumap-scroll {
        height: 1fr;
    }
    GpuMapPane #gpumap-body {
        width: 100%;
    }
    """

    mode = "work"
    nodes: list[NodeJson]

    def compose(self) -> ComposeResult:
        self.nodes = []
        with VerticalScroll(id="gpumap-scroll"):
            yield Static(id="gpumap-body")

    def update_from(self, snapshot: Snapshot) -> None:
        self.nodes = snapshot.nodes
        self.render_map()

    def render_map(self) -> None:
        # Less the scroll bar, so a full row never wraps.
        width = max(20, self.content_size.width - 2)
        self.query_one("#gpumap-body", Static).update(fleet_map(self.nodes, self.mode, width))

    def on_resize(self, event: Resize) -> None:
        self.render_map()

    def action_next_mode(self) -> None:
        """Work, busy, memory, temperature, power, and round again."""
        self.set_mode(MODES[(MODES.index(self.mode) + 1) % len(MODES)])

    def action_toggle_mode(self) -> None:
        """Memory, or back to work from any other figure."""
        self.set_mode("work" if self.mode == "memory" else "memory")

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self.render_map()
