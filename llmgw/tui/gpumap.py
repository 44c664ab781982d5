"""GPU map: every card of the fleet as a cell, coloured by work or by memory, grouped
by node. Nodes are laid side by side as wide as the panel allows and the map scrolls,
so hundreds of nodes stay readable."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.events import Resize
from textual.widgets import Static

from llmgw.tui.api import Snapshot
from llmgw.tui.base import Pane

CELL = "■"
UNKNOWN = "grey50"
# (below this share, colour, legend); the last catches the rest.
SHADES: tuple[tuple[float, str, str], ...] = (
    (0.25, "green", "<25%"),
    (0.60, "yellow", "25-60%"),
    (0.85, "dark_orange", "60-85%"),
    (1.01, "red", "≥85%"),
)
MODES = ("work", "memory")


def shade(share: float | None) -> str:
    if share is None:
        return UNKNOWN
    for limit, colour, _ in SHADES:
        if share < limit:
            return colour
    return SHADES[-1][1]


def card_share(card: dict[str, Any], mode: str) -> float | None:
    if mode == "work":
        u = card.get("utilization")
        return None if u is None else u / 100
    total, used = card.get("memory_total"), card.get("memory_used")
    return used / total if total and used is not None else None


def legend(mode: str) -> Text:
    text = Text(f"Coloured by {mode} (m: {'memory' if mode == 'work' else 'work'})   ")
    for _, colour, label in SHADES:
        text.append(CELL, style=colour)
        text.append(f" {label}  ")
    text.append(CELL, style=UNKNOWN)
    text.append(" not read")
    return text


def node_block(n: dict[str, Any], mode: str, name_width: int) -> Text:
    """One node: its name (red when not Ready), then one cell per card."""
    name = str(n["id"])
    if len(name) > name_width:
        name = name[: name_width - 1] + "…"
    text = Text(f"{name:<{name_width}} ", style="" if n.get("state") == "Ready" else "red")
    for card in n.get("gpus") or []:
        text.append(CELL, style=shade(card_share(card, mode)))
    return text


def fleet_map(nodes: list[dict[str, Any]], mode: str, width: int) -> Text:
    """The whole map for a panel ``width`` cells wide: a summary, the legend, then the
    nodes with cards packed into as many columns as fit."""
    with_cards = [n for n in nodes if n.get("gpus")]
    cards = [c for n in with_cards for c in n["gpus"]]
    shares = [s for s in (card_share(c, mode) for c in cards) if s is not None]
    text = Text()
    if not cards:
        text.append("No cards in the fleet.")
        return text
    mean = f"{sum(shares) / len(shares) * 100:.0f}%" if shares else "not read"
    text.append(
        f"{len(cards)} cards on {len(with_cards)} nodes · mean {mode} {mean}"
        f" · {len(nodes) - len(with_cards)} nodes without cards\n"
    )
    text.append_text(legend(mode))
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
    KEYS = (("m", "work / memory"),)
    BINDINGS: ClassVar[list[BindingType]] = [Binding("m", "toggle_mode", "Work / memory")]

    DEFAULT_CSS = """
    GpuMapPane #gpumap-scroll {
        height: 1fr;
    }
    GpuMapPane #gpumap-body {
        width: 100%;
    }
    """

    mode = "work"
    nodes: list[dict[str, Any]]

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

    def action_toggle_mode(self) -> None:
        self.mode = MODES[(MODES.index(self.mode) + 1) % len(MODES)]
        self.render_map()
