"""What happens to the simulated fleet: the requests of a trace, and the failures and
drains the operator asks about.

A trace (``--load TRACE.jsonl``) is one request a line, a JSON object::

    {"at": 12.5, "model": "llama-70b", "prompt_tokens": 800, "output_tokens": 200}

``at`` is seconds from the start of the simulation; lines need not be in order. A line
that is blank or starts with ``#`` is skipped. An event (``--fail``) is
``node=NAME@WHEN`` (the node dies: its agent and its engines go silent) or
``drain=NAME@WHEN`` (``ctl node drain``: its replicas move elsewhere, then it idles),
``WHEN`` a duration from the start (``10m``, ``90s``, ``1h``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmgw.cliargs import parse_duration
from llmgw.sim.cards import SimError

EventKind = Literal["node", "drain"]
TRACE_FIELDS = ("at", "model", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class Request:
    at: float
    model: str
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class FleetEvent:
    kind: EventKind
    node: str
    at: float

    def describe(self) -> str:
        what = "fails" if self.kind == "node" else "is drained"
        return f"{self.node} {what} at {self.at:g} s"


def parse_event(spec: str) -> FleetEvent:
    """``node=gpu17@10m`` or ``drain=gpu17@30m``."""
    kind, _, rest = spec.partition("=")
    node, _, when = rest.partition("@")
    if kind not in ("node", "drain") or not node or not when:
        raise SimError(
            f"--fail {spec!r}: give node=NAME@WHEN (the node fails) or drain=NAME@WHEN "
            "(it is drained), like node=gpu17@10m"
        )
    try:
        at = parse_duration(when)
    except argparse.ArgumentTypeError as exc:
        raise SimError(f"--fail {spec!r}: {exc}") from None
    return FleetEvent("node" if kind == "node" else "drain", node, float(at))


def check_events(events: Iterable[FleetEvent], nodes: Collection[str]) -> None:
    for e in events:
        if e.node not in nodes:
            some = ", ".join(sorted(nodes)[:3])
            raise SimError(
                f"--fail {e.kind}={e.node}@{e.at:g}s: no node {e.node!r} in the fleet "
                f"(its nodes are named like {some})"
            )


def _count(obj: dict[str, object], key: str, where: str, least: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SimError(f"{where}: {key} must be a whole number of tokens, {least} or more")
    return value


def parse_line(text: str, where: str, models: Collection[str]) -> Request | None:
    """One line of a trace, None for a blank or comment line, or SimError naming it."""
    text = text.strip()
    if not text or text.startswith("#"):
        return None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise SimError(f"{where}: not a JSON object ({exc})") from None
    if not isinstance(obj, dict):
        raise SimError(f"{where}: a request is a JSON object with {', '.join(TRACE_FIELDS)}")
    unknown = sorted(set(obj) - set(TRACE_FIELDS))
    if unknown:
        raise SimError(
            f"{where}: unknown field {unknown[0]!r} (a request has {', '.join(TRACE_FIELDS)})"
        )
    at = obj.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < 1e9:
        raise SimError(f"{where}: at must be seconds from the start, 0 or more")
    model = obj.get("model")
    if not isinstance(model, str) or model not in models:
        raise SimError(
            f"{where}: model {model!r} is not in MODELS.yaml (it has {', '.join(sorted(models))})"
        )
    return Request(
        float(at),
        model,
        _count(obj, "prompt_tokens", where, 1),
        _count(obj, "output_tokens", where, 1),
    )


def read_trace(path: Path, models: Collection[str], duration: float | None) -> list[Request]:
    """Every request of the trace before ``duration`` (all when None), by time."""
    out: list[Request] = []
    try:
        with path.open() as f:
            for n, line in enumerate(f, start=1):
                req = parse_line(line, f"--load {path}: line {n}", models)
                if req is not None and (duration is None or req.at < duration):
                    out.append(req)
    except OSError as exc:
        raise SimError(f"--load {path}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SimError(f"--load {path}: not text (a trace is JSON lines)") from None
    out.sort(key=lambda r: r.at)
    return out
