"""A node's facts and live figures for tests, typed as the registry keeps them, written
in the wire's form: ``facts(cpu_count=8, gpus=[{"uuid": "GPU-a", "memory_total": ...}])``.

What a test leaves out that the wire requires is filled in, so a test names only what it
is about: a host called ``node`` running Linux on x86_64, and each card's index (its
place in the list), uuid (``GPU-<index>``) and name (an H100). Records may be given as
maps or typed; they are read as the control plane reads a frame (``from_map``), so a
field of the wrong type is an error.
"""

from __future__ import annotations

import time
from typing import Any

from llmgw.server.fleet.figures import AGED_FIGURES, LiveFigures
from llmgw.wire.hardware import GPU, HostFacts
from llmgw.wire.messages import from_map, to_map

H100 = "NVIDIA H100 80GB HBM3"


def _card(index: int, given: Any) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "name": H100, **to_map(given)}


def card(index: int = 0, **fields: Any) -> GPU:
    """One card: ``index``, uuid ``GPU-<index>`` and an H100's name unless given."""
    return from_map(GPU, _card(index, fields))


def _read(cls: type[Any], fields: dict[str, Any]) -> Any:
    if fields.get("gpus") is not None:
        fields["gpus"] = [_card(i, g) for i, g in enumerate(fields["gpus"])]
    return from_map(cls, to_map(fields))


def facts(**fields: Any) -> HostFacts:
    """A node's facts, as its Register's ``HostFacts``."""
    typed: HostFacts = _read(
        HostFacts, {"hostname": "node", "os": "Linux", "arch": "x86_64", **fields}
    )
    return typed


def live(at: float | None = None, **fields: Any) -> LiveFigures:
    """A node's latest heartbeat figures; what is not given was never sent. Every
    figure (and what the facts carry) was read at ``at`` (wall clock; now if not given)."""
    typed: LiveFigures = _read(LiveFigures, fields)
    typed.read_at = dict.fromkeys(AGED_FIGURES, time.time() if at is None else at)
    return typed
