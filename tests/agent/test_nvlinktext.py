"""nvidia-smi nvlink -s / -e: link state and summed error counters per card."""

from __future__ import annotations

from pathlib import Path

from llmgw.agent.discovery.nvlinktext import (
    COUNTER_LABELS,
    card_key,
    nvlink_health,
    parse_nvlink_errors,
    parse_nvlink_status,
)
from llmgw.agent.discovery.nvml import NVLINK_COUNTERS

FIXTURES = Path(__file__).parent / "fixtures" / "nvlink"
A100 = "GPU-a1000000-0000-4000-8000-00000000a10{}"
A100_40 = "GPU-a1000000-0000-4000-8000-000000040a00"
H100_0 = "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f001"
H100_1 = "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f002"
B300 = "GPU-b3000000-0000-4000-8000-00000000b300"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_status_8xa100_with_an_inactive_and_na_links() -> None:
    found = parse_nvlink_status(read("nvlink-s_8xA100-SXM4-80GB.txt"))
    assert list(found) == [A100.format(n) for n in range(8)]
    for n in (0, 1, 2, 3, 4, 7):
        assert found[A100.format(n)] == [True] * 12
    assert found[A100.format(5)] == [True] * 7 + [False] + [True] * 4
    assert found[A100.format(6)] == [True] * 10 + [False, False]


def test_status_h100_bridge_inactive_links() -> None:
    found = parse_nvlink_status(read("nvlink-s_2xH100_card0-6-inactive.txt"))
    down = {4, 5, 10, 11, 16, 17}
    assert found == {H100_0: [n not in down for n in range(18)], H100_1: [True] * 18}


def test_status_card_without_links_is_kept_empty_and_junk_is_skipped() -> None:
    text = (
        "Link 0: 25 GB/s\n"  # before any card: skipped
        "=== GPU 0 NVLink ===\n"
        "GPU 0: NVIDIA GeForce RTX 3090 (UUID: GPU-c0)\n"
        "\t NVML: Unable to retrieve NVLink information as all links are inActive\n"
        "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-c1)\n"
        "\t Link 1: 26.562 GB/s\n"
        "some warning line\n"
        "\t Link 0: [N/A]\n"
        "\t Link 2: 0 GB/s\n"
        "\n"
        "GPU 2: NVIDIA GB300\n"
        "\t Link 0: 53.125 GB/s\n"
    )
    assert parse_nvlink_status(text) == {
        "GPU-c0": [],
        "GPU-c1": [False, True, False],  # link order, not line order
        "index:2": [True],
    }


def test_empty_texts_are_empty() -> None:
    for text in ("", "\n\n", "No devices were found\n", "NVLink is not supported\n"):
        assert parse_nvlink_status(text) == {}
        assert parse_nvlink_errors(text) == {}


def test_errors_a100_535_summed_over_links() -> None:
    found = parse_nvlink_errors(read("nvlink-e_A100-SXM4-40GB_GPU0_535.txt"))
    assert found == {A100_40: {"replay": 17, "recovery": 2, "crc_flit": 7}}


def test_errors_two_h100_cards() -> None:
    found = parse_nvlink_errors(read("nvlink-e_2xH100_535-layout.txt"))
    assert found == {
        H100_0: {"replay": 3, "recovery": 1, "crc_flit": 41},
        H100_1: {"replay": 0, "recovery": 0, "crc_flit": 0},
    }


def test_errors_nvlink5_layout_maps_nothing() -> None:
    # None of the Blackwell counters is one of NVML's four: absent, never 0.
    found = parse_nvlink_errors(read("nvlink-e_2xB300_nvlink5-layout_constructed.txt"))
    assert found == {B300: {}, "index:1": {}}


def test_errors_labels_na_and_junk() -> None:
    text = (
        "GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-x)\n"
        "\t Link 0: CRC Flit Errors: 4\n"
        "\t Link 0: CRC Data Errors: 1\n"
        "\t Link 0: Replay Errors: N/A\n"
        "\t Link 1: crc  data errors: 1,002\n"
        "\t Link 1: Recovery Errors: [Not Supported]\n"
        "\t Link 1: FEC Errors - 3: 175\n"
        "\t Link 1: Effective BER: 15e-255\n"
        "nvidia-smi: some warning: 9\n"
    )
    assert parse_nvlink_errors(text) == {"GPU-x": {"crc_flit": 4, "crc_data": 1003}}


def test_labels_map_onto_nvml_counter_names() -> None:
    assert set(COUNTER_LABELS.values()) == set(NVLINK_COUNTERS)


def test_health_per_card() -> None:
    status = parse_nvlink_status(read("nvlink-s_2xH100_card0-6-inactive.txt"))
    errors = parse_nvlink_errors(read("nvlink-e_2xH100_535-layout.txt"))
    assert nvlink_health(status, errors) == {
        H100_0: (18, 12, {"replay": 3, "recovery": 1, "crc_flit": 41}),
        H100_1: (18, 18, {"replay": 0, "recovery": 0, "crc_flit": 0}),
    }


def test_health_without_counters_and_without_links() -> None:
    status = {"GPU-a": [True, False], "GPU-b": [], "index:2": [True]}
    errors = {"GPU-a": {}, "GPU-c": {"replay": 1}}
    assert nvlink_health(status, errors) == {"GPU-a": (2, 1, None), "index:2": (1, 1, None)}
    assert nvlink_health(status, None) == {"GPU-a": (2, 1, None), "index:2": (1, 1, None)}
    assert nvlink_health({}, errors) == {}


def test_card_key() -> None:
    assert card_key("GPU-a", 3) == "GPU-a"
    assert card_key(None, 3) == card_key("", 3) == "index:3"
