"""GPU map: every card of the fleet as a cell, coloured by work or by memory, by node."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from llmgw.tui.api import Snapshot
from llmgw.tui.base import Pane


def shade(share: float | None) -> str:
    if share is None:
        return "grey50"
    if share < 0.25:
        return "green"
    if share < 0.6:
        return "yellow"
    if share < 0.85:
        return "dark_orange"
    return "red"


def card_share(card: dict[str, Any], mode: str) -> float | None:
    if mode == "work":
        u = card.get("utilization")
        return None if u is None else u / 100
    total, used = card.get("memory_total"), card.get("memory_used")
    return used / total if total and used is not None else None


class GpuMapPane(Pane):
    TITLE = "GPU map"
    ID = "gpumap"
    KEY = "5"
    KEYS = (("m", "work / memory"),)

    mode = "work"

    def compose(self) -> ComposeResult:
        yield Static(id="gpumap-body")

    def update_from(self, snapshot: Snapshot) -> None:
        text = Text(f"Coloured by {self.mode} (m switches)\n\n")
        any_card = False
        for n in snapshot.nodes:
            cards = n.get("gpus") or []
            if not cards:
                continue
            any_card = True
            text.append(f"{n['id']:<20} ")
            for c in cards:
                share = card_share(c, self.mode)
                text.append("■ ", style=shade(share))
            text.append("\n")
        if not any_card:
            text.append("No cards in the fleet.")
        self.query_one("#gpumap-body", Static).update(text)

    def key_m(self) -> None:
        self.mode = "memory" if self.mode == "work" else "work"
