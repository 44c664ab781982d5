"""What every screen of the console is built from: a pane that takes a snapshot, and a
table that updates in place (changed cells only, so a refresh never flickers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Protocol, cast

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import DataTable

from llmgw.tui.api import ConsoleApi, Snapshot
from llmgw.wire.warnings import split_fix

DASH = "-"


class Console(Protocol):
    """What a pane asks of the console app (``app.ConsoleApp``), which holds every pane:
    named here so that a pane never imports the app."""

    api: ConsoleApi
    refresh_seconds: float
    snapshot: Snapshot

    def action_refresh_now(self) -> None: ...

    def open_node(self, node_id: str) -> None: ...


class Pane(Vertical):
    """One screen of the sidebar. ``update_from`` is called with every snapshot."""

    TITLE: ClassVar[str] = ""
    # The screen's id and the key that shows it.
    ID: ClassVar[str] = ""
    KEY: ClassVar[str] = ""
    # Key bar entries while this pane is shown: (key, what it does).
    KEYS: ClassVar[Sequence[tuple[str, str]]] = ()

    def update_from(self, snapshot: Snapshot) -> None:
        """Show the latest snapshot; called on the UI's loop."""

    @property
    def console(self) -> Console:
        return cast(Console, self.app)


def fill(table: DataTable[str], columns: Sequence[str], rows: Mapping[str, Sequence[str]]) -> None:
    """Make ``table`` show ``rows`` (row key → cells) with as few changes as it takes."""
    if not table.columns:
        for name in columns:
            table.add_column(name, key=name)
    existing = {str(k.value) for k in table.rows}
    for key in existing - rows.keys():
        table.remove_row(key)
    for key, cells in rows.items():
        if key in existing:
            for name, value in zip(columns, cells, strict=True):
                if table.get_cell(key, name) != value:
                    table.update_cell(key, name, value)
        else:
            table.add_row(*cells, key=key)


def highlighted(table: DataTable[str]) -> str | None:
    """The key of the row under the table's cursor; None when the table is empty."""
    if not table.row_count:
        return None
    key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
    return str(key.value) if key.value is not None else None


def append_problem(text: Text, problem: str) -> None:
    """A warning or problem on its own line, its fix (``... Fix: ...``) under it."""
    detail, fix = split_fix(problem)
    text.append("\n⚠ ", style="yellow")
    text.append(detail)
    if fix:
        text.append("\n  fix: ", style="green")
        text.append(fix)


def gib(value: object) -> str:
    if not isinstance(value, int | float):
        return DASH
    return f"{value / 2**30:.1f}"


def bar(used: float | None, total: float | None, width: int = 10) -> str:
    """A bar of ``width`` cells for used/total; a dash when either is not known."""
    if not total or used is None:
        return DASH
    share = max(0.0, min(1.0, used / total))
    full = round(share * width)
    return "█" * full + "░" * (width - full) + f" {share * 100:3.0f}%"
