"""nvidia-smi -q (plain text): the same per-card figures as the XML, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.discovery.smitext import SmiTextError, parse_smi_text, smi_text_root
from llmgw.agent.discovery.smixml import CardProcess, SmiXml, parse_smi_xml

FIXTURES = Path(__file__).parent / "fixtures" / "smitext"
XML_FIXTURES = Path(__file__).parent / "fixtures" / "smi"
MiB = 1 << 20


def parse(name: str) -> SmiXml:
    return parse_smi_text((FIXTURES / name).read_text())


def test_535_versions_and_cards() -> None:
    log = parse("h100-sxm_2cards_535.183.01.txt")
    assert (log.driver_version, log.cuda_version) == ("535.183.01", "12.2")
    assert [c.index for c in log.cards] == [0, 2]  # minor numbers
    assert [c.bus_id for c in log.cards] == ["00000000:53:00.0", "00000000:75:00.0"]


def test_535_card_with_errors_and_thermal_slowdown() -> None:
    card = parse("h100-sxm_2cards_535.183.01.txt").cards[0]
    assert card.uuid == "GPU-7c1e0b52-5a90-4f3e-8d21-0e4a9b6c3101"
    assert card.name == "NVIDIA H100 80GB HBM3"
    assert card.serial == "1655026000101"
    assert (card.temperature_c, card.memory_temperature_c) == (41, 52)
    assert card.power_draw_w == 74.36  # 535's "GPU Power Readings" > "Power Draw"
    assert card.power_limit_w == 700.0
    assert (card.sm_clock_mhz, card.memory_clock_mhz) == (345, 2619)
    assert card.pstate == "P0"
    # "HW Thermal Slowdown" is indented under "HW Slowdown" in the text.
    assert card.throttle_reasons == ("hw_slowdown", "hw_thermal_slowdown")
    assert card.ecc_mode_current == "Enabled"
    assert (card.ecc_volatile_corrected, card.ecc_volatile_uncorrected) == (7, 0)
    # aggregate: 11 + 25 corrected; parity 1 + DRAM 2 uncorrected.
    assert (card.ecc_aggregate_corrected, card.ecc_aggregate_uncorrected) == (36, 3)
    assert (card.remapped_rows_correctable, card.remapped_rows_uncorrectable) == (2, 2)
    assert card.remapped_rows_pending is True
    assert card.remapped_rows_failure is False
    assert (card.pcie_gen_current, card.pcie_gen_max) == (5, 5)
    assert (card.pcie_width_current, card.pcie_width_max) == (16, 16)
    assert card.mig_mode_current == "Disabled"
    assert card.memory_total_bytes == 81559 * MiB
    assert card.memory_used_bytes == 0
    assert (card.utilization_gpu_percent, card.utilization_memory_percent) == (0, 0)
    assert card.processes == ()  # "Processes : None"


def test_535_card_with_processes_and_degraded_link() -> None:
    card = parse("h100-sxm_2cards_535.183.01.txt").cards[1]
    assert card.throttle_reasons == (
        "sw_power_cap",
        "hw_power_brake_slowdown",
        "sw_thermal_slowdown",
    )
    assert (card.pcie_gen_current, card.pcie_gen_max) == (4, 5)
    assert (card.pcie_width_current, card.pcie_width_max) == (8, 16)
    assert card.temperature_c == 47
    assert card.power_draw_w == 231.40
    assert (card.sm_clock_mhz, card.memory_clock_mhz) == (1980, 2619)
    assert card.memory_used_bytes == 20519 * MiB
    assert card.processes == (
        CardProcess(481516, "/opt/venv/bin/python3", 20480 * MiB),
        CardProcess(481602, "nvidia-cuda-mps-server", 30 * MiB),
    )
    assert card.ecc_aggregate_corrected == 0


def test_na_fields_read_none_not_zero() -> None:
    for card in parse("h100-sxm_2cards_535.183.01.txt").cards:
        assert card.fan_percent is None  # "Fan Speed : N/A"
        # H100 remaps rows: "Single Bit ECC : N/A" and so on.
        assert card.retired_pages_count is None
        assert card.retired_pages_pending is None
        assert card.energy_j is None  # the text never gives it


def test_590_mig_enabled_card() -> None:
    log = parse("h100-mig_590.48.01.txt")
    assert (log.driver_version, log.cuda_version) == ("590.48.01", "13.1")
    (card,) = log.cards
    assert card.bus_id == "00000000:00:09.0"
    assert card.uuid == "GPU-d41c7a09-2b6e-4c85-a317-6f0e2d9b8a44"
    assert card.serial == "1652925001736"
    assert card.mig_mode_current == "Enabled"
    assert (card.temperature_c, card.memory_temperature_c) == (44, 51)
    assert card.power_draw_w == 74.88  # instantaneous, not the 73.05 W average
    assert card.power_limit_w == 700.0
    assert card.throttle_reasons == ("gpu_idle",)
    assert card.ecc_aggregate_corrected == 6
    assert (card.ecc_volatile_corrected, card.ecc_volatile_uncorrected) == (0, 0)
    # "Remapped Rows : N/A" and "Utilization" all N/A, as MIG reports them.
    assert card.remapped_rows_correctable is None
    assert card.remapped_rows_pending is None
    assert card.utilization_gpu_percent is None
    assert card.utilization_memory_percent is None
    # The MIG devices' "Shared FB Memory Usage" is not the card's.
    assert card.memory_total_bytes == 81559 * MiB
    assert card.memory_used_bytes == 59 * MiB
    assert (card.pcie_gen_current, card.pcie_width_current) == (5, 16)
    assert card.processes == ()


def test_pre_530_layout() -> None:
    (card,) = parse("v100-old-driver_470.182.03.txt").cards
    assert card.throttle_reasons == ("applications_clocks", "sw_power_cap")
    assert card.power_draw_w == 298.47
    assert card.power_limit_w == 300.0  # "Enforced Power Limit"
    # "Single Bit"/"Double Bit" blocks: their "Total" lines.
    assert (card.ecc_volatile_corrected, card.ecc_volatile_uncorrected) == (2, 0)
    assert (card.ecc_aggregate_corrected, card.ecc_aggregate_uncorrected) == (10, 1)
    assert card.retired_pages_count == 3
    assert card.retired_pages_pending is True
    assert card.remapped_rows_correctable is None
    assert card.mig_mode_current is None
    assert (card.utilization_gpu_percent, card.utilization_memory_percent) == (97, 41)
    assert card.processes == (CardProcess(48213, "python3", 30215 * MiB),)


@pytest.mark.parametrize("name", ["h100-hgx_2cards_580.105.08", "v100-old-driver_470.182.03"])
def test_text_and_xml_of_the_same_cards_agree(name: str) -> None:
    text = parse(f"{name}.txt")
    xml = parse_smi_xml((XML_FIXTURES / f"{name}.xml").read_text())
    assert len(text.cards) == len(xml.cards) >= 1
    assert text == xml


def test_text_root_uses_the_xml_tags() -> None:
    root = smi_text_root((FIXTURES / "h100-sxm_2cards_535.183.01.txt").read_text())
    gpu = root.find("gpu")
    assert gpu is not None
    assert gpu.get("id") == "00000000:53:00.0"
    assert gpu.findtext("pci/pci_gpu_link_info/link_widths/max_link_width") == "16x"
    assert gpu.findtext("clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown") == "Active"
    assert gpu.find("module_power_readings") is None  # not mapped, never read as the GPU's


def test_unknown_ecc_location_still_counts() -> None:
    text = (FIXTURES / "h100-sxm_2cards_535.183.01.txt").read_text()
    text = text.replace(
        "            DRAM Uncorrectable            : 0\n        Aggregate",
        "            DRAM Uncorrectable            : 0\n"
        "            SRAM Uncorrectable Future     : 4\n        Aggregate",
        1,
    )
    assert parse_smi_text(text).cards[0].ecc_volatile_uncorrected == 4


def test_tabs_and_crlf_are_read() -> None:
    text = (FIXTURES / "h100-mig_590.48.01.txt").read_text()
    log = parse_smi_text(text.replace("    ", "\t").replace("\n", "\r\n"))
    assert log.cards == parse("h100-mig_590.48.01.txt").cards


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("   \n\n", "empty"),
        ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n", "NVSMI LOG"),
        ("index, name\n0, NVIDIA H100\n", "NVSMI LOG"),
        ('<?xml version="1.0" ?>\n<nvidia_smi_log></nvidia_smi_log>\n', "parse_smi_xml"),
        ("==============NVSMI LOG==============\n\nhello : world\n", "Driver Version"),
    ],
)
def test_refuses_what_is_not_nvidia_smi_q(text: str, words: str) -> None:
    with pytest.raises(SmiTextError, match=words) as caught:
        parse_smi_text(text)
    assert isinstance(caught.value, ValueError)


def test_log_without_gpus_has_no_cards() -> None:
    text = (
        "==============NVSMI LOG==============\n\nDriver Version : 550.54.15\nAttached GPUs : 0\n"
    )
    log = parse_smi_text(text)
    assert (log.driver_version, log.cards) == ("550.54.15", [])
