"""nvidia-smi as the fallback when NVML does not answer: the query, its run, its parser.

``parse_query_gpu_csv`` is pure and reads both forms nvidia-smi prints: the one we ask
for (``--format=csv,noheader,nounits``, columns in QUERY_FIELDS order) and the plain
``--format=csv`` one, whose header names the columns and whose values carry units
("143771 MiB", "0 %"). With a header, columns are matched by name, so a capture that
asked for two hundred fields parses too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmgw.agent import command
from llmgw.agent.discovery.nvlinktext import parse_nvlink_errors, parse_nvlink_status
from llmgw.agent.discovery.smicsv import FULL_QUERY_FIELDS, SmiCsvError, parse_full_query_csv
from llmgw.agent.discovery.smitext import SmiTextError, parse_smi_text
from llmgw.agent.discovery.smixml import SmiXml, SmiXmlError, no_figure, parse_smi_xml
from llmgw.agent.discovery.topology import TopologyFormatError, parse_topo
from llmgw.wire.hardware import GPU, CardLinks, GpuHealth, GpuTopology

QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "compute_cap",
    "driver_version",
)
# compute_cap came with driver 510; an older nvidia-smi refuses the whole query for it.
OLD_DRIVER_FIELDS = tuple(f for f in QUERY_FIELDS if f != "compute_cap")

_HEADER = re.compile(r"^(?P<name>[A-Za-z_.]+)(?:\s*\[(?P<unit>[^\]]*)\])?$")
_NUMBER = re.compile(r"^(?P<num>-?\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z%]*)$")
_CAPABILITY = re.compile(r"^\d+\.\d+$")
_SCALE = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

DRIVER_FIX = (
    "run `nvidia-smi` by hand; check the driver is loaded (`lsmod | grep nvidia`) and, "
    "after a driver upgrade, reboot (a 'Driver/library version mismatch' needs one)"
)


class NvidiaSmiFormatError(ValueError):
    """nvidia-smi printed something that is not the CSV we asked for."""


@dataclass
class SmiReading:
    """One nvidia-smi run: cards (None when not read), and what went wrong.

    ``installed`` is False when there is no nvidia-smi to run: no NVIDIA software on
    the node, which means no cards, not a fault.
    """

    gpus: list[GPU] | None
    installed: bool = True
    warnings: list[str] = field(default_factory=list)


def _column(cell: str) -> tuple[str, str | None]:
    m = _HEADER.match(cell.strip())
    if m is None:
        return cell.strip(), None
    return m["name"], m["unit"]


def _bytes(cell: str, header_unit: str | None) -> int | None:
    m = _NUMBER.match(cell.strip())
    if m is None:
        return None
    scale = _SCALE.get(m["unit"] or header_unit or "MiB")
    if scale is None:
        return None
    return int(float(m["num"]) * scale)


def _percent(cell: str) -> int | None:
    m = _NUMBER.match(cell.strip())
    if m is None or m["unit"] not in {"", "%"}:
        return None
    return int(float(m["num"]))


def _row(values: dict[str, tuple[str, str | None]], where: str) -> GPU:
    def text(name: str) -> str | None:
        cell, _ = values.get(name, ("", None))
        return None if no_figure(cell) else cell.strip()

    def size(name: str) -> int | None:
        cell, unit = values.get(name, ("", None))
        return None if no_figure(cell) else _bytes(cell, unit)

    index, uuid, name = text("index"), text("uuid"), text("name")
    if index is None or not index.isdigit():
        raise NvidiaSmiFormatError(f"{where}: no card index")
    if uuid is None or name is None:
        raise NvidiaSmiFormatError(f"{where}: card {index} has no uuid or name")
    util = text("utilization.gpu")
    cap = text("compute_cap")
    return GPU(
        index=int(index),
        uuid=uuid,
        name=name,
        memory_total=size("memory.total"),
        memory_used=size("memory.used"),
        utilization=_percent(util) if util else None,
        compute_capability=cap if cap and _CAPABILITY.match(cap) else None,
        driver=text("driver_version"),
    )


def parse_query_gpu_csv(text: str, fields: Sequence[str] = QUERY_FIELDS) -> list[GPU]:
    """The cards in ``nvidia-smi --query-gpu`` CSV output, with or without header and units.

    ``fields`` names the columns when there is no header line. Any absent marker reads
    as None. Raises NvidiaSmiFormatError for text that is not such a CSV.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    first = [c.strip() for c in lines[0].split(",")]
    header = [_column(c) for c in first]
    if {"index", "uuid"} <= {n for n, _ in header}:
        columns, rows, start = header, lines[1:], 2
    else:
        columns, rows, start = [(f, None) for f in fields], lines, 1
    gpus: list[GPU] = []
    for n, line in enumerate(rows, start=start):
        # nvidia-smi never quotes; no field we read (names included) holds a comma.
        cells = line.split(",")
        if len(cells) != len(columns):
            raise NvidiaSmiFormatError(
                f"line {n}: {len(cells)} fields where {len(columns)} were expected: {line[:80]!r}"
            )
        values = {name: (cell, unit) for (name, unit), cell in zip(columns, cells, strict=True)}
        gpus.append(_row(values, f"line {n}"))
    return gpus


async def _run(args: Sequence[str], timeout: float) -> tuple[int, str]:
    done = await command.run(args, timeout)
    return done.code, done.out


def _first_line(output: str) -> str:
    for line in output.splitlines():
        if line.strip():
            return line.strip()[:200]
    return "no output"


async def run_nvidia_smi(command: Sequence[str], timeout: float = 10.0) -> SmiReading:
    """Ask nvidia-smi for the cards; a missing binary is "no cards", a failure a warning."""
    fields: Sequence[str] = QUERY_FIELDS
    for attempt in range(2):
        query = [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        try:
            rc, output = await _run([*command, *query], timeout)
        except FileNotFoundError:
            return SmiReading(gpus=[], installed=False)
        except TimeoutError:
            return SmiReading(
                None,
                warnings=[f"nvidia-smi: no answer in {timeout:g} s. Fix: {DRIVER_FIX}"],
            )
        except OSError as exc:
            return SmiReading(
                None,
                warnings=[
                    f"nvidia-smi: could not run ({exc}). Fix: make {command[0]} executable "
                    "for the agent's user, or point the agent at the right binary"
                ],
            )
        if rc != 0 and attempt == 0 and "not a valid field" in output:
            fields = OLD_DRIVER_FIELDS
            continue
        break
    if rc == 6 or "No devices were found" in output:
        return SmiReading(
            gpus=[],
            warnings=[
                "nvidia-smi: no devices were found. Fix: in a container, pass the cards "
                "in (`--gpus all`, NVIDIA_VISIBLE_DEVICES); else check `lspci | grep -i "
                "nvidia` and the driver"
            ],
        )
    if rc != 0:
        return SmiReading(
            None,
            warnings=[f"nvidia-smi: failed (exit {rc}): {_first_line(output)}. Fix: {DRIVER_FIX}"],
        )
    try:
        return SmiReading(parse_query_gpu_csv(output, fields))
    except NvidiaSmiFormatError as exc:
        return SmiReading(
            None,
            warnings=[
                f"nvidia-smi: unreadable output ({exc}). Fix: check that {command[0]} is "
                "NVIDIA's nvidia-smi and not a wrapper that prints something else"
            ],
        )


async def _run_text(command: Sequence[str], args: Sequence[str], timeout: float) -> str | None:
    """What ``command args`` printed when it ran and exited 0; None when it did not."""
    try:
        rc, output = await _run([*command, *args], timeout)
    except (OSError, TimeoutError):
        return None
    return output if rc == 0 else None


async def run_nvidia_smi_xml(
    command: Sequence[str], timeout: float = 10.0
) -> tuple[SmiXml, str | None] | None:
    """Every figure nvidia-smi gives: ``-q -x`` read (with its text, which also holds
    the MIG devices), else the plain ``-q`` (text None); None when neither can be read
    (the caller falls back to the CSV query, which says why in its warnings)."""
    for args, parse in ((["-q", "-x"], parse_smi_xml), (["-q"], parse_smi_text)):
        output = await _run_text(command, args, timeout)
        if output is None:
            continue
        try:
            return parse(output), output if parse is parse_smi_xml else None
        except (SmiXmlError, SmiTextError):
            continue
    return None


async def run_nvidia_smi_full_csv(
    command: Sequence[str], timeout: float = 10.0
) -> tuple[list[GPU], list[GpuHealth]] | None:
    """``--query-gpu`` with every health field (``smicsv.FULL_QUERY_FIELDS``) and a
    header; None when this nvidia-smi will not answer it (an older one refuses the
    whole query for one field it does not know)."""
    query = [f"--query-gpu={','.join(FULL_QUERY_FIELDS)}", "--format=csv"]
    output = await _run_text(command, query, timeout)
    if output is None:
        return None
    try:
        return parse_full_query_csv(output)
    except SmiCsvError:
        return None


# The warning when MIG-mode cards' instances could not be listed: what they hold is not
# known (doctor says so, not "no instance carved").
MIG_UNLISTED = "nvidia-smi -L: the MIG instances could not be listed"


async def run_nvidia_smi_list(command: Sequence[str], timeout: float = 10.0) -> str | None:
    """``nvidia-smi -L``'s text (cards and their MIG instances); None when it fails."""
    return await _run_text(command, ["-L"], timeout)


async def run_nvidia_smi_nvlink_status(
    command: Sequence[str], timeout: float = 10.0
) -> dict[str, list[bool]] | None:
    """``nvidia-smi nvlink -s`` read (see ``nvlinktext``); None when it fails or names
    no card (no NVLink support, "No devices were found")."""
    output = await _run_text(command, ["nvlink", "-s"], timeout)
    found = parse_nvlink_status(output) if output is not None else {}
    return found or None


async def run_nvidia_smi_nvlink_errors(
    command: Sequence[str], timeout: float = 10.0
) -> dict[str, dict[str, int]] | None:
    """``nvidia-smi nvlink -e`` read (see ``nvlinktext``); None when it fails or names
    no card."""
    output = await _run_text(command, ["nvlink", "-e"], timeout)
    found = parse_nvlink_errors(output) if output is not None else {}
    return found or None


async def run_nvidia_smi_topo(command: Sequence[str], timeout: float = 10.0) -> GpuTopology | None:
    """``nvidia-smi topo -m`` as the node's wiring; None when it cannot be read."""
    output = await _run_text(command, ["topo", "-m"], timeout)
    if output is None:
        return None
    try:
        found = parse_topo(output)
    except TopologyFormatError:
        return None
    cards = []
    for card in found.cards:
        gpus = {k.removeprefix("GPU"): v for k, v in card.links.items() if k.startswith("GPU")}
        nics = {
            found.nic_devices.get(k, k): v for k, v in card.links.items() if not k.startswith("GPU")
        }
        cards.append(
            CardLinks(
                index=card.index,
                numa_node=card.numa,
                cpu_affinity=card.cpu_affinity,
                gpus=gpus,
                nics=nics,
            )
        )
    return GpuTopology(cards=cards)
