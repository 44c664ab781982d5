"""The source of an adapter a fine-tune made: ``finetune:NAME``, the stored result of
the newest fine-tune that succeeded under that name (``ctl model adapter add MODEL
NAME`` with no source). The node fetches it from the control plane over its stream
(``AdapterAsk``, ``AdapterPiece``), never from a hub. Nothing here does IO."""

from __future__ import annotations

import re

PREFIX = "finetune:"
# As a model's (and an adapter's) name: ``catalog.model.MODEL_NAME``.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}\Z")


def source_of(name: str) -> str:
    return f"{PREFIX}{name}"


def finetune_name(source: str) -> str | None:
    """The fine-tune's adapter name a ``finetune:NAME`` source names; None for any other
    source. ValueError for a ``finetune:`` source whose name is not one."""
    if not source.startswith(PREFIX):
        return None
    name = source[len(PREFIX) :]
    if not _NAME.match(name):
        raise ValueError(
            f"{source!r}: write finetune:NAME, NAME the adapter's name as `llmgw ctl "
            "finetune list` shows it"
        )
    return name
