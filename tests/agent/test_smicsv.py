"""nvidia-smi --query-gpu CSV (with header) read into GPU and GpuHealth."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest

from llmgw.agent.discovery.cardread import from_smi_xml
from llmgw.agent.discovery.smicsv import FULL_QUERY_FIELDS, SmiCsvError, parse_full_query_csv
from llmgw.agent.discovery.smixml import parse_smi_xml
from llmgw.wire.hardware import GPU, GpuHealth

FIXTURES = Path(__file__).parent / "fixtures"
CSV = FIXTURES / "smicsv"
MIB = 1 << 20


def _read(name: str) -> str:
    return (CSV / name).read_text()


def _header_fields(text: str) -> list[str]:
    return [cell.strip().split(" [")[0] for cell in text.splitlines()[0].split(",")]


# --- the 212-field H200 capture, made busy ----------------------------------------------


def test_h200_busy_full_capture_gpu() -> None:
    gpus, _ = parse_full_query_csv(_read("h200_busy_csv_590.48.01.csv"))
    assert gpus == [
        GPU(
            index=0,
            uuid="GPU-5b2e9c47-1d8a-4f63-b0e5-7c91a3d24e68",
            name="NVIDIA H200",
            memory_total=143771 * MIB,
            memory_used=120345 * MIB,
            utilization=87,
            compute_capability="9.0",
            driver="590.48.01",
            bus_id="00000000:83:00.0",
            memory_utilization=34,
            temperature=61,
            memory_temperature=70,
            power=518.44,
            power_limit=700.0,
            energy=None,
            sm_clock=1980,
            memory_clock=3201,
            fan=None,
            pstate="P0",
            throttle=["sw_power_cap", "hw_thermal_slowdown"],
            pcie_gen=5,
            pcie_width=16,
            pcie_gen_max=5,
            pcie_width_max=16,
            pcie_gen_device_max=5,
            pcie_gen_host_max=None,
            mig_mode=False,
        )
    ]


def test_h200_busy_full_capture_health() -> None:
    _, health = parse_full_query_csv(_read("h200_busy_csv_590.48.01.csv"))
    assert health == [
        GpuHealth(
            uuid="GPU-5b2e9c47-1d8a-4f63-b0e5-7c91a3d24e68",
            index=0,
            persistence_mode=True,
            ecc_mode=True,
            ecc_volatile_corrected=4,
            ecc_volatile_uncorrected=1,
            ecc_aggregate_corrected=14,
            ecc_aggregate_uncorrected=1,
            retired_pages=None,
            retired_pending=None,
            remapped_correctable=2,
            remapped_uncorrectable=1,
            remap_pending=True,
            remap_failed=False,
        )
    ]


def test_h200_fixture_keeps_the_capture_layout() -> None:
    text = _read("h200_busy_csv_590.48.01.csv")
    names = _header_fields(text)
    assert len(names) == 212
    assert set(FULL_QUERY_FIELDS) <= set(names)


# --- two cards, csv,nounits --------------------------------------------------------------


def test_two_cards_nounits() -> None:
    text = _read("a5000-workstation_2cards_csv-nounits_590.44.01.csv")
    assert _header_fields(text) == list(FULL_QUERY_FIELDS)
    gpus, health = parse_full_query_csv(text)
    assert gpus == [
        GPU(
            index=0,
            uuid="GPU-c4e1a9d2-7b36-4f08-9e5a-1d2f3b4c5a01",
            name="NVIDIA RTX A5000",
            memory_total=24564 * MIB,
            memory_used=21870 * MIB,
            utilization=97,
            compute_capability="8.6",
            driver="590.44.01",
            bus_id="00000000:81:00.0",
            memory_utilization=61,
            temperature=71,
            memory_temperature=None,
            power=214.90,
            power_limit=230.0,
            sm_clock=1950,
            memory_clock=8001,
            fan=62,
            pstate="P2",
            throttle=[],
            pcie_gen=4,
            pcie_width=16,
            pcie_gen_max=4,
            pcie_width_max=16,
            pcie_gen_device_max=4,
            pcie_gen_host_max=4,
            mig_mode=None,
        ),
        GPU(
            index=1,
            uuid="GPU-c4e1a9d2-7b36-4f08-9e5a-1d2f3b4c5a02",
            name="NVIDIA RTX A5000",
            memory_total=24564 * MIB,
            memory_used=17246 * MIB,
            utilization=0,
            compute_capability="8.6",
            driver="590.44.01",
            bus_id="00000000:c1:00.0",
            memory_utilization=0,
            temperature=39,
            memory_temperature=None,
            power=13.59,  # the instant reading is [Unknown Error]: the average is read
            power_limit=230.0,
            sm_clock=210,
            memory_clock=405,
            fan=30,
            pstate="P8",
            throttle=["gpu_idle"],
            pcie_gen=1,
            pcie_width=16,
            pcie_gen_max=4,
            pcie_width_max=16,
            pcie_gen_device_max=4,
            pcie_gen_host_max=4,
            mig_mode=None,
        ),
    ]
    ecc_off = GpuHealth(
        uuid="GPU-c4e1a9d2-7b36-4f08-9e5a-1d2f3b4c5a01",
        index=0,
        persistence_mode=True,
        ecc_mode=False,
        ecc_volatile_corrected=None,
        ecc_volatile_uncorrected=None,
        ecc_aggregate_corrected=None,
        ecc_aggregate_uncorrected=None,
        retired_pages=None,
        retired_pending=None,
        remapped_correctable=0,
        remapped_uncorrectable=0,
        remap_pending=False,
        remap_failed=False,
    )
    assert health == [
        ecc_off,
        replace(ecc_off, uuid="GPU-c4e1a9d2-7b36-4f08-9e5a-1d2f3b4c5a02", index=1),
    ]


# --- the CSV twin of the H100 XML fixture ------------------------------------------------

# Figures nvidia-smi -q -x gives and --query-gpu does not, or the other way round.
_GPU_ONLY_ONE_SIDE = {"compute_capability", "processes"}
# The CSV query does not ask for the fabric.* fields (multi-node NVLink) yet.
_HEALTH_ONLY_ONE_SIDE = {
    "persistence_mode",
    "fabric_state",
    "fabric_status",
    "fabric_cluster_uuid",
    "fabric_clique_id",
    "fabric_health",
}


def test_h100_csv_twin_matches_the_xml_reading() -> None:
    text = _read("h100-hgx_card0_csv_580.105.08.csv")
    assert _header_fields(text) == list(FULL_QUERY_FIELDS)
    csv_gpus, csv_health = parse_full_query_csv(text)
    xml_gpus, xml_health = from_smi_xml(
        parse_smi_xml((FIXTURES / "smi" / "h100-hgx_2cards_580.105.08.xml").read_text())
    )
    assert len(csv_gpus) == len(csv_health) == 1
    compared = 0
    for f in fields(GPU):
        if f.name in _GPU_ONLY_ONE_SIDE:
            continue
        assert getattr(csv_gpus[0], f.name) == getattr(xml_gpus[0], f.name), f.name
        compared += 1
    for f in fields(GpuHealth):
        if f.name in _HEALTH_ONLY_ONE_SIDE:
            continue
        assert getattr(csv_health[0], f.name) == getattr(xml_health[0], f.name), f.name
        compared += 1
    assert compared > 40
    # The figures that say the comparison is not between two empty records.
    assert csv_gpus[0].throttle == ["sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"]
    assert csv_gpus[0].power == 70.12
    assert csv_health[0].ecc_aggregate_corrected == 21
    assert csv_health[0].remap_pending is True
    # What only one side has.
    assert csv_gpus[0].compute_capability == "9.0"
    assert xml_gpus[0].compute_capability is None
    assert csv_health[0].persistence_mode is True


# --- cells ------------------------------------------------------------------------------

_HEAD = "index, uuid, name"
_CARD = "0, GPU-11111111-2222-3333-4444-555555555555, NVIDIA H100 80GB HBM3"


def _one(header: str, row: str) -> tuple[GPU, GpuHealth]:
    gpus, health = parse_full_query_csv(f"{_HEAD}, {header}\n{_CARD}, {row}\n")
    assert len(gpus) == len(health) == 1
    return gpus[0], health[0]


@pytest.mark.parametrize(
    "absent",
    [
        "[N/A]",
        "N/A",
        "[Not Supported]",
        "Not Supported",
        "[Unknown Error]",
        "Unknown Error",
        "[Insufficient Permissions]",
        "[Requested functionality has been deprecated]",
        "[GPU is lost]",
        "",
    ],
)
def test_absent_words_read_as_none_never_zero(absent: str) -> None:
    header = (
        "memory.total [MiB], utilization.gpu [%], temperature.gpu, power.draw [W], "
        "clocks.current.sm [MHz], fan.speed [%], pstate, clocks_event_reasons.active, "
        "pcie.link.gen.gpucurrent, mig.mode.current, persistence_mode, "
        "ecc.errors.corrected.volatile.total, retired_pages.single_bit_ecc.count, "
        "retired_pages.double_bit.count, remapped_rows.pending, compute_cap, driver_version"
    )
    gpu, health = _one(header, ", ".join([absent] * 17))
    assert gpu == GPU(
        index=0, uuid="GPU-11111111-2222-3333-4444-555555555555", name="NVIDIA H100 80GB HBM3"
    )
    assert health == GpuHealth(uuid=gpu.uuid, index=0)


def test_missing_columns_are_none() -> None:
    gpus, health = parse_full_query_csv(f"{_HEAD}\n{_CARD}\n")
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    assert gpus == [GPU(index=0, uuid=uuid, name="NVIDIA H100 80GB HBM3")]
    assert health == [GpuHealth(uuid=gpus[0].uuid, index=0)]


def test_zero_is_read_as_zero() -> None:
    gpu, health = _one(
        "utilization.gpu [%], fan.speed [%], ecc.errors.uncorrected.aggregate.total, "
        "retired_pages.sbe, retired_pages.dbe",
        "0 %, 0 %, 0, 0, 0",
    )
    assert (gpu.utilization, gpu.fan) == (0, 0)
    assert (health.ecc_aggregate_uncorrected, health.retired_pages) == (0, 0)


def test_units_and_nounits_read_alike() -> None:
    header = (
        "memory.total [MiB], memory.used [MiB], temperature.gpu, power.draw [W], "
        "enforced.power.limit [W], clocks.current.sm [MHz], clocks.current.memory [MHz]"
    )
    with_units = _one(header, "143771 MiB, 1024 MiB, 61 C, 512.30 W, 700.00 W, 1980 MHz, 3201 MHz")
    without = _one(header, "143771, 1024, 61, 512.30, 700.00, 1980, 3201")
    assert with_units == without
    gpu = with_units[0]
    assert (gpu.memory_total, gpu.memory_used) == (143771 * MIB, 1024 * MIB)
    assert (gpu.temperature, gpu.power, gpu.power_limit) == (61, 512.30, 700.0)
    assert (gpu.sm_clock, gpu.memory_clock) == (1980, 3201)


def test_size_unit_from_the_value_then_the_header() -> None:
    gpu, _ = _one("memory.total [GiB], memory.used", "80, 2 GiB")
    assert (gpu.memory_total, gpu.memory_used) == (80 << 30, 2 << 30)


def test_a_number_with_the_wrong_unit_is_not_read() -> None:
    gpu, _ = _one("power.draw [W], temperature.gpu, utilization.gpu [%]", "70 MHz, 61 F, 3 W")
    assert (gpu.power, gpu.temperature, gpu.utilization) == (None, None, None)


def test_aliases_are_read_as_the_fields_they_name() -> None:
    gpus, health = parse_full_query_csv(
        "gpu_name, gpu_uuid, index, gpu_bus_id, clocks.sm [MHz], clocks.mem [MHz], "
        "clocks_throttle_reasons.active, gpu.power.current_limit [W], retired_pages.sbe, "
        "retired_pages.dbe, remapped_rows.sbe, remapped_rows.dbe, pcie.link.gen.current\n"
        "Tesla V100-SXM2-32GB, GPU-aaaaaaaa-0000-0000-0000-000000000001, 3, 00000000:8A:00.0, "
        "1530 MHz, 877 MHz, 0x0000000000000006, 300.00 W, 2, 1, [N/A], [N/A], 3\n"
    )
    gpu, card = gpus[0], health[0]
    assert (gpu.index, gpu.name, gpu.bus_id) == (3, "Tesla V100-SXM2-32GB", "00000000:8a:00.0")
    assert (gpu.sm_clock, gpu.memory_clock, gpu.power_limit, gpu.pcie_gen) == (1530, 877, 300.0, 3)
    assert gpu.throttle == ["applications_clocks", "sw_power_cap"]
    assert (card.retired_pages, card.remapped_correctable) == (3, None)


def test_throttle_from_reason_columns_when_no_mask() -> None:
    gpu, _ = _one(
        "clocks_event_reasons.active, clocks_event_reasons.gpu_idle, "
        "clocks_event_reasons.applications_clocks_setting, "
        "clocks_event_reasons.hw_power_brake_slowdown, clocks_event_reasons.sw_power_cap",
        "[N/A], Not Active, Active, Active, Not Active",
    )
    assert gpu.throttle == ["applications_clocks", "hw_power_brake_slowdown"]
    idle, _ = _one(
        "clocks_throttle_reasons.gpu_idle, clocks_throttle_reasons.sync_boost", "Active, Not Active"
    )
    assert idle.throttle == ["gpu_idle"]
    quiet, _ = _one("clocks_event_reasons.sw_power_cap", "Not Active")
    assert quiet.throttle == []
    unknown, _ = _one("clocks_event_reasons.sw_power_cap", "[N/A]")
    assert unknown.throttle is None


def test_mask_wins_over_reason_columns() -> None:
    gpu, _ = _one(
        "clocks_event_reasons.gpu_idle, clocks_event_reasons.active", "Active, 0x0000000000000048"
    )
    assert gpu.throttle == ["hw_slowdown", "hw_thermal_slowdown"]


def test_retired_pages_sum_and_flags() -> None:
    _, health = _one(
        "retired_pages.single_bit_ecc.count, retired_pages.double_bit.count, "
        "retired_pages.pending, remapped_rows.failure, ecc.mode.current",
        "2, 1, Yes, Yes, Disabled",
    )
    assert (health.retired_pages, health.retired_pending) == (3, True)
    assert (health.remap_failed, health.ecc_mode) == (True, False)


def test_odd_values_are_none() -> None:
    gpu, health = _one(
        "pstate, compute_cap, clocks_event_reasons.active, mig.mode.current, persistence_mode",
        "Unknown, 9, 0xZZ, Maybe, On",
    )
    assert (gpu.pstate, gpu.compute_capability, gpu.throttle, gpu.mig_mode) == (
        None,
        None,
        None,
        None,
    )
    assert health.persistence_mode is None


def test_mig_enabled_and_crlf() -> None:
    text = f"{_HEAD}, mig.mode.current\r\n{_CARD}, Enabled\r\n"
    gpus, _ = parse_full_query_csv(text)
    assert gpus[0].mig_mode is True


def test_header_only_is_no_cards() -> None:
    assert parse_full_query_csv(f"{_HEAD}, memory.total [MiB]\n") == ([], [])


# --- refused ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("  \n\n", "empty"),
        (f"{_CARD}\n", "not a header row"),
        (
            (FIXTURES / "nvidia-smi_8xH100_noheader-nounits.csv").read_text(),
            "not a header row",
        ),
        ("No devices were found\n", "not a header row"),
        ('Field "bogus" is not a valid field to query.\n', "not a header row"),
        ("<?xml version='1.0'?><nvidia_smi_log/>\n", "not a header row"),
        ("index, name, memory.total [MiB]\n0, NVIDIA H200, 143771 MiB\n", "lacks uuid"),
        ("timestamp, driver_version\n2026/07/03 22:10:46.109, 590.48.01\n", "lacks index"),
        (f"{_HEAD}, pstate\n{_CARD}\n", "line 2: 3 fields where the header has 4"),
        (f"{_HEAD}\n{_CARD}, P0\n", "line 2: 4 fields"),
        (f"{_HEAD}\nzero, GPU-1, NVIDIA H200\n", "no card index"),
        (f"{_HEAD}\n0, [N/A], NVIDIA H200\n", "no uuid or name"),
    ],
)
def test_junk_is_refused(text: str, words: str) -> None:
    with pytest.raises(SmiCsvError, match=words.replace("[", r"\[")):
        parse_full_query_csv(text)


def test_error_is_a_value_error() -> None:
    assert issubclass(SmiCsvError, ValueError)


def test_full_query_fields_are_unique_and_nvidia_smi_names() -> None:
    assert len(set(FULL_QUERY_FIELDS)) == len(FULL_QUERY_FIELDS)
    assert FULL_QUERY_FIELDS[:3] == ("index", "uuid", "name")
    # Every one is spelled as the 212-field capture's header spells it.
    capture = _header_fields(_read("h200_busy_csv_590.48.01.csv"))
    assert [f for f in FULL_QUERY_FIELDS if f not in capture] == []
