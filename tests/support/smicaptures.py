"""Stand-in ``nvidia-smi`` scripts built from the team's shared captures
(``../shared/fixtures``, listed with their sources in its ``SOURCES.md``): one card shape
per script, each answering the commands the agent runs (``-q -x``, ``-q``, the
``--query-gpu`` CSV queries, ``-L``, ``nvlink -s``/``-e``, ``topo -m``) with a capture's
text, and failing every other command as a driverless nvidia-smi does (exit 9).

Which capture answers what (each shape is a node of its own):

==================  ==========================================================  =====
shape               answers                                                     cards
==================  ==========================================================  =====
``h100x8-xml``      ``-q -x`` 8x H100 HBM3; ``topo -m`` 8x H100 NV18; NVLink     8
                    ``-s`` of 8x A100 and ``-e`` of an A100's GPU 0
``gb200x4-xml``     ``-q -x`` 4x GB200 in an NVLink domain (fabric, clique)     4
``a100-mig-xml``    ``-q -x`` A100 with MIG enabled (no ``-L`` was captured)    1
``a5000x2-xml``     ``-q -x`` 2x RTX A5000; ``nvlink -s`` of a 2-card bridge    2
``rtx4090-xml``     ``-q -x`` a GeForce RTX 4090                                1
``h100x8-text``     plain ``-q`` 8x H100 SXM (535, no XML)                      8
``h100-mig-text``   plain ``-q`` H100 with MIG enabled and its ``-L``: four     4
                    MIG instances, each a card with its class
``h200-csv``        ``--query-gpu`` with a header (about 230 fields), H200;     1
                    ``topo -m`` of the same H200 VM, raw ANSI
``unread-csv``      the H200 CSV with every value but index, uuid and name      1
                    made ``[N/A]``: a card with every figure absent
==================  ==========================================================  =====

``nvidia-smi-L_H200-MIG-enabled`` is not used: the agent reads ``-L`` only for a card
that ``-q -x`` or ``-q`` says is in MIG mode, and no H200 ``-q`` capture is in MIG mode.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.support.shared import SHARED_FIXTURES

SHARED = SHARED_FIXTURES

# Patterns of ``case "$*"`` for each command the agent runs.
XML = '"-q -x"'
TEXT = '"-q"'
FULL_CSV = '"--query-gpu="*" --format=csv"'
LIST = '"-L"'
NVLINK_STATUS = '"nvlink -s"'
NVLINK_ERRORS = '"nvlink -e"'
TOPO = '"topo -m"'


@dataclass(frozen=True)
class Shape:
    name: str
    # case pattern -> capture file name under SHARED (or a path written by ``install``)
    answers: dict[str, str]
    cards: int
    # The model each card shows (a MIG instance: its class).
    model: str


SHAPES = (
    Shape(
        "h100x8-xml",
        {
            XML: "nvidia-smi-q-x_8xH100-80GB-HBM3_580.105.08.xml",
            TOPO: "nvidia-smi-topo-m_8xH100-NV18_8NIC_570.133.20.txt",
            NVLINK_STATUS: "nvidia-smi-nvlink-s_8xA100-SXM4-80GB.txt",
            NVLINK_ERRORS: "nvidia-smi-nvlink-e_A100-SXM4-40GB_GPU0_535.161.08.txt",
        },
        8,
        "NVIDIA H100 80GB HBM3",
    ),
    Shape("gb200x4-xml", {XML: "nvidia-smi-q-x_4xGB200-fabric_580.173.02.xml"}, 4, "NVIDIA GB200"),
    Shape(
        "a100-mig-xml",
        {XML: "nvidia-smi-q-x_A100-SXM4-80GB_MIG-enabled_535.54.03.xml"},
        1,
        "NVIDIA A100-SXM4-80GB",
    ),
    Shape(
        "a5000x2-xml",
        {
            XML: "nvidia-smi-q-x_2xRTX-A5000-workstation_590.44.01.xml",
            NVLINK_STATUS: (
                "nvidia-smi-nvlink-s_2xH100-PCIe-NVLink-bridge_inactive-links_555.42.02.txt"
            ),
        },
        2,
        "NVIDIA RTX A5000",
    ),
    Shape(
        "rtx4090-xml",
        {XML: "nvidia-smi-q-x_RTX-4090-consumer_535.86.05.xml"},
        1,
        "NVIDIA GeForce RTX 4090",
    ),
    Shape(
        "h100x8-text", {TEXT: "nvidia-smi-q_8xH100-SXM_535.183.01.txt"}, 8, "NVIDIA H100 80GB HBM3"
    ),
    Shape(
        "h100-mig-text",
        {
            TEXT: "nvidia-smi-q_H100-MIG-enabled_590.48.01.txt",
            LIST: "nvidia-smi-L_H100-MIG-enabled_590.48.01.txt",
        },
        4,
        "h100-80g-mig-",
    ),
    Shape(
        "h200-csv",
        {
            FULL_CSV: "nvidia-smi-query-gpu-csv_H200_590.48.01_idle.csv",
            TOPO: "nvidia-smi-topo-m_1xH200-VM_raw-ansi_590.48.01.txt",
        },
        1,
        "NVIDIA H200",
    ),
    Shape("unread-csv", {FULL_CSV: "unread.csv"}, 1, "NVIDIA H200"),
)

IDENTITY = ("index", "uuid", "name")


def unread_csv() -> str:
    """The H200 ``--query-gpu`` capture with every value but the card's identity
    ``[N/A]``, as nvidia-smi writes a figure it cannot read."""
    header, row = (
        (SHARED / "nvidia-smi-query-gpu-csv_H200_590.48.01_idle.csv").read_text().split("\n")[:2]
    )
    names = [h.strip().split(" [")[0] for h in header.split(",")]
    cells = [
        cell if name in IDENTITY else (" [N/A]" if cell.startswith(" ") else "[N/A]")
        for name, cell in zip(names, row.split(","), strict=True)
    ]
    return f"{header}\n{','.join(cells)}\n"


def install(shape: Shape, bin_dir: Path) -> Path:
    """Write ``bin_dir/nvidia-smi`` for ``shape``; each run's arguments go, one a line,
    to ``bin_dir/calls.log``. Returns the script."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    lines = ["#!/bin/sh", f'echo "$*" >> {shlex.quote(str(bin_dir / "calls.log"))}', 'case "$*" in']
    for pattern, name in shape.answers.items():
        source = SHARED / name
        if name == "unread.csv":
            source = bin_dir / name
            source.write_text(unread_csv())
        if not source.is_file():
            raise FileNotFoundError(f"capture {source} is missing: see ../shared/fixtures")
        lines.append(f"  {pattern}) cat {shlex.quote(str(source))} ;;")
    lines += ['  *) echo "unexpected arguments: $*" >&2; exit 9 ;;', "esac", ""]
    script = bin_dir / "nvidia-smi"
    script.write_text("\n".join(lines))
    script.chmod(0o755)
    return script
