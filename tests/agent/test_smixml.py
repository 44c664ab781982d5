"""nvidia-smi -q -x: per-card health figures, absent-is-None, and the refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmgw.agent.discovery.smixml import (
    CardHealth,
    CardProcess,
    SmiXml,
    SmiXmlError,
    parse_smi_xml,
)

FIXTURES = Path(__file__).parent / "fixtures" / "smi"
MiB = 1 << 20
ALL = sorted(FIXTURES.glob("*.xml"))
NOT_NUMBERS = {
    "uuid",
    "name",
    "bus_id",
    "serial",
    "pstate",
    "throttle_reasons",
    "ecc_mode_current",
    "mig_mode_current",
    "persistence_mode",
    "processes",
    "fabric_state",
    "fabric_status",
    "fabric_cluster_uuid",
    "fabric_health",
}
ECC_COUNTS = (
    "ecc_volatile_corrected",
    "ecc_volatile_uncorrected",
    "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected",
)


def parse(name: str) -> SmiXml:
    return parse_smi_xml((FIXTURES / name).read_text())


def one_card(body: str) -> CardHealth:
    """A log with one card holding just ``body``: figures it leaves out must read None."""
    text = (
        '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
        f'<nvidia_smi_log>\n<gpu id="00000000:01:00.0">\n{body}\n</gpu>\n</nvidia_smi_log>\n'
    )
    (card,) = parse_smi_xml(text).cards
    return card


def test_h100_versions_and_cards() -> None:
    log = parse("h100-hgx_2cards_580.105.08.xml")
    assert (log.driver_version, log.cuda_version) == ("580.105.08", "13.0")
    assert [c.index for c in log.cards] == [0, 1]
    assert [c.bus_id for c in log.cards] == ["00000000:53:00.0", "00000000:64:00.0"]


def test_h100_throttled_card_with_ecc_and_remapped_rows() -> None:
    card = parse("h100-hgx_2cards_580.105.08.xml").cards[0]
    assert card.uuid == "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f001"
    assert card.name == "NVIDIA H100 80GB HBM3"
    assert card.serial == "1654123000417"
    assert (card.temperature_c, card.memory_temperature_c) == (34, 45)
    assert card.power_draw_w == 70.12  # instant, not the 69.80 W average
    assert card.power_limit_w == 700.0
    assert (card.sm_clock_mhz, card.memory_clock_mhz) == (345, 2619)
    assert card.fan_percent is None
    assert card.pstate == "P0"
    assert card.throttle_reasons == ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown")
    assert card.ecc_mode_current == "Enabled"
    # volatile: sram_correctable 2 + dram_correctable 5; dram_uncorrectable 1.
    assert (card.ecc_volatile_corrected, card.ecc_volatile_uncorrected) == (7, 1)
    # aggregate: 4 + 17; sram_uncorrectable_secded 1 + dram_uncorrectable 1.
    assert (card.ecc_aggregate_corrected, card.ecc_aggregate_uncorrected) == (21, 2)
    assert card.remapped_rows_correctable == 3
    assert card.remapped_rows_uncorrectable == 1
    assert card.remapped_rows_pending is True
    assert card.remapped_rows_failure is False
    # H100 remaps rows instead of retiring pages: the retirement block is all N/A.
    assert card.retired_pages_count is None
    assert card.retired_pages_pending is None
    assert card.mig_mode_current == "Disabled"
    assert card.memory_total_bytes == 81559 * MiB
    assert card.memory_used_bytes == 0
    assert (card.utilization_gpu_percent, card.utilization_memory_percent) == (0, 0)
    assert card.processes == ()
    assert card.energy_j is None


def test_h100_degraded_pcie_link() -> None:
    healthy, degraded = parse("h100-hgx_2cards_580.105.08.xml").cards
    assert (healthy.pcie_gen_current, healthy.pcie_gen_max) == (5, 5)
    assert (healthy.pcie_width_current, healthy.pcie_width_max) == (16, 16)
    assert (degraded.pcie_gen_current, degraded.pcie_gen_max) == (3, 5)
    assert (degraded.pcie_width_current, degraded.pcie_width_max) == (8, 16)
    assert degraded.throttle_reasons == ("gpu_idle",)
    assert degraded.ecc_volatile_corrected == 0


def test_consumer_card_without_ecc_reads_none_not_zero() -> None:
    log = parse("rtx4090-consumer_535.86.05.xml")
    assert (log.driver_version, log.cuda_version) == ("535.86.05", "12.2")
    (card,) = log.cards
    assert card.name == "NVIDIA GeForce RTX 4090"
    assert card.serial is None
    assert card.temperature_c == 38
    assert card.memory_temperature_c is None
    assert card.power_draw_w == 21.37
    assert card.power_limit_w == 450.0
    assert card.fan_percent == 0
    assert card.pstate == "P8"
    # One of the values in the capture is "Not Active" followed by a line break.
    assert card.throttle_reasons == ("gpu_idle",)
    assert card.ecc_mode_current == "Disabled"
    for name in ECC_COUNTS:
        assert getattr(card, name) is None, name
    assert card.retired_pages_count is None
    assert card.mig_mode_current is None
    assert (card.pcie_gen_current, card.pcie_gen_max) == (1, 3)
    assert card.memory_used_bytes == 417 * MiB


def test_mig_enabled_card() -> None:
    (card,) = parse("a100-mig_535.54.03.xml").cards
    assert card.mig_mode_current == "Enabled"
    assert card.index == 1  # its minor number, though first in the file
    assert card.power_draw_w == 61.88  # the 535 layout's gpu_power_readings/power_draw
    assert card.power_limit_w == 500.0
    assert card.throttle_reasons == ()  # reasons reported, none active
    assert card.utilization_gpu_percent is None
    assert card.utilization_memory_percent is None
    # <remapped_rows>N/A</remapped_rows>
    assert card.remapped_rows_correctable is None
    assert card.remapped_rows_pending is None
    assert card.ecc_volatile_uncorrected == 0
    # The MIG devices' own fb_memory_usage is not the card's.
    assert card.memory_total_bytes == 81920 * MiB
    assert card.memory_used_bytes == 50 * MiB
    assert card.processes == ()


def test_workstation_cards_with_processes_indexed_by_minor_number() -> None:
    log = parse("a5000-workstation_590.44.01.xml")
    assert log.driver_version == "590.44.01"
    first, second = log.cards
    assert (first.index, second.index) == (1, 0)
    assert first.bus_id == "00000000:81:00.0"
    assert first.processes == (
        CardProcess(
            pid=20931, name="/opt/llama.cpp/bin/llama-server", used_memory_bytes=21870 * MiB
        ),
    )
    assert second.processes[0].used_memory_bytes == 17246 * MiB
    assert first.power_draw_w == 6.52
    assert second.power_draw_w == 13.59
    assert first.fan_percent == 30
    assert first.memory_clock_mhz == 405
    assert first.throttle_reasons == ("gpu_idle",)
    assert first.ecc_mode_current == "Disabled"
    assert first.ecc_aggregate_uncorrected is None


def test_module_power_is_not_the_gpu_power() -> None:
    (card,) = parse("gb200-fabric_580.173.02.xml").cards
    assert (card.power_draw_w, card.power_limit_w) == (165.93, 1200.0)
    assert card.ecc_aggregate_corrected == 0


def test_old_driver_layout() -> None:
    log = parse("v100-old-driver_470.182.03.xml")
    assert (log.driver_version, log.cuda_version) == ("470.182.03", "11.4")
    (card,) = log.cards
    assert card.throttle_reasons == ("applications_clocks", "sw_power_cap")
    assert card.power_draw_w == 298.47
    assert card.power_limit_w == 300.0
    assert (card.ecc_volatile_corrected, card.ecc_volatile_uncorrected) == (2, 0)
    assert (card.ecc_aggregate_corrected, card.ecc_aggregate_uncorrected) == (10, 1)
    assert card.retired_pages_count == 3
    assert card.retired_pages_pending is True
    assert card.remapped_rows_uncorrectable is None
    assert (card.utilization_gpu_percent, card.utilization_memory_percent) == (97, 41)
    assert card.processes == (CardProcess(48213, "python3", 30215 * MiB),)


def test_old_ecc_layout_sums_locations_without_a_total() -> None:
    card = one_card(
        "<ecc_errors><volatile>"
        "<single_bit><device_memory>3</device_memory><l2_cache>N/A</l2_cache></single_bit>"
        "<double_bit><device_memory>N/A</device_memory><total>N/A</total></double_bit>"
        "</volatile></ecc_errors>"
    )
    assert (card.ecc_volatile_corrected, card.ecc_volatile_uncorrected) == (3, None)
    assert card.ecc_aggregate_corrected is None


def test_energy_in_millijoules_reads_as_joules() -> None:
    # No shared capture carries this element; the name and unit are NVML's.
    card = one_card(
        "<gpu_power_readings><total_energy_consumption>123456789 mJ"
        "</total_energy_consumption></gpu_power_readings>"
    )
    assert card.energy_j == 123456.789


@pytest.mark.parametrize(
    "absent",
    ["N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error", "[Unknown Error]", ""],
)
def test_absent_forms_read_none(absent: str) -> None:
    card = one_card(
        f"<minor_number>{absent}</minor_number><serial>{absent}</serial>"
        f"<fan_speed>{absent}</fan_speed><performance_state>{absent}</performance_state>"
        f"<temperature><gpu_temp>{absent}</gpu_temp></temperature>"
        f"<gpu_power_readings><instant_power_draw>{absent}</instant_power_draw>"
        f"<current_power_limit>{absent}</current_power_limit></gpu_power_readings>"
        f"<ecc_mode><current_ecc>{absent}</current_ecc></ecc_mode>"
        "<ecc_errors><volatile>"
        f"<sram_correctable>{absent}</sram_correctable>"
        f"<dram_uncorrectable>{absent}</dram_uncorrectable>"
        "</volatile></ecc_errors>"
        f"<remapped_rows><remapped_row_corr>{absent}</remapped_row_corr>"
        f"<remapped_row_pending>{absent}</remapped_row_pending></remapped_rows>"
        "<clocks_event_reasons>"
        f"<clocks_event_reason_gpu_idle>{absent}</clocks_event_reason_gpu_idle>"
        "</clocks_event_reasons>"
        f"<utilization><gpu_util>{absent}</gpu_util></utilization>"
    )
    assert card.index == 0  # no minor number: the order in the file
    assert card.bus_id == "00000000:01:00.0"  # no pci block: the <gpu id> attribute
    for f in dataclasses.fields(card):
        if f.name not in {"index", "bus_id", "processes"}:
            assert getattr(card, f.name) is None, f.name


def test_empty_card_reads_none_everywhere() -> None:
    card = one_card("")
    assert card.processes == ()
    assert card.throttle_reasons is None
    assert card.energy_j is None
    assert card.ecc_volatile_corrected is None


def test_figures_with_the_wrong_unit_read_none() -> None:
    card = one_card(
        "<temperature><gpu_temp>40 F</gpu_temp></temperature><fan_speed>30 RPM</fan_speed>"
        "<fb_memory_usage><total>24 parsecs</total></fb_memory_usage>"
        "<performance_state>Turbo</performance_state>"
    )
    assert card.temperature_c is None
    assert card.fan_percent is None
    assert card.memory_total_bytes is None
    assert card.pstate is None


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_every_figure_is_none_or_a_number(path: Path) -> None:
    log = parse_smi_xml(path.read_text())
    assert log.cards
    for card in log.cards:
        for f in dataclasses.fields(card):
            value = getattr(card, f.name)
            if f.name in NOT_NUMBERS:
                assert value is None or not isinstance(value, int | float), f.name
            else:
                assert value is None or isinstance(value, int | float), (f.name, value)
        for proc in card.processes:
            assert isinstance(proc.pid, int)
            assert proc.used_memory_bytes is None or isinstance(proc.used_memory_bytes, int)
        if card.throttle_reasons is not None:
            assert all(isinstance(r, str) for r in card.throttle_reasons)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "not well-formed"),
        ("nvidia-smi has failed because it couldn't communicate", "not well-formed"),
        ("<nvidia_smi_log><gpu></nvidia_smi_log>", "not well-formed"),
        ('<?xml version="1.0" ?>\n<log><gpu id="x"/></log>', "root <log>"),
        (
            '<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [\n<!ENTITY a "aaaaaaaaaa">\n'
            '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">\n]>\n'
            "<nvidia_smi_log>&b;</nvidia_smi_log>",
            "declares entities",
        ),
        (
            "<!DOCTYPE nvidia_smi_log [<!ELEMENT nvidia_smi_log ANY>]><nvidia_smi_log/>",
            "internal subset",
        ),
        ('<!ENTITY x SYSTEM "file:///etc/passwd"><nvidia_smi_log/>', "declares entities"),
    ],
)
def test_refusals(text: str, words: str) -> None:
    with pytest.raises(SmiXmlError, match=words):
        parse_smi_xml(text)


def test_refusal_is_a_value_error() -> None:
    assert issubclass(SmiXmlError, ValueError)


def test_the_doctype_nvidia_smi_writes_is_accepted() -> None:
    text = (
        '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
        "<nvidia_smi_log><driver_version>590.44.01</driver_version></nvidia_smi_log>"
    )
    log = parse_smi_xml(text)
    assert (log.driver_version, log.cuda_version, log.cards) == ("590.44.01", None, [])
