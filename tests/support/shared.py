"""The captures every checkout has beside it (``../shared/fixtures``), wherever the
clone is."""

from __future__ import annotations

from pathlib import Path

# tests/support/shared.py -> the checkout -> the folder beside it.
SHARED_FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
