"""Taking away exactly what ``finding`` listed, in an order that leaves nothing to
restart what is being removed: units first (systemd would start the agent again), then
the processes, the table, and last the files.

A listed dir is removed without following a link out of it: a link inside is removed
as a link, its target stays. A listed path reached through a link (its parent leads
outside the root) is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmgw.wipe.finding import KINDS, Item, Places
from llmgw.wipe.machine import Machine


@dataclass(frozen=True)
class Outcome:
    item: Item
    error: str | None  # None: removed (or already gone)

    def as_json(self) -> dict[str, str | int | bool | None]:
        return {**self.item.as_json(), "removed": self.error is None, "error": self.error}


def remove_tree(path: Path) -> list[str]:
    """Remove the dir ``path`` and all in it; links are removed, never followed."""
    errors: list[str] = []

    def note(exc: OSError) -> None:
        errors.append(f"{exc.filename}: {exc.strerror}")

    for top, dirs, files in os.walk(path, topdown=False, onerror=note, followlinks=False):
        for name in files:
            _unlink(Path(top, name), errors)
        for name in dirs:
            entry = Path(top, name)
            if entry.is_symlink():
                _unlink(entry, errors)
            else:
                try:
                    entry.rmdir()
                except OSError as exc:
                    note(exc)
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        note(exc)
    return errors


def _unlink(path: Path, errors: list[str]) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append(f"{path}: {exc.strerror}")


def remove_path(p: Places, item: Item) -> str | None:
    real = p.real(item.name)
    root = p.root.resolve()
    if not real.parent.resolve().is_relative_to(root):
        return f"it is reached through a link leading out of {p.root}: left alone"
    if not os.path.lexists(real):
        return None
    if real.is_dir() and not real.is_symlink():
        errors = remove_tree(real)
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return errors[0] + more
        return None
    errors = []
    _unlink(real, errors)
    return errors[0] if errors else None


def remove(p: Places, machine: Machine, items: list[Item]) -> list[Outcome]:
    """Each item taken away, in order of its kind; one failing does not stop the rest."""
    out: list[Outcome] = []
    units_removed = False
    for kind in KINDS:
        for item in (i for i in items if i.kind == kind):
            error: str | None
            if item.kind == "unit":
                error = machine.stop_unit(item.name)
            elif item.kind == "process":
                assert item.process is not None
                error = machine.stop(item.process)
            elif item.kind == "firewall":
                error = machine.delete_firewall_table()
            else:
                error = remove_path(p, item)
                units_removed |= error is None and "/systemd/" in item.name
            out.append(Outcome(item, error))
    if units_removed:
        error = machine.units_changed()
        if error is not None:
            out.append(Outcome(Item("unit", "daemon-reload", "systemd reads its units"), error))
    return out
