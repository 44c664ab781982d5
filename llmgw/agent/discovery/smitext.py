"""Plain-text ``nvidia-smi -q`` read into the same per-card figures as ``smixml``: pure, no IO.

For a node whose nvidia-smi cannot write XML (``-x``). ``parse_smi_text`` turns the
indented "Label : Value" text into the element tree ``nvidia-smi -q -x`` would have
written (only the elements ``smixml`` reads, with the same tags and nesting) and hands
it to ``smixml.cards_from_root``, so both outputs share one card builder and one
contract: a "no figure" word ("N/A", "Not Supported", ...) is None, never 0; numbers
are read only with the unit expected; both driver layouts (before 530: "Clocks
Throttle Reasons", "Power Readings", ECC "Single Bit"/"Double Bit" with "Total";
later: "Clocks Event Reasons", "GPU Power Readings", per-location ECC counts) are read.

How the text is read:

- Each line is "Label : Value" (split at the first colon, so bus ids and times in
  values survive) or a bare "Label" that opens a section; nesting is by indentation.
  Labels are matched without regard to case or runs of spaces ("Gpu" in 535, "GPU" in
  590 utilisation; "GPU Memory Power Readings " with its trailing space).
- Each unindented ``GPU 00000000:19:00.0`` line starts a card; that bus id is the
  card's ``id``. Sections we do not map ("MIG Device", "Module Power Readings",
  "Applications Clocks", ...) are skipped with everything under them, so a MIG
  device's "Shared FB Memory Usage" or a module's power draw is never the card's.
- An entry nested under another of the same block ("HW Thermal Slowdown" under "HW
  Slowdown", a process's "Type"/"Name"/"Used GPU Memory" under its "Process ID") is
  read as a sibling, as the XML writes it. A section written with a value instead of
  entries ("Remapped Rows : N/A", "Processes : None") becomes an element with that
  text, as in the XML.
- The text is refused (``SmiTextError``, a ValueError) when it does not start with the
  ``==============NVSMI LOG==============`` banner, or has neither a "Driver Version"
  line nor a GPU section.

The text cannot give: the energy counter (no capture prints a total energy line, so
``energy_j`` is None), and the retired-pages pending flag comes from the one "Pending
Page Blacklist" line (the XML carries it twice, as ``pending_blacklist`` and
``pending_retirement``; ``smixml`` reads the latter).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from llmgw.agent.discovery.smixml import SmiXml, cards_from_root

_BANNER = re.compile(r"^=+\s*NVSMI LOG\s*=+$")
_GPU_HEADER = re.compile(r"^GPU\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$")
_SLUG = re.compile(r"[^a-z0-9]+")


class SmiTextError(ValueError):
    """The text is not ``nvidia-smi -q`` output we are willing to read."""


@dataclass
class _Node:
    """One line of the text, with the lines indented under it."""

    label: str
    value: str | None
    indent: int
    children: list[_Node] = field(default_factory=list)
    bus_id: str | None = None  # set on a card's "GPU 00000000:19:00.0" line


@dataclass(frozen=True)
class _Section:
    """How a text section maps to an XML element: its tag and its entries' tags.

    An entry's spec is a leaf tag (a "/"-separated path for one nested in the XML) or
    a subsection. With ``slug_rest`` an unlisted "Label : Value" entry is kept under
    its label spelt as a tag ("SRAM Foo Bar" -> sram_foo_bar): ECC count blocks, whose
    entries ``smixml`` sums by tag name, so a location a later driver adds still counts.
    """

    tag: str
    entries: Mapping[str, str | _Section]
    slug_rest: bool = False


def _key(label: str) -> str:
    return " ".join(label.split()).casefold()


def _section(tag: str, entries: Mapping[str, str | _Section], slug_rest: bool = False) -> _Section:
    return _Section(tag, {_key(label): spec for label, spec in entries.items()}, slug_rest)


def _slug(label: str) -> str:
    return _SLUG.sub("_", label.casefold()).strip("_")


# "Clocks Event Reasons" (530 on) and "Clocks Throttle Reasons" (before) list the same
# entries; the XML tags are the block's prefix plus these.
_REASONS = {
    "Idle": "gpu_idle",
    "Applications Clocks Setting": "applications_clocks_setting",
    "SW Power Cap": "sw_power_cap",
    "HW Slowdown": "hw_slowdown",
    "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Brake Slowdown": "hw_power_brake_slowdown",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal_slowdown",
    "Display Clock Setting": "display_clocks_setting",
}
# Per-location counts before 530, each block ending in its "Total".
_ECC_BITS = {
    "Device Memory": "device_memory",
    "Register File": "register_file",
    "L1 Cache": "l1_cache",
    "L2 Cache": "l2_cache",
    "Texture Memory": "texture_memory",
    "Texture Shared": "texture_shm",
    "CBU": "cbu",
    "SRAM": "sram",
    "DRAM": "dram",
    "Total": "total",
}
_ECC_COUNTS: dict[str, str | _Section] = {
    "SRAM Correctable": "sram_correctable",
    "SRAM Uncorrectable": "sram_uncorrectable",
    "SRAM Uncorrectable Parity": "sram_uncorrectable_parity",
    "SRAM Uncorrectable SEC-DED": "sram_uncorrectable_secded",
    "DRAM Correctable": "dram_correctable",
    "DRAM Uncorrectable": "dram_uncorrectable",
    "SRAM Threshold Exceeded": "sram_threshold_exceeded",
    "Single Bit": _section("single_bit", _ECC_BITS, slug_rest=True),
    "Double Bit": _section("double_bit", _ECC_BITS, slug_rest=True),
}
_POWER = {
    "Power Draw": "power_draw",
    "Average Power Draw": "average_power_draw",
    "Instantaneous Power Draw": "instant_power_draw",
    "Power Limit": "power_limit",
    "Current Power Limit": "current_power_limit",
    "Enforced Power Limit": "enforced_power_limit",
    "Requested Power Limit": "requested_power_limit",
    "Default Power Limit": "default_power_limit",
    "Min Power Limit": "min_power_limit",
    "Max Power Limit": "max_power_limit",
}
# Marks the "Processes" section, whose flat list of entries is cut into process_info.
_PROCESSES = _section("processes", {})
_PROCESS = {
    _key(label): tag
    for label, tag in {
        "GPU instance ID": "gpu_instance_id",
        "Compute instance ID": "compute_instance_id",
        "Process ID": "pid",
        "Type": "type",
        "Name": "process_name",
        "Used GPU Memory": "used_memory",
    }.items()
}

_GPU = _section(
    "gpu",
    {
        "Product Name": "product_name",
        "Product Brand": "product_brand",
        "Product Architecture": "product_architecture",
        "Serial Number": "serial",
        "GPU UUID": "uuid",
        "Minor Number": "minor_number",
        "Persistence Mode": "persistence_mode",
        "MIG Mode": _section("mig_mode", {"Current": "current_mig", "Pending": "pending_mig"}),
        "PCI": _section(
            "pci",
            {
                "Bus Id": "pci_bus_id",
                "GPU Link Info": _section(
                    "pci_gpu_link_info",
                    {
                        "PCIe Generation": _section(
                            "pcie_gen",
                            {
                                "Max": "max_link_gen",
                                "Current": "current_link_gen",
                                "Device Current": "device_current_link_gen",
                                "Device Max": "max_device_link_gen",
                                "Host Max": "max_host_link_gen",
                            },
                        ),
                        "Link Width": _section(
                            "link_widths",
                            {"Max": "max_link_width", "Current": "current_link_width"},
                        ),
                    },
                ),
            },
        ),
        "Fan Speed": "fan_speed",
        "Performance State": "performance_state",
        "Clocks Event Reasons": _section(
            "clocks_event_reasons",
            {label: f"clocks_event_reason_{tag}" for label, tag in _REASONS.items()},
        ),
        "Clocks Throttle Reasons": _section(
            "clocks_throttle_reasons",
            {label: f"clocks_throttle_reason_{tag}" for label, tag in _REASONS.items()},
        ),
        "FB Memory Usage": _section(
            "fb_memory_usage",
            {"Total": "total", "Reserved": "reserved", "Used": "used", "Free": "free"},
        ),
        "Utilization": _section(
            "utilization",
            {
                "GPU": "gpu_util",
                "Memory": "memory_util",
                "Encoder": "encoder_util",
                "Decoder": "decoder_util",
                "JPEG": "jpeg_util",
                "OFA": "ofa_util",
            },
        ),
        "ECC Mode": _section("ecc_mode", {"Current": "current_ecc", "Pending": "pending_ecc"}),
        "ECC Errors": _section(
            "ecc_errors",
            {
                "Volatile": _section("volatile", _ECC_COUNTS, slug_rest=True),
                "Aggregate": _section("aggregate", _ECC_COUNTS, slug_rest=True),
            },
        ),
        "Retired Pages": _section(
            "retired_pages",
            {
                "Single Bit ECC": "multiple_single_bit_retirement/retired_count",
                "Double Bit ECC": "double_bit_retirement/retired_count",
                # The XML's pending_blacklist and pending_retirement: one flag, one line.
                "Pending Page Blacklist": "pending_retirement",
                "Pending Page Retirement": "pending_retirement",
                "Pending": "pending_retirement",
            },
        ),
        "Remapped Rows": _section(
            "remapped_rows",
            {
                "Correctable Error": "remapped_row_corr",
                "Uncorrectable Error": "remapped_row_unc",
                "Pending": "remapped_row_pending",
                "Remapping Failure Occurred": "remapped_row_failure",
            },
        ),
        "Temperature": _section(
            "temperature", {"GPU Current Temp": "gpu_temp", "Memory Current Temp": "memory_temp"}
        ),
        "GPU Power Readings": _section("gpu_power_readings", _POWER),
        "Power Readings": _section("power_readings", _POWER),
        "Clocks": _section(
            "clocks",
            {
                "Graphics": "graphics_clock",
                "SM": "sm_clock",
                "Memory": "mem_clock",
                "Video": "video_clock",
            },
        ),
        "Processes": _PROCESSES,
        # Multi-node NVLink; "Health" (580 on) keeps every entry under its label's slug,
        # which is the XML's tag ("Route Recovery in progress" -> route_recovery_in_progress).
        "Fabric": _section(
            "fabric",
            {
                "State": "state",
                "Status": "status",
                "CliqueId": "cliqueId",
                "ClusterUUID": "clusterUuid",
                "Health": _section("health", {}, slug_rest=True),
            },
        ),
    },
)
_LOG = {
    _key(label): tag
    for label, tag in {
        "Timestamp": "timestamp",
        "Driver Version": "driver_version",
        "CUDA Version": "cuda_version",
        "Attached GPUs": "attached_gpus",
    }.items()
}


def _lines(text: str) -> Iterator[str]:
    for raw in text.splitlines():
        line = raw.expandtabs(4).rstrip()
        if line.strip():
            yield line


def _tree(text: str) -> list[_Node]:
    """The text's top-level lines, each with the lines indented under it."""
    lines = _lines(text)
    first = next(lines, None)
    if first is None:
        raise SmiTextError("nvidia-smi -q output is empty")
    if _BANNER.match(first.strip()) is None:
        hint = (
            " (this looks like XML: read it with parse_smi_xml)"
            if first.lstrip().startswith("<")
            else ""
        )
        raise SmiTextError(
            "not nvidia-smi -q output: expected the '==============NVSMI LOG=============='"
            f" banner first, got {first.strip()[:60]!r}{hint}"
        )
    root = _Node("", None, -1)
    stack = [root]
    for line in lines:
        indent = len(line) - len(line.lstrip())
        body = line.strip()
        header = _GPU_HEADER.match(body) if indent == 0 else None
        if header is not None:
            node = _Node(body, None, indent, bus_id=header["bus"])
        elif ":" in body:
            label, value = body.split(":", 1)
            node = _Node(label.strip(), value.strip(), indent)
        else:
            node = _Node(body, None, indent)
        while stack[-1].indent >= indent:
            stack.pop()
        stack[-1].children.append(node)
        stack.append(node)
    return root.children


def _put(parent: ET.Element, path: str, value: str) -> None:
    """``value`` at ``path`` under ``parent``, making the elements above it as needed."""
    *above, tag = path.split("/")
    for name in above:
        found = parent.find(name)
        parent = found if found is not None else ET.SubElement(parent, name)
    ET.SubElement(parent, tag).text = value


def _flat(nodes: list[_Node]) -> Iterator[_Node]:
    for node in nodes:
        yield node
        yield from _flat(node.children)


def _processes(element: ET.Element, nodes: list[_Node]) -> None:
    # Every process is "GPU instance ID", "Compute instance ID", "Process ID" (with
    # Type/Name/Used GPU Memory under it); drivers before MIG start at "Process ID".
    info: ET.Element | None = None
    for node in _flat(nodes):
        tag = _PROCESS.get(_key(node.label))
        if tag is None or node.value is None:
            continue
        if (
            info is None
            or tag == "gpu_instance_id"
            or (tag == "pid" and info.find("pid") is not None)
        ):
            info = ET.SubElement(element, "process_info")
        ET.SubElement(info, tag).text = node.value


def _fill(element: ET.Element, nodes: list[_Node], section: _Section) -> None:
    for node in nodes:
        spec = section.entries.get(_key(node.label))
        if spec is None and section.slug_rest and node.value and not node.children:
            spec = _slug(node.label)
        if spec is None:
            continue
        if isinstance(spec, str):
            if node.value is not None:
                _put(element, spec, node.value)
            # Entries indented under an entry belong to the same block in the XML.
            _fill(element, node.children, section)
            continue
        child = ET.SubElement(element, spec.tag)
        if node.value:
            child.text = node.value
        if spec is _PROCESSES:
            _processes(child, node.children)
        else:
            _fill(child, node.children, spec)


def smi_text_root(text: str) -> ET.Element:
    """The ``<nvidia_smi_log>`` tree ``nvidia-smi -q -x`` would have written for ``text``.

    Holds only the elements ``smixml`` reads. Raises SmiTextError for text it refuses.
    """
    root = ET.Element("nvidia_smi_log")
    seen_version = False
    for node in _tree(text):
        tag = _LOG.get(_key(node.label))
        if tag is not None and node.value is not None:
            ET.SubElement(root, tag).text = node.value
            seen_version = seen_version or tag == "driver_version"
        elif node.bus_id is not None:
            gpu = ET.SubElement(root, "gpu", id=node.bus_id)
            _fill(gpu, node.children, _GPU)
    if not seen_version and root.find("gpu") is None:
        raise SmiTextError(
            "nvidia-smi -q output has neither a 'Driver Version' line nor a 'GPU <bus id>' section"
        )
    return root


def parse_smi_text(text: str) -> SmiXml:
    """The cards in ``nvidia-smi -q`` text. Raises SmiTextError for text it refuses."""
    return cards_from_root(smi_text_root(text))
