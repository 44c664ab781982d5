"""The plain values every part of the store shares: what a statement takes, and an
audit entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

# A value a statement takes or a row gives: what both drivers map to SQL types.
SQLValue: TypeAlias = str | int | float | bytes | None
Params: TypeAlias = tuple[SQLValue, ...]


@dataclass(frozen=True)
class Audit:
    """Who did what to what: written with the change it describes."""

    actor: str
    action: str
    target: str
    detail: str = ""
    # The organisation the change was made in, where it was made in one.
    org: str | None = None
    # When it happened, where it is written later (a batch of calls); None: now.
    at: float | None = None
