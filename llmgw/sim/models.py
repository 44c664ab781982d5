"""The simulated catalog: MODELS.yaml read into the catalog's own ``Model`` objects, and
the speed a replica of each runs at where it was placed.

Each entry is what ``llmgw ctl model serve`` takes, by the API's field names
(``ServeRequest``: source, name, engine, replicas, context, slots, gpus, cpu_cores,
memory, nodes, selector, role, card_class, priority...), checked by the API's own
reader and the catalog's ``check_model``, plus what the simulation cannot read from
the source itself: ``shape`` (the model's shape, as ``ctl model show --json`` shows
it) and, where measured, ``tokens_per_second`` and ``prefill_tokens_per_second``.

Speeds not given are worked out as the planner works out a CPU's (``sizing``): a
token reads the model's active weights once, at 0.68 of the memory rate of the cards
it is split over (the card table's bandwidth) or of the node (its measured
``memory_read_gbs``); a prompt's tokens are compute-bound, 2 FLOP a parameter at 0.4 of
the cards' dense BF16 rate. A speed that cannot be worked out (a CPU's prefill, a card
not in the table) is a clear error asking for the measured figure.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from llmgw.client.ctl_models import parse_size
from llmgw.modelkit.sizing import ModelShape, active_share, cpu_tokens_per_second
from llmgw.server.catalog import model as catalog
from llmgw.server.catalog.model import CatalogError, Model
from llmgw.server.catalog.service import asked
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.requests import ServeRequest
from llmgw.server.schema import Invalid, read
from llmgw.sim.cards import SimError, by_name
from llmgw.wire.hardware import GPU

PREFILL_EFFICIENCY = 0.4
SIM_FIELDS = ("shape", "tokens_per_second", "prefill_tokens_per_second")


@dataclass(frozen=True)
class SimModel:
    model: Model
    shape: ModelShape | None
    # Measured figures for one replica, when MODELS.yaml gives them.
    tokens_per_second: float | None = None
    prefill_tokens_per_second: float | None = None


@dataclass(frozen=True)
class Speed:
    """One replica's: tokens a second of one reply, prompt tokens a second, and the
    board power of its cards (None for a replica on the CPU, or cards of unknown power)."""

    decode: float
    prefill: float
    power_w: float | None


def read_models(path: Path, largest: Sequence[int], largest_host: int) -> list[SimModel]:
    """MODELS.yaml: a list of models (or ``models:`` holding one). ``largest`` is the
    largest card's memory and ``largest_host`` the largest node's, for a default context
    as ``serve`` chooses it."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SimError(f"--models {path}: cannot read it: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SimError(f"--models {path}: not YAML: {exc}") from None
    if isinstance(data, dict) and "models" in data:
        data = data["models"]
    if not isinstance(data, list) or not data:
        raise SimError(f"--models {path}: give a list of models, each as `ctl model serve` takes")
    out: list[SimModel] = []
    names: set[str] = set()
    for i, entry in enumerate(data, start=1):
        where = f"--models {path}: model {i}"
        sim = _one(entry, where, largest, largest_host)
        if sim.model.name in names:
            raise SimError(f"{where}: {sim.model.name} is named twice; give each its own name")
        names.add(sim.model.name)
        out.append(sim)
    return out


def _rate(entry: Mapping[str, Any], key: str, where: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise SimError(f"{where}: {key} must be a number of tokens a second above 0")
    return float(value)


def _shape(given: object, where: str) -> ModelShape | None:
    if given is None:
        return None
    if not isinstance(given, dict):
        raise SimError(f"{where}: shape must be a mapping of the model's figures")
    known = {f.name for f in fields(ModelShape)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise SimError(
            f"{where}: shape.{unknown[0]} is not a figure of a shape (they are: "
            f"{', '.join(sorted(known))})"
        )
    # The figures a shape must name are None (not known) when left out.
    values: dict[str, Any] = {f.name: None for f in fields(ModelShape) if f.default is MISSING}
    values.update(given)
    if isinstance(values.get("file_bytes"), str):
        values["file_bytes"] = _size(values["file_bytes"], f"{where}: shape.file_bytes")
    if not isinstance(values.get("file_bytes"), int) or values["file_bytes"] <= 0:
        raise SimError(f"{where}: shape.file_bytes (the weights' size, like 16GiB) is required")
    try:
        return ModelShape(**values)
    except TypeError as exc:
        raise SimError(f"{where}: shape: {exc}") from None


def _size(value: str, where: str) -> int:
    try:
        return parse_size(value)
    except argparse.ArgumentTypeError as exc:
        raise SimError(f"{where}: {exc}") from None


def _one(entry: object, where: str, largest: Sequence[int], largest_host: int) -> SimModel:
    if not isinstance(entry, dict):
        raise SimError(f"{where}: a model is a mapping of what `ctl model serve` takes")
    ask_fields = {k: v for k, v in entry.items() if k not in SIM_FIELDS}
    if isinstance(ask_fields.get("memory"), str):
        ask_fields["memory"] = _size(ask_fields["memory"], f"{where}: memory")
    try:
        ask = read(ServeRequest, ask_fields)
    except Invalid as exc:
        raise SimError(f"{where}: {exc}") from None
    if ask.on_demand:
        raise SimError(
            f"{where}: on-demand models are not simulated (their start on a first request "
            "is not modelled): leave on_demand out to simulate it always up"
        )
    shape = _shape(entry.get("shape"), where)
    try:
        source = catalog.check_source(ask.source, ask.allow_pickle)
        name = catalog.check_name(ask.name or catalog.default_name(source))
    except CatalogError as exc:
        raise SimError(f"{where}: {exc}") from None
    where = f"{where} ({name})"
    if shape is None and ask.memory is None:
        raise SimError(
            f"{where}: give its shape (shape: file_bytes, parameters, layers...) or "
            "memory (per replica, like 8GiB): the simulation cannot read the source"
        )
    engine = ask.engine or catalog.default_engine(source)
    room = (max(largest) if largest else None) if ask.gpus else largest_host
    context = ask.context or catalog.default_context(shape, room, ask.slots)
    model = asked(ask, name, source, engine, context)
    try:
        model = catalog.check_model(model, shape)
    except CatalogError as exc:
        raise SimError(f"{where}: {exc}") from None
    return SimModel(
        model,
        shape,
        _rate(entry, "tokens_per_second", where),
        _rate(entry, "prefill_tokens_per_second", where),
    )


def speed(sim: SimModel, view: NodeView, cards: Sequence[str], nodes: int = 1) -> Speed:
    """How fast a replica of ``sim`` runs on ``cards`` of ``view`` (spanning ``nodes``
    nodes of the same kind), or SimError naming the figure to give."""
    held = set(cards)
    gpus: list[GPU] = [g for g in view.figures().gpus if g.uuid in held]
    name = sim.model.name
    table = [(g, by_name(g.name)) for g in gpus]
    unknown = next((g.name for g, t in table if t is None), None)
    types = [t for _, t in table if t is not None]
    power: float | None = None
    if gpus:
        powers = [g.power_limit or (t.power_w if t else None) for g, t in table]
        power = None if None in powers else sum(p or 0.0 for p in powers) * nodes
    decode, prefill, shape = sim.tokens_per_second, sim.prefill_tokens_per_second, sim.shape
    if decode is None:
        if shape is None:
            raise SimError(f"{name}: give tokens_per_second, or its shape to work it out")
        if unknown is not None:
            raise SimError(
                f"{name}: the card {unknown!r} on {view.id} is not in the simulation's "
                "table: give tokens_per_second and prefill_tokens_per_second as measured"
            )
        if gpus:
            rate = sum(t.bandwidth_gbs for t in types) * nodes
        else:
            gbs = view.live.memory_read_gbs
            if gbs is None:
                raise SimError(
                    f"{name}: {view.id} has no measured memory rate (memory_read_gbs): "
                    "give tokens_per_second as measured"
                )
            rate = gbs * nodes
        decode = cpu_tokens_per_second(shape, rate)
    if prefill is None:
        params = shape.parameters if shape is not None else None
        if not gpus or shape is None or params is None or unknown is not None:
            why = "on the CPU" if not gpus else "without shape.parameters and known cards"
            raise SimError(
                f"{name}: its prompt rate cannot be worked out {why}: give "
                "prefill_tokens_per_second as measured"
            )
        flops = sum(t.tflops for t in types) * nodes * 1e12 * PREFILL_EFFICIENCY
        prefill = flops / (2 * params * active_share(shape))
    return Speed(decode, prefill, power)
