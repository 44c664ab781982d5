"""``nvidia-smi --query-gpu=... --format=csv`` read into the wire's ``GPU`` and ``GpuHealth``.

A pure parser, no IO. ``FULL_QUERY_FIELDS`` is what to ask for; ``parse_full_query_csv``
reads the answer. The text must carry its header row (``--format=csv`` or
``--format=csv,nounits``, never ``noheader``): columns are matched by name, so a
capture that asked for two hundred fields in another order parses too, and a field the
query did not ask for is simply absent.

Its contract:

- Values are read with or without units ("143771 MiB" or "143771", "512.30 W", "1980
  MHz", "61 %"); sizes take their unit from the value, else from the header's
  ``[MiB]``, else MiB. A number with a unit the field cannot have is not read.
- A figure that is absent, empty, or one of nvidia-smi's "no figure" words ("[N/A]",
  "N/A", "[Not Supported]", "[Unknown Error]", "[Requested functionality has been
  deprecated]", ...) is None, never 0. So is a missing column.
- The names nvidia-smi accepts as aliases (``clocks_throttle_reasons.*`` for
  ``clocks_event_reasons.*``, ``retired_pages.sbe``, ``clocks.sm``, ``gpu_uuid``...) are
  read as the names they stand for.
- Throttle reasons come from the ``clocks_event_reasons.active`` hex mask, decoded as
  NVML's is; without it, from the per-reason "Active"/"Not Active" columns.
- ``--query-gpu`` has no energy field (``nvidia-smi --help-query-gpu`` of 590.48.01
  lists none), so ``GPU.energy`` is always None here.
- Text without a header row, a header without ``index``, ``uuid`` and ``name``, a row
  whose cell count differs from the header's, or a row without a card index, UUID or
  name raises ``SmiCsvError`` (a ValueError).
"""

from __future__ import annotations

import re

from llmgw.agent.discovery.nvml import THROTTLE_BITS, decode_throttle
from llmgw.agent.discovery.smixml import no_figure
from llmgw.wire.hardware import GPU, GpuHealth

FULL_QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "pci.bus_id",
    "compute_cap",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
    "temperature.memory",
    "power.draw",
    "power.draw.instant",
    "enforced.power.limit",
    "clocks.current.sm",
    "clocks.current.memory",
    "fan.speed",
    "pstate",
    "clocks_event_reasons.active",
    "pcie.link.gen.gpucurrent",
    "pcie.link.gen.max",
    "pcie.link.gen.gpumax",
    "pcie.link.gen.hostmax",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "mig.mode.current",
    "persistence_mode",
    "ecc.mode.current",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "retired_pages.pending",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
)

# nvidia-smi's second names for a field (``--help-query-gpu``: '"uuid" or "gpu_uuid"').
_ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "gpu.power.draw.instant": "power.draw.instant",
    "gpu.power.draw.average": "power.draw.average",
    "gpu.power.current_limit": "enforced.power.limit",
    "gpu.power.requested_limit": "power.limit",
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
    "retired_pages.dbe": "retired_pages.double_bit.count",
    "remapped_rows.sbe": "remapped_rows.correctable",
    "remapped_rows.dbe": "remapped_rows.uncorrectable",
}
_OLD_THROTTLE = "clocks_throttle_reasons."
_THROTTLE = "clocks_event_reasons."
# Per-reason column suffix -> NVML bit (the names THROTTLE_BITS uses, as smixml maps them).
_REASON_NAMES = {
    "applications_clocks_setting": "applications_clocks",
    "display_clocks_setting": "display_clocks",
}
_REASON_BITS = {name: bit for bit, name in THROTTLE_BITS.items()}

_REQUIRED = ("index", "uuid", "name")
_HEADER = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_.]*)(?:\s*\[(?P<unit>[^\]]*)\])?$")
_NUMBER = re.compile(r"^(?P<num>-?\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z%]*)$")
_CAPABILITY = re.compile(r"^\d+\.\d+$")
_PSTATE = re.compile(r"^P\d{1,2}$")
_MASK = re.compile(r"^0[xX][0-9a-fA-F]+$")
_BYTES = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


class SmiCsvError(ValueError):
    """The text is not ``nvidia-smi --query-gpu`` CSV with a header row naming the card."""


def _canonical(name: str) -> str:
    if name.startswith(_OLD_THROTTLE):
        name = _THROTTLE + name.removeprefix(_OLD_THROTTLE)
    return _ALIASES.get(name, name)


def _header(line: str) -> list[tuple[str, str | None]] | None:
    """The header's (field, unit) columns; None when ``line`` is not a header row."""
    columns: list[tuple[str, str | None]] = []
    for cell in line.split(","):
        m = _HEADER.match(cell.strip())
        if m is None:
            return None
        columns.append((_canonical(m["name"]), m["unit"]))
    return columns


class _Row:
    """One card's cells by field name, with the readers for each kind of value."""

    def __init__(self, cells: dict[str, tuple[str, str | None]]) -> None:
        self._cells = cells

    def text(self, name: str) -> str | None:
        cell, _ = self._cells.get(name, ("", None))
        value = " ".join(cell.split())
        return None if no_figure(value) else value

    def _number(self, name: str, units: set[str]) -> float | None:
        value = self.text(name)
        if value is None:
            return None
        m = _NUMBER.match(value)
        if m is None or (m["unit"] and m["unit"] not in units):
            return None
        return float(m["num"])

    def integer(self, name: str, *units: str) -> int | None:
        number = self._number(name, set(units))
        return None if number is None else int(number)

    def real(self, name: str, *units: str) -> float | None:
        return self._number(name, set(units))

    def first_float(self, names: tuple[str, ...], *units: str) -> float | None:
        for name in names:
            number = self.real(name, *units)
            if number is not None:
                return number
        return None

    def first_int(self, names: tuple[str, ...]) -> int | None:
        for name in names:
            number = self.integer(name)
            if number is not None:
                return number
        return None

    def size(self, name: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        m = _NUMBER.match(value)
        if m is None:
            return None
        _, header_unit = self._cells[name]
        scale = _BYTES.get(m["unit"] or header_unit or "MiB")
        return None if scale is None else int(float(m["num"]) * scale)

    def flag(self, name: str, yes: str, no: str) -> bool | None:
        value = self.text(name)
        if value == yes:
            return True
        return False if value == no else None

    def throttle(self) -> list[str] | None:
        mask = self.text(_THROTTLE + "active")
        if mask is not None and _MASK.match(mask):
            return decode_throttle(int(mask, 16))
        bits: int | None = None
        for field in self._cells:
            if not field.startswith(_THROTTLE):
                continue
            suffix = field.removeprefix(_THROTTLE)
            bit = _REASON_BITS.get(_REASON_NAMES.get(suffix, suffix))
            state = self.text(field)
            if bit is None or state not in {"Active", "Not Active"}:
                continue
            bits = (bits or 0) | (bit if state == "Active" else 0)
        return None if bits is None else decode_throttle(bits)


def _sum(values: list[int | None]) -> int | None:
    given = [v for v in values if v is not None]
    return sum(given) if given else None


def _card(row: _Row, where: str) -> tuple[GPU, GpuHealth]:
    index, uuid, name = row.text("index"), row.text("uuid"), row.text("name")
    if index is None or not index.isdigit():
        raise SmiCsvError(f"{where}: no card index (got {index!r})")
    if uuid is None or name is None:
        raise SmiCsvError(f"{where}: card {index} has no uuid or name")
    cap = row.text("compute_cap")
    pstate = row.text("pstate")
    bus_id = row.text("pci.bus_id")
    mig = row.text("mig.mode.current")
    gpu = GPU(
        index=int(index),
        uuid=uuid,
        name=name,
        memory_total=row.size("memory.total"),
        memory_used=row.size("memory.used"),
        utilization=row.integer("utilization.gpu", "%"),
        compute_capability=cap if cap is not None and _CAPABILITY.match(cap) else None,
        driver=row.text("driver_version"),
        bus_id=bus_id.lower() if bus_id else None,
        memory_utilization=row.integer("utilization.memory", "%"),
        temperature=row.integer("temperature.gpu", "C"),
        memory_temperature=row.integer("temperature.memory", "C"),
        # The instant reading shows a spike; power.draw is the 1 s average from 530 on
        # and the only reading before.
        power=row.first_float(("power.draw.instant", "power.draw", "power.draw.average"), "W"),
        power_limit=row.first_float(("enforced.power.limit", "power.limit"), "W"),
        energy=None,
        sm_clock=row.integer("clocks.current.sm", "MHz"),
        memory_clock=row.integer("clocks.current.memory", "MHz"),
        fan=row.integer("fan.speed", "%"),
        pstate=pstate if pstate is not None and _PSTATE.match(pstate) else None,
        throttle=row.throttle(),
        pcie_gen=row.first_int(("pcie.link.gen.gpucurrent", "pcie.link.gen.current")),
        pcie_width=row.integer("pcie.link.width.current"),
        pcie_gen_max=row.integer("pcie.link.gen.max"),
        pcie_width_max=row.integer("pcie.link.width.max"),
        pcie_gen_device_max=row.integer("pcie.link.gen.gpumax"),
        pcie_gen_host_max=row.integer("pcie.link.gen.hostmax"),
        mig_mode=None if mig not in {"Enabled", "Disabled"} else mig == "Enabled",
    )
    health = GpuHealth(
        uuid=uuid,
        index=int(index),
        persistence_mode=row.flag("persistence_mode", "Enabled", "Disabled"),
        ecc_mode=row.flag("ecc.mode.current", "Enabled", "Disabled"),
        ecc_volatile_corrected=row.integer("ecc.errors.corrected.volatile.total"),
        ecc_volatile_uncorrected=row.integer("ecc.errors.uncorrected.volatile.total"),
        ecc_aggregate_corrected=row.integer("ecc.errors.corrected.aggregate.total"),
        ecc_aggregate_uncorrected=row.integer("ecc.errors.uncorrected.aggregate.total"),
        retired_pages=_sum(
            [
                row.integer("retired_pages.single_bit_ecc.count"),
                row.integer("retired_pages.double_bit.count"),
            ]
        ),
        retired_pending=row.flag("retired_pages.pending", "Yes", "No"),
        remapped_correctable=row.integer("remapped_rows.correctable"),
        remapped_uncorrectable=row.integer("remapped_rows.uncorrectable"),
        remap_pending=row.flag("remapped_rows.pending", "Yes", "No"),
        remap_failed=row.flag("remapped_rows.failure", "Yes", "No"),
    )
    return gpu, health


def parse_full_query_csv(text: str) -> tuple[list[GPU], list[GpuHealth]]:
    """The cards in ``nvidia-smi --query-gpu=... --format=csv[,nounits]`` output, as the
    fast figures (``GPU``) and the slow ones (``GpuHealth``), one of each per row in
    order. Raises SmiCsvError for text without a header naming index, uuid and name,
    or with a row that does not fit the header.
    """
    lines = [line for line in text.lstrip("\ufeff").splitlines() if line.strip()]
    if not lines:
        raise SmiCsvError("no header row: the text is empty")
    columns = _header(lines[0])
    if columns is None:
        raise SmiCsvError(
            f"line 1 is not a header row ({lines[0][:80]!r}); ask nvidia-smi with "
            "--format=csv or --format=csv,nounits, not noheader"
        )
    names = [name for name, _ in columns]
    missing = [f for f in _REQUIRED if f not in names]
    if missing:
        raise SmiCsvError(
            f"the header lacks {', '.join(missing)}: the query must ask for index, uuid and name"
        )
    gpus: list[GPU] = []
    health: list[GpuHealth] = []
    for n, line in enumerate(lines[1:], start=2):
        # nvidia-smi never quotes; none of the fields read here holds a comma.
        cells = line.split(",")
        if len(cells) != len(columns):
            raise SmiCsvError(
                f"line {n}: {len(cells)} fields where the header has {len(columns)}: {line[:80]!r}"
            )
        by_name: dict[str, tuple[str, str | None]] = {}
        for (name, unit), cell in zip(columns, cells, strict=True):
            by_name.setdefault(name, (cell, unit))
        gpu, card = _card(_Row(by_name), f"line {n}")
        gpus.append(gpu)
        health.append(card)
    return gpus, health
