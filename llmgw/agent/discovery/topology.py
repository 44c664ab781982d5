"""How a node's cards and NICs are wired to each other: the ``nvidia-smi topo -m`` parser.

``parse_topo`` is pure. It reads the matrix nvidia-smi prints: a header naming the
device columns (``GPU0``.., ``NIC0``.., or on older drivers the NIC's own name such as
``mlx5_0``) followed by the per-card attribute columns (``CPU Affinity``, ``NUMA
Affinity`` and, on newer drivers, ``GPU NUMA ID``); one row per device; then the
``Legend:`` block (skipped) and the ``NIC Legend:`` block that names each NIC.

Captured straight from a terminal, nvidia-smi underlines the header with ANSI escape
codes and separates cells with tabs (padding some with an extra, empty one); both are
taken off before reading, so cells are split on any run of whitespace.

A figure not printed, or printed as ``N/A``, is None. A table that cannot be read
(no header, a row of the wrong width, a row naming no column) raises
``TopologyFormatError`` naming the line, rather than a half-read topology that would
place work on the wrong NUMA node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The attribute columns are the only header cells with spaces in their names.
_ATTRIBUTES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_HEADER_CELL = re.compile("|".join(re.escape(a) for a in _ATTRIBUTES) + r"|\S+")
_GPU = re.compile(r"^GPU(?P<index>\d+)$")
_NVLINK = re.compile(r"^NV\d+$")
# X (self), SYS, NODE, PHB, PXB, PIX, PXN, C2C, NV#: upper-case words, maybe numbered.
_LINK = re.compile(r"^[A-Z][A-Z0-9]*$")
_NIC_LEGEND = re.compile(r"^\s*(?P<nic>NIC\d+)\s*:\s*(?P<device>\S+)\s*$")


class TopologyFormatError(ValueError):
    """nvidia-smi topo -m printed something that is not the matrix we read."""


@dataclass(frozen=True)
class CardTopology:
    """One card's row: where it sits (CPUs, NUMA node) and how it reaches every peer.

    ``links`` maps each other GPU and NIC column to its connection type as printed
    ("NV18", "SYS", "NODE", "PIX", ...); the card's own "X" is left out.
    ``nvlink_peers`` are the GPUs reached over NVLink (an ``NV#`` link), in column order.
    """

    name: str
    index: int
    cpu_affinity: str | None
    numa: int | None
    gpu_numa_id: int | None
    links: dict[str, str] = field(default_factory=dict)
    nvlink_peers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Topology:
    """The matrix as read: the cards, the NIC columns, and each NIC's device name.

    ``nics`` are the NIC columns as headed (``NIC0``..); ``nic_devices`` maps each to
    the device the ``NIC Legend`` names (``NIC0`` -> ``mlx5_0``), empty when there is
    no legend (older drivers head the column with the device name itself).
    """

    cards: list[CardTopology]
    nics: list[str] = field(default_factory=list)
    nic_devices: dict[str, str] = field(default_factory=dict)

    def card(self, card: str | int) -> CardTopology | None:
        """The card named "GPU3" or with index 3, None when the matrix has no such row."""
        for c in self.cards:
            if c.name == card or c.index == card:
                return c
        return None

    def nic_column(self, nic: str) -> str | None:
        """The column of a NIC given as its column ("NIC0") or its device ("mlx5_0")."""
        if nic in self.nics:
            return nic
        for column, device in self.nic_devices.items():
            if device == nic:
                return column
        return None

    def nic_distance(self, card: str | int, nic: str) -> str | None:
        """How ``card`` reaches ``nic`` ("PIX", "NODE", "SYS", ...); None if either is unknown."""
        c = self.card(card)
        column = self.nic_column(nic)
        if c is None or column is None:
            return None
        return c.links.get(column)


def _absent(cell: str | None) -> bool:
    return cell is None or cell.strip().upper() in {"", "N/A", "NA"}


def _int_or_none(cell: str | None) -> int | None:
    # "0" is a NUMA node; "N/A" (no NUMA, or a VM that hides it) is no figure, not node 0.
    if cell is None:
        return None
    c = cell.strip()
    return int(c) if c.isdigit() else None


def _strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _header(line: str, number: int) -> tuple[list[str], list[str]]:
    cells = _HEADER_CELL.findall(line)
    devices: list[str] = []
    attributes: list[str] = []
    for cell in cells:
        if cell in _ATTRIBUTES:
            attributes.append(cell)
        elif attributes:
            raise TopologyFormatError(
                f"line {number}: device column {cell!r} after the attribute columns: {line!r}"
            )
        else:
            devices.append(cell)
    if not any(_GPU.match(d) for d in devices):
        raise TopologyFormatError(f"line {number}: not a topo -m header (no GPU column): {line!r}")
    if len(set(devices)) != len(devices):
        raise TopologyFormatError(f"line {number}: a device column is named twice: {line!r}")
    return devices, attributes


def _row(
    line: str, number: int, devices: list[str], attributes: list[str]
) -> tuple[str, dict[str, str], dict[str, str]]:
    cells = line.split()
    name = cells[0]
    if name not in devices:
        raise TopologyFormatError(f"line {number}: row {name!r} is not a header column: {line!r}")
    link_cells = cells[1 : 1 + len(devices)]
    rest = cells[1 + len(devices) :]
    if len(link_cells) < len(devices):
        raise TopologyFormatError(
            f"line {number}: {len(link_cells)} link cells for {len(devices)} columns: {line!r}"
        )
    for cell in link_cells:
        if not _LINK.match(cell):
            raise TopologyFormatError(f"line {number}: {cell!r} is not a link type: {line!r}")
    if len(rest) > len(attributes):
        raise TopologyFormatError(
            f"line {number}: {len(rest)} cells after the links for {len(attributes)} "
            f"attribute columns: {line!r}"
        )
    links = {d: v for d, v in zip(devices, link_cells, strict=True) if d != name}
    values = dict(zip(attributes, rest, strict=False))
    return name, links, values


def parse_topo(text: str) -> Topology:
    """Read ``nvidia-smi topo -m`` output; raises TopologyFormatError on a table it cannot read."""
    lines = _strip_ansi(text).splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        raise TopologyFormatError("line 1: no topo -m table (the output is empty)")
    header_number, header_line = numbered[0]
    devices, attributes = _header(header_line, header_number)
    nics = [d for d in devices if not _GPU.match(d)]

    cards: list[CardTopology] = []
    seen: set[str] = set()
    in_table = True
    nic_devices: dict[str, str] = {}
    in_nic_legend = False
    previous = header_number
    for number, line in numbered[1:]:
        stripped = line.strip()
        if in_table and (number != previous + 1 or stripped.endswith("Legend:")):
            in_table = False  # the table ends at the first blank line or legend
        previous = number
        if in_table:
            name, links, values = _row(line, number, devices, attributes)
            if name in seen:
                raise TopologyFormatError(f"line {number}: row {name!r} appears twice: {line!r}")
            seen.add(name)
            gpu = _GPU.match(name)
            if gpu is None:
                continue  # a NIC's row repeats what the card rows already say
            cpus = values.get("CPU Affinity")
            cards.append(
                CardTopology(
                    name=name,
                    index=int(gpu["index"]),
                    cpu_affinity=None if _absent(cpus) else cpus,
                    numa=_int_or_none(values.get("NUMA Affinity")),
                    gpu_numa_id=_int_or_none(values.get("GPU NUMA ID")),
                    links=links,
                    nvlink_peers=tuple(
                        d for d, v in links.items() if _GPU.match(d) and _NVLINK.match(v)
                    ),
                )
            )
            continue
        if stripped == "NIC Legend:":
            in_nic_legend = True
        elif stripped.endswith("Legend:"):
            in_nic_legend = False
        elif in_nic_legend and (m := _NIC_LEGEND.match(line)):
            nic_devices[m["nic"]] = m["device"]
    if not cards:
        raise TopologyFormatError(f"line {header_number}: a header but no GPU rows under it")
    return Topology(cards=cards, nics=nics, nic_devices=nic_devices)
