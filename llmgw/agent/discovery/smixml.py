"""``nvidia-smi -q -x`` read into per-card health figures: a pure parser, no IO.

``parse_smi_xml`` takes the XML text and gives a ``SmiXml``: the driver and CUDA
versions and one ``CardHealth`` per ``<gpu>``, in file order. Its contract:

- A figure the XML does not give, or gives as one of nvidia-smi's "no figure" words
  ("N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error", "Requested
  functionality has been deprecated", ...), is None, never 0: a health rule that reads
  0 correctable errors where the card said "N/A" would call a card healthy it knows
  nothing about. Numbers are parsed only from "<number> <unit>" with the unit expected.
- Both layouts are read: drivers before 530 write ``clocks_throttle_reasons``,
  ``power_readings`` (``power_draw``, ``enforced_power_limit``) and ECC counts split
  into ``single_bit``/``double_bit`` with a ``total``; later ones write
  ``clocks_event_reasons``, ``gpu_power_readings`` (``instant_power_draw``,
  ``average_power_draw``, ``current_power_limit``) and per-location counts
  (``sram_correctable``, ``dram_uncorrectable``, ...), which are summed.
- The ``<fabric>`` block (state, status, ``cliqueId``, ``clusterUuid``, and from 580
  a ``<health>`` block) is read as given; the 535 branch writes only state and
  status, and a card outside any NVLink fabric says N/A throughout, which is None.
- The text is refused (``SmiXmlError``, a ValueError) when it is not XML, when its
  root is not ``nvidia_smi_log``, or when it declares entities or a DOCTYPE internal
  subset. The bare ``<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_vNN.dtd">`` line
  every real capture starts with is accepted: it names an external DTD, which expat
  never fetches, so it cannot expand anything.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

_NUMBER = re.compile(r"^(?P<num>-?\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z%]*)$")
_PSTATE = re.compile(r"^P\d{1,2}$")
# An internal subset ("[") is where entities are declared; a SYSTEM id alone is not.
_DANGEROUS = re.compile(r"<!ENTITY|<!DOCTYPE[^>]*\[", re.IGNORECASE)
_BYTES = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_THROTTLE_BLOCKS = (
    ("clocks_event_reasons", "clocks_event_reason_"),
    ("clocks_throttle_reasons", "clocks_throttle_reason_"),
)
# nvidia-smi's tag suffix -> our name; the rest are used as they are.
_THROTTLE_NAMES = {
    "applications_clocks_setting": "applications_clocks",
    "display_clocks_setting": "display_clocks",
}


class SmiXmlError(ValueError):
    """The text is not an ``nvidia-smi -q -x`` log we are willing to read."""


@dataclass(frozen=True)
class CardProcess:
    """A process nvidia-smi lists on a card."""

    pid: int
    name: str | None
    used_memory_bytes: int | None


@dataclass(frozen=True)
class CardHealth:
    """One card's health figures; None wherever nvidia-smi gave no figure."""

    index: int
    uuid: str | None
    name: str | None
    bus_id: str | None
    serial: str | None
    temperature_c: int | None
    memory_temperature_c: int | None
    power_draw_w: float | None
    power_limit_w: float | None
    energy_j: float | None
    sm_clock_mhz: int | None
    memory_clock_mhz: int | None
    fan_percent: int | None
    pstate: str | None
    throttle_reasons: tuple[str, ...] | None
    ecc_mode_current: str | None
    ecc_volatile_corrected: int | None
    ecc_volatile_uncorrected: int | None
    ecc_aggregate_corrected: int | None
    ecc_aggregate_uncorrected: int | None
    retired_pages_pending: bool | None
    retired_pages_count: int | None
    remapped_rows_correctable: int | None
    remapped_rows_uncorrectable: int | None
    remapped_rows_pending: bool | None
    remapped_rows_failure: bool | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_gen_device_max: int | None
    pcie_gen_host_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    mig_mode_current: str | None
    processes: tuple[CardProcess, ...]
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_gpu_percent: int | None
    utilization_memory_percent: int | None
    # The ``<fabric>`` block (multi-node NVLink): None where it says N/A or is missing.
    fabric_state: str | None = None
    fabric_status: str | None = None
    fabric_clique_id: int | None = None
    fabric_cluster_uuid: str | None = None
    fabric_health: dict[str, str] | None = None
    # "Enabled"/"Disabled" as nvidia-smi says it (Linux only; N/A elsewhere).
    persistence_mode: str | None = None


@dataclass(frozen=True)
class SmiXml:
    """One ``nvidia-smi -q -x`` log: the versions it states and its cards in file order."""

    driver_version: str | None
    cuda_version: str | None
    cards: list[CardHealth]


# nvidia-smi's words for "no figure", bracketed or not, in any of its forms.
NO_FIGURE_WORDS = frozenset(
    {
        "N/A",
        "NA",
        "NOT SUPPORTED",
        "UNKNOWN ERROR",
        "INSUFFICIENT PERMISSIONS",
        "REQUESTED FUNCTIONALITY HAS BEEN DEPRECATED",
        "GPU IS LOST",
    }
)


def no_figure(value: str) -> bool:
    """Whether nvidia-smi printed no figure: nothing, a bracketed word ("[N/A]",
    "[Not Supported]"), or one of ``NO_FIGURE_WORDS``, in any of its outputs."""
    value = " ".join(value.split())
    return (
        not value
        or value.startswith("[")
        or value.upper() in NO_FIGURE_WORDS
        or "deprecated" in value.lower()
    )


def _text(el: ET.Element | None, path: str) -> str | None:
    """The stripped text at ``path``, or None when absent, empty or a "no figure" word."""
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    value = " ".join(found.text.split())
    # "None" too: the XML's word for an empty list (``<processes>None``).
    return None if no_figure(value) or value == "None" else value


def _number(el: ET.Element | None, path: str, units: set[str]) -> float | None:
    value = _text(el, path)
    if value is None:
        return None
    m = _NUMBER.match(value)
    if m is None or m["unit"] not in units:
        return None
    return float(m["num"])


def _int(el: ET.Element | None, path: str, *units: str) -> int | None:
    number = _number(el, path, set(units) or {""})
    return None if number is None else int(number)


def _float(el: ET.Element | None, path: str, unit: str) -> float | None:
    return _number(el, path, {unit})


def _bytes(el: ET.Element | None, path: str) -> int | None:
    value = _text(el, path)
    m = _NUMBER.match(value) if value is not None else None
    if m is None or m["unit"] not in _BYTES:
        return None
    return int(float(m["num"]) * _BYTES[m["unit"]])


def _yes_no(el: ET.Element | None, path: str) -> bool | None:
    value = _text(el, path)
    return {"Yes": True, "No": False}.get(value) if value is not None else None


def _mode(el: ET.Element | None, path: str) -> str | None:
    value = _text(el, path)
    return value if value in {"Enabled", "Disabled"} else None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _sum(values: list[int | None]) -> int | None:
    """The sum of the counts given; None when none was (the card keeps no such count)."""
    given = [v for v in values if v is not None]
    return sum(given) if given else None


def _width(el: ET.Element | None, path: str) -> int | None:
    # Link widths are written "16x".
    value = _text(el, path)
    if value is None or not value.endswith("x") or not value[:-1].isdigit():
        return None
    return int(value[:-1])


def _throttle_reasons(gpu: ET.Element) -> tuple[str, ...] | None:
    for block_tag, prefix in _THROTTLE_BLOCKS:
        block = gpu.find(block_tag)
        if block is None:
            continue
        states = {
            child.tag.removeprefix(prefix): " ".join((child.text or "").split())
            for child in block
            if child.tag.startswith(prefix)
        }
        if not any(s in {"Active", "Not Active"} for s in states.values()):
            return None
        return tuple(_THROTTLE_NAMES.get(tag, tag) for tag, s in states.items() if s == "Active")
    return None


def _ecc_counts(section: ET.Element | None) -> tuple[int | None, int | None]:
    """(corrected, uncorrected) in one ``volatile`` or ``aggregate`` block."""
    if section is None:
        return None, None
    if section.find("single_bit") is not None or section.find("double_bit") is not None:
        # Before 530: single-bit errors are the corrected ones, double-bit the others.
        return _total(section.find("single_bit")), _total(section.find("double_bit"))
    corrected: list[int | None] = []
    uncorrected: list[int | None] = []
    for child in section:
        tag = child.tag
        if "uncorrectable" in tag:
            uncorrected.append(_int(section, tag))
        elif tag.endswith("correctable"):
            corrected.append(_int(section, tag))
    return _sum(corrected), _sum(uncorrected)


def _total(block: ET.Element | None) -> int | None:
    if block is None:
        return None
    total = _int(block, "total")
    if total is not None:
        return total
    return _sum([_int(block, child.tag) for child in block if child.tag != "total"])


def _processes(gpu: ET.Element) -> tuple[CardProcess, ...]:
    found: list[CardProcess] = []
    for info in gpu.findall("processes/process_info"):
        pid = _int(info, "pid")
        if pid is None:
            continue
        found.append(CardProcess(pid, _text(info, "process_name"), _bytes(info, "used_memory")))
    return tuple(found)


def _energy_j(power: ET.Element | None, gpu: ET.Element) -> float | None:
    for el in (power, gpu):
        millijoules = _number(el, "total_energy_consumption", {"mJ"})
        if millijoules is not None:
            return millijoules / 1000
        joules = _number(el, "total_energy_consumption", {"J"})
        if joules is not None:
            return joules
    return None


def _fabric_health(fabric: ET.Element | None) -> dict[str, str] | None:
    """``<fabric><health>``'s entries by tag, those given (580 on; "None" is a value)."""
    block = fabric.find("health") if fabric is not None else None
    if block is None:
        return None
    found = {
        child.tag: " ".join(child.text.split())
        for child in block
        if child.text is not None and not no_figure(child.text)
    }
    return found or None


def _card(gpu: ET.Element, position: int) -> CardHealth:
    # gpu_power_readings from 530 on; power_readings before.
    power = gpu.find("gpu_power_readings")
    if power is None:
        power = gpu.find("power_readings")
    link = gpu.find("pci/pci_gpu_link_info")
    ecc = gpu.find("ecc_errors")
    vol_corr, vol_unc = _ecc_counts(ecc.find("volatile") if ecc is not None else None)
    agg_corr, agg_unc = _ecc_counts(ecc.find("aggregate") if ecc is not None else None)
    retired = gpu.find("retired_pages")
    remapped = gpu.find("remapped_rows")
    pstate = _text(gpu, "performance_state")
    minor = _int(gpu, "minor_number")
    fabric = gpu.find("fabric")
    cluster = _text(fabric, "clusterUuid")
    return CardHealth(
        index=position if minor is None else minor,
        uuid=_text(gpu, "uuid"),
        name=_text(gpu, "product_name"),
        bus_id=_text(gpu, "pci/pci_bus_id") or gpu.get("id"),
        serial=_text(gpu, "serial"),
        temperature_c=_int(gpu, "temperature/gpu_temp", "C"),
        memory_temperature_c=_int(gpu, "temperature/memory_temp", "C"),
        # The instant reading is the one that shows a spike; the 1 s average is the
        # fallback, and power_draw is what drivers before 530 (and the 535 branch) write.
        power_draw_w=_first(
            _float(power, "instant_power_draw", "W"),
            _float(power, "power_draw", "W"),
            _float(power, "average_power_draw", "W"),
        ),
        power_limit_w=_first(
            _float(power, "enforced_power_limit", "W"),
            _float(power, "current_power_limit", "W"),
        ),
        energy_j=_energy_j(power, gpu),
        sm_clock_mhz=_int(gpu, "clocks/sm_clock", "MHz"),
        memory_clock_mhz=_int(gpu, "clocks/mem_clock", "MHz"),
        fan_percent=_int(gpu, "fan_speed", "%"),
        pstate=pstate if pstate is not None and _PSTATE.match(pstate) else None,
        throttle_reasons=_throttle_reasons(gpu),
        ecc_mode_current=_mode(gpu, "ecc_mode/current_ecc"),
        ecc_volatile_corrected=vol_corr,
        ecc_volatile_uncorrected=vol_unc,
        ecc_aggregate_corrected=agg_corr,
        ecc_aggregate_uncorrected=agg_unc,
        retired_pages_pending=_yes_no(retired, "pending_retirement"),
        retired_pages_count=_sum(
            [
                _int(retired, "multiple_single_bit_retirement/retired_count"),
                _int(retired, "double_bit_retirement/retired_count"),
            ]
        ),
        remapped_rows_correctable=_int(remapped, "remapped_row_corr"),
        remapped_rows_uncorrectable=_int(remapped, "remapped_row_unc"),
        remapped_rows_pending=_yes_no(remapped, "remapped_row_pending"),
        remapped_rows_failure=_yes_no(remapped, "remapped_row_failure"),
        pcie_gen_current=_int(link, "pcie_gen/current_link_gen"),
        pcie_gen_max=_int(link, "pcie_gen/max_link_gen"),
        pcie_gen_device_max=_int(link, "pcie_gen/max_device_link_gen"),
        pcie_gen_host_max=_int(link, "pcie_gen/max_host_link_gen"),
        pcie_width_current=_width(link, "link_widths/current_link_width"),
        pcie_width_max=_width(link, "link_widths/max_link_width"),
        mig_mode_current=_mode(gpu, "mig_mode/current_mig"),
        processes=_processes(gpu),
        memory_total_bytes=_bytes(gpu, "fb_memory_usage/total"),
        memory_used_bytes=_bytes(gpu, "fb_memory_usage/used"),
        utilization_gpu_percent=_int(gpu, "utilization/gpu_util", "%"),
        utilization_memory_percent=_int(gpu, "utilization/memory_util", "%"),
        fabric_state=_text(fabric, "state"),
        fabric_status=_text(fabric, "status"),
        fabric_clique_id=_int(fabric, "cliqueId"),
        fabric_cluster_uuid=cluster.lower() if cluster else None,
        fabric_health=_fabric_health(fabric),
        persistence_mode=_mode(gpu, "persistence_mode"),
    )


def smi_root(text: str, error: type[SmiXmlError] = SmiXmlError) -> ET.Element:
    """The ``<nvidia_smi_log>`` root of a log; ``error`` (SmiXmlError or a subclass) for
    text that is not XML, has another root, or declares entities."""
    if _DANGEROUS.search(text):
        raise error(
            "nvidia-smi XML declares entities or a DOCTYPE internal subset; refused "
            "(nvidia-smi itself writes neither)"
        )
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise error(f"nvidia-smi XML is not well-formed XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise error(f"nvidia-smi XML has root <{root.tag}>, expected <nvidia_smi_log>")
    return root


def parse_smi_xml(text: str) -> SmiXml:
    """The cards in ``nvidia-smi -q -x`` output. Raises SmiXmlError for text it refuses."""
    return cards_from_root(smi_root(text))


def cards_from_root(root: ET.Element) -> SmiXml:
    """The versions and cards under an ``<nvidia_smi_log>`` element already parsed.

    Shared with ``smitext``, which builds such a tree from ``nvidia-smi -q`` text.
    """
    return SmiXml(
        driver_version=_text(root, "driver_version"),
        cuda_version=_text(root, "cuda_version"),
        cards=[_card(gpu, n) for n, gpu in enumerate(root.findall("gpu"))],
    )
