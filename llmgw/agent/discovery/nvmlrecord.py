"""NVML's answers through our own interface, recorded as JSON: fixtures from a real card.

``record`` asks an ``NvmlSource`` everything discovery asks (each card's identity,
memory, utilisation and every name in ``FIGURES``) and writes each answer, or the error
it raised, so a test can replay a real card through ``FakeNvml`` and a reader can see
which figures a driver refuses. ``python -m llmgw.agent.discovery.nvmlrecord`` prints
the real NVML's answers (``packaging/record-gpu.sh`` runs it).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import NotRequired, TypedDict

from llmgw.agent.discovery.nvml import FIGURES, NvmlError, NvmlSource, PynvmlSource


class Answer(TypedDict, total=False):
    """One call's answer, or the error it raised."""

    value: object
    error: str


class CardRecord(TypedDict):
    uuid: Answer
    name: Answer
    memory: Answer
    utilization: Answer
    compute_capability: Answer
    figures: dict[str, Answer]


class Recording(TypedDict):
    driver_version: Answer
    cuda_version: Answer
    cards: list[CardRecord]
    xid_events: NotRequired[Answer]


def _answer(call: Callable[..., object], *args: object) -> Answer:
    try:
        value = call(*args)
    except NvmlError as exc:
        return {"error": str(exc)}
    if isinstance(value, tuple):
        value = list(value)
    return {"value": value}


def record(source: NvmlSource) -> Recording:
    """Every answer of a started source: system calls, then per card each call."""
    out: Recording = {
        "driver_version": _answer(source.driver_version),
        "cuda_version": _answer(source.cuda_version),
        "cards": [],
    }
    for i in range(source.device_count()):
        card: CardRecord = {
            "uuid": _answer(source.uuid, i),
            "name": _answer(source.name, i),
            "memory": _answer(source.memory, i),
            "utilization": _answer(source.utilization, i),
            "compute_capability": _answer(source.compute_capability, i),
            "figures": {name: _answer(source.figure, i, name) for name in FIGURES},
        }
        out["cards"].append(card)
    out["xid_events"] = _answer(source.xid_events)
    return out


def main() -> int:
    source = PynvmlSource()
    try:
        source.init()
    except NvmlError as exc:
        print(json.dumps({"error": f"NVML did not start: {exc}"}))
        return 1
    try:
        print(json.dumps(record(source), indent=2, default=str))
    finally:
        source.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
