"""``python -m llmgw`` and the zipapp's entry point."""

from __future__ import annotations

from llmgw.cli import entry

entry()
