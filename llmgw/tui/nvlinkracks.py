"""NVLink racks: each NVLink domain (``GET /api/v1/nvlink``: the cards that share a
fabric cluster UUID and clique) drawn as a rack of trays, one row per node with a cell
per card coloured by whether it joined the domain (yellow: joined, but its fabric health
is not Healthy), the node's IMEX daemon (up, down, not read), and the domain's problems
each with its fix; cards that are in no domain are listed under it. A card whose state
was not read is drawn as unknown, never as joined.

The pane reads the route itself, only while it is shown."""

from __future__ import annotations

import urllib.error

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.events import Show
from textual.widgets import Static

from llmgw.client.adminbase import AdminError
from llmgw.tui.api import Snapshot
from llmgw.tui.base import DASH, Pane, append_problem
from llmgw.wire.admin import (
    DomainJson,
    ImexJson,
    NvlinkCardJson,
    NvlinkJson,
    TrayJson,
    UnjoinedCardJson,
)

PATH = "/api/v1/nvlink"
CELL = "■"
JOINED = "green"
NOT_JOINED = "red"
UNHEALTHY = "yellow"
UNKNOWN = "grey50"
NO_VIEW = "This control plane has no NVLink view (GET /api/v1/nvlink answered 404)."


def unhealthy(card: NvlinkCardJson) -> str | None:
    """The fabric health summary of a joined card when it is not Healthy."""
    health = card.get("health")
    summary = health.get("summary") if isinstance(health, dict) else None
    return str(summary) if card.get("joined") is True and summary not in (None, "Healthy") else None


def card_colour(card: NvlinkCardJson) -> str:
    joined = card.get("joined")
    if joined is True:
        return UNHEALTHY if unhealthy(card) else JOINED
    if joined is False:
        return NOT_JOINED
    return UNKNOWN


def imex_text(imex: ImexJson | None) -> Text:
    running = imex.get("running") if imex else None
    channels = imex.get("channels") if imex else None
    if running is True:
        text = Text("IMEX up", style=JOINED)
    elif running is False:
        text = Text("IMEX down", style=f"bold {NOT_JOINED}")
    else:
        return Text("IMEX unknown", style=UNKNOWN)
    if isinstance(channels, int) and not isinstance(channels, bool):
        text.append(f" ({channels} channel{'' if channels == 1 else 's'})", style="dim")
    return text


def legend() -> Text:
    text = Text()
    for colour, words in (
        (JOINED, "joined"),
        (UNHEALTHY, "joined, not Healthy"),
        (NOT_JOINED, "not joined"),
        (UNKNOWN, "unknown"),
    ):
        text.append(CELL, style=colour)
        text.append(f" {words}  ")
    text.rstrip()
    return text


def tray_row(tray: TrayJson, name_width: int, most_cards: int) -> Text:
    """``gpu-025  [■■■■]  IMEX up (1 channel)  card 2: In Progress``."""
    cards = tray.get("cards") or []
    away = tray.get("connected") is False
    text = Text(f"{str(tray.get('node') or DASH):<{name_width}}", style="dim" if away else "")
    text.append(" [")
    for card in cards:
        text.append(CELL, style=card_colour(card))
    text.append("]" + " " * (most_cards - len(cards) + 2))
    imex = imex_text(tray.get("imex"))
    text.append_text(imex)
    text.append(" " * max(2, 26 - len(imex.plain)))
    for card in cards:
        if card.get("joined") is False:
            state = card.get("state") or "state not read"
            status = card.get("status")
            why = f"{state}, {status}" if status and status not in ("Success", "N/A") else state
            text.append(f"card {card.get('index')} not joined: {why}  ", style=NOT_JOINED)
        elif unhealthy(card):
            text.append(f"card {card.get('index')} {unhealthy(card)}  ", style=UNHEALTHY)
    if away:
        text.append("agent not connected: last figures", style="dim")
    text.rstrip()
    return text


def domain_text(domain: DomainJson) -> Text:
    trays = domain.get("trays") or []
    cards = [c for t in trays for c in t.get("cards") or []]
    joined = sum(1 for c in cards if c.get("joined") is True)
    not_joined = sum(1 for c in cards if c.get("joined") is False)
    imex = [imex.get("running") if (imex := t.get("imex")) else None for t in trays]
    text = Text()
    text.append(f"Domain {domain.get('cluster_uuid') or domain.get('id')}", style="bold")
    text.append(f" · clique {domain.get('clique_id', DASH)}")
    text.append(f" · {len(trays)} trays · {len(cards)} cards: {joined} joined")
    if not_joined:
        text.append(f", {not_joined} not joined", style=NOT_JOINED)
    unknown = len(cards) - joined - not_joined
    if unknown:
        text.append(f", {unknown} unknown", style=UNKNOWN)
    text.append(f" · IMEX up on {imex.count(True)}")
    if imex.count(False):
        text.append(f", down on {imex.count(False)}", style=NOT_JOINED)
    if imex.count(None):
        text.append(f", unknown on {imex.count(None)}", style=UNKNOWN)
    name_width = max((len(str(t.get("node") or DASH)) for t in trays), default=1)
    most = max((len(t.get("cards") or []) for t in trays), default=0)
    for tray in trays:
        text.append("\n  ")
        text.append_text(tray_row(tray, name_width, most))
    for problem in domain.get("problems") or []:
        append_problem(text, problem)
    return text


def unjoined_line(card: UnjoinedCardJson) -> str:
    where = f"{card.get('node') or DASH} card {card.get('index', DASH)}"
    uuid = f" ({card['uuid']})" if card.get("uuid") else ""
    state = card.get("state") or "state not read"
    status = card.get("status")
    tail = f", {status}" if status and status not in ("Success", "N/A") else ""
    return f"{where}{uuid}: {state}{tail}"


def racks_text(found: NvlinkJson) -> Text:
    """Every domain as a rack, then the cards in none."""
    domains = found.get("domains") or []
    unjoined = found.get("unjoined") or []
    text = Text()
    if not domains and not unjoined:
        text.append(
            "No NVLink domain: no node reports a card with an NVLink fabric "
            "(GB200 NVL72 and alike).",
            style="dim",
        )
        return text
    text.append_text(legend())
    for domain in domains:
        text.append("\n\n")
        text.append_text(domain_text(domain))
    if unjoined:
        text.append("\n\nUnjoined", style="bold")
        text.append(" (cards with an NVLink fabric in no domain)", style="dim")
        for card in unjoined:
            text.append("\n  ")
            text.append(CELL, style=card_colour(card))
            text.append(f" {unjoined_line(card)}")
    return text


class NvlinkRacksPane(Pane):
    TITLE = "NVLink racks"
    ID = "nvlink"
    KEY = "8"

    DEFAULT_CSS = """
    NvlinkRacksPane #nvlink-scroll {
        height: 1fr;
    }
    NvlinkRacksPane #nvlink-body {
        width: 100%;
    }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="nvlink-scroll"):
            yield Static(Text("Reading the NVLink domains…", style="dim"), id="nvlink-body")

    def update_from(self, snapshot: Snapshot) -> None:
        if self.display:
            self.fetch()

    def on_show(self, event: Show) -> None:
        self.fetch()

    @work(exclusive=True, group="nvlink")
    async def fetch(self) -> None:
        api = self.console.api
        body = self.query_one("#nvlink-body", Static)
        try:
            found = await api.nvlink()
        except AdminError as exc:
            cause = exc.__cause__
            if isinstance(cause, urllib.error.HTTPError) and cause.code == 404:
                body.update(Text(NO_VIEW, style="dim"))
            else:
                message = str(exc).removeprefix(f"{api.base_url}{PATH}: ")
                body.update(Text(f"Cannot read the NVLink domains: {message}", style="red"))
            return
        body.update(racks_text(found))
