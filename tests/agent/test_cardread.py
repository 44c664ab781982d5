"""Cards into wire records: NVML's answers (through FakeNvml) and ``nvidia-smi -q -x``'s."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.discovery.cardread import (
    LOST_CARD_FIX,
    CardWide,
    from_smi_xml,
    read_nvml,
    read_nvml_health,
)
from llmgw.agent.discovery.health import card_warnings
from llmgw.agent.discovery.nvml import FIGURES, NvmlError
from llmgw.agent.discovery.nvmlfake import FakeCard, FakeNvml
from llmgw.agent.discovery.smixml import parse_smi_xml
from llmgw.wire.hardware import CARD_WIDE_FIGURES, GPU, GpuHealth, GpuProcess
from llmgw.wire.warnings import warning_kind

SMI = Path(__file__).parent / "fixtures" / "smi"
MiB = 1 << 20
GiB = 1 << 30

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
PARENT = "GPU-d41f09c2-5e77-4a1b-8c3e-7f20b6a91c3d"

FULL: dict[str, Any] = {
    "bus_id": "00000000:3b:00.0",
    "memory_utilization": 41,
    "temperature": 67,
    "memory_temperature": 74,
    "power": 412.5,  # W, as NvmlSource answers (PynvmlSource divides NVML's mW)
    "power_limit": 700.0,
    "energy": 123456.789,  # J since the driver loaded
    "sm_clock": 1980,
    "memory_clock": 2619,
    "fan": 35,
    "pstate": 0,
    "throttle": 0x1 | 0x4 | 0x40 | 0x1000,  # idle, power cap, hw thermal, an unknown bit
    "pcie_gen": 4,
    "pcie_width": 8,
    "pcie_gen_max": 5,
    "pcie_width_max": 16,
    "processes": [(4021, 70 * GiB), (4022, None)],
    "gpm": {"sm_active": 0.5, "sm_occupancy": 0.25, "tensor_active": 0.75, "dram_active": 0.125},
    "mig_mode": False,
}

# The figures read_nvml asks for a card not in MIG mode, one call each.
GPU_FIGURES = 20


def full_card(uuid: str = "GPU-full", **figures: Any) -> FakeCard:
    return FakeCard(
        uuid,
        H100,
        memory_total=80 * GiB,
        memory_used=70 * GiB,
        utilization=97,
        compute_capability=(9, 0),
        figures={**FULL, **figures},
    )


def started(*cards: FakeCard, driver: str | None = "580.105.08") -> FakeNvml:
    nvml = FakeNvml(list(cards), driver=driver)
    nvml.init()
    return nvml


# -- read_nvml -------------------------------------------------------------------------


def test_every_figure_is_mapped_with_its_unit() -> None:
    (gpu,), warnings = read_nvml(started(full_card()))
    assert warnings == []
    assert gpu == GPU(
        index=0,
        uuid="GPU-full",
        name=H100,
        memory_total=80 * GiB,
        memory_used=70 * GiB,
        utilization=97,
        compute_capability="9.0",
        driver="580.105.08",
        bus_id="00000000:3b:00.0",
        memory_utilization=41,
        temperature=67,
        memory_temperature=74,
        power=412.5,
        power_limit=700.0,
        energy=123456.789,
        sm_clock=1980,
        memory_clock=2619,
        fan=35,
        pstate="P0",
        throttle=["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"],
        pcie_gen=4,
        pcie_width=8,
        pcie_gen_max=5,
        pcie_width_max=16,
        sm_active=0.5,
        sm_occupancy=0.25,
        tensor_active=0.75,
        dram_active=0.125,
        processes=[GpuProcess(pid=4021, memory=70 * GiB), GpuProcess(pid=4022, memory=None)],
        mig_mode=False,
        mig_parent=None,
        mig_profile=None,
        mig_class=None,
    )
    assert isinstance(gpu.power, float) and isinstance(gpu.energy, float)


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0, []),  # read, and nothing holds the clocks: [] not None
        (0x4, ["sw_power_cap"]),
        (0x8 | 0x20 | 0x80, ["hw_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"]),
        (0x2 | 0x10 | 0x100, ["applications_clocks", "sync_boost", "display_clocks"]),
        (0x1000 | 0x8000, []),  # bits this version does not know
    ],
)
def test_throttle_mask_is_decoded(mask: int, names: list[str]) -> None:
    (gpu,), _ = read_nvml(started(full_card(throttle=mask)))
    assert gpu.throttle == names


@pytest.mark.parametrize(("number", "pstate"), [(0, "P0"), (8, "P8"), (15, "P15"), (16, None)])
def test_pstate_is_named(number: int, pstate: str | None) -> None:
    (gpu,), _ = read_nvml(started(full_card(pstate=number)))
    assert gpu.pstate == pstate


def test_gpm_with_no_sample_yet_leaves_the_counters_absent() -> None:
    # The first GPM call has one sample only and answers {}; the ratios are not 0.
    (gpu,), _ = read_nvml(started(full_card(gpm={})))
    assert (gpu.sm_active, gpu.sm_occupancy, gpu.tensor_active, gpu.dram_active) == (
        None,
        None,
        None,
        None,
    )
    (gpu,), _ = read_nvml(started(full_card(gpm={"tensor_active": 0.5})))
    assert (gpu.sm_active, gpu.tensor_active) == (None, 0.5)


def test_a_card_where_every_figure_raises_is_still_reported_with_none() -> None:
    nvml = started(FakeCard("GPU-bare", "NVIDIA L4"), driver=None)
    (gpu,), warnings = read_nvml(nvml)
    assert warnings == []
    assert (gpu.index, gpu.uuid, gpu.name) == (0, "GPU-bare", "NVIDIA L4")
    optional = [f.name for f in dataclasses.fields(GPU) if f.name not in {"index", "uuid", "name"}]
    assert {name: getattr(gpu, name) for name in optional} == dict.fromkeys(optional)
    assert nvml.figure_calls == GPU_FIGURES  # each asked for, none given


def test_a_figure_that_raises_does_not_stop_the_others() -> None:
    # Only two figures answer, one read early and one read last; every other one raises.
    nvml = started(FakeCard("GPU-some", "NVIDIA L4", figures={"throttle": 0x40, "mig_mode": False}))
    (gpu,), _ = read_nvml(nvml)
    assert gpu.throttle == ["hw_thermal_slowdown"]
    assert gpu.mig_mode is False
    assert gpu.temperature is None and gpu.processes is None
    assert nvml.figure_calls == GPU_FIGURES

    nvml = started(FakeCard("GPU-t", "NVIDIA L4", figures={"temperature": 0, "fan": 0}))
    (gpu,), _ = read_nvml(nvml)
    assert (gpu.temperature, gpu.fan) == (0, 0)  # a real zero stays a zero
    assert gpu.power is None


def test_figures_of_the_wrong_type_are_left_out() -> None:
    weird = {
        "temperature": True,  # a bool is no temperature
        "power": "412 W",
        "pstate": "P0",
        "throttle": "0x40",
        "processes": "4021",
        "gpm": [0.5],
        "mig_mode": 1,
    }
    (gpu,), _ = read_nvml(started(FakeCard("GPU-w", "NVIDIA L4", figures=weird)))
    assert (gpu.temperature, gpu.power, gpu.pstate, gpu.throttle) == (None, None, None, None)
    assert (gpu.processes, gpu.sm_active, gpu.mig_mode) == (None, None, None)


def test_a_lost_card_gives_a_warning_and_is_skipped() -> None:
    nvml = started(
        full_card("GPU-0"),
        FakeCard("GPU-1", H100, lost=True, figures=FULL),
        full_card("GPU-2"),
    )
    gpus, warnings = read_nvml(nvml)
    assert [(g.index, g.uuid) for g in gpus] == [(0, "GPU-0"), (2, "GPU-2")]
    assert warnings == [f"NVML: card 1 could not be read (GPU is lost). Fix: {LOST_CARD_FIX}"]
    assert warning_kind(warnings[0]) == "nvml"


def test_the_count_failing_raises() -> None:
    nvml = FakeNvml([full_card()])  # never started: device_count fails
    with pytest.raises(NvmlError):
        read_nvml(nvml)


# -- MIG ---------------------------------------------------------------------------------


def mig_card(instances: list[dict[str, Any]] | None, **figures: Any) -> FakeCard:
    figs: dict[str, Any] = {
        "bus_id": "00000000:01:00.0",
        "temperature": 31,
        "power": 61.88,
        "power_limit": 500.0,
        "mig_mode": True,
        **figures,
    }
    if instances is not None:
        figs["mig_instances"] = instances
    return FakeCard(
        PARENT,
        A100,
        memory_total=81920 * MiB,
        memory_used=50 * MiB,
        compute_capability=(8, 0),
        figures=figs,
    )


INSTANCES = [
    {
        "uuid": "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158",
        "memory_total": 40192 * MiB,
        "memory_used": 13 * MiB,
        "gi_id": 1,
        "ci_id": 0,
        "profile": "3g.40gb",
    },
    {
        "uuid": "MIG-c4819f07-3a6e-5d21-b9f4-60e2a7c31d8b",
        "memory_total": 19968 * MiB,
        "memory_used": 0,
        "gi_id": 3,
        "ci_id": 0,
        "profile": None,  # the profile's name could not be read
    },
]


def test_a_mig_card_is_reported_as_its_instances() -> None:
    nvml = started(full_card("GPU-plain"), mig_card(INSTANCES))
    gpus, warnings = read_nvml(nvml)
    assert warnings == []
    plain, first, second = gpus
    assert plain.uuid == "GPU-plain" and plain.mig_parent is None
    assert first == GPU(
        index=1,
        uuid="MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158",
        name=A100,
        memory_total=40192 * MiB,
        memory_used=13 * MiB,
        utilization=None,
        compute_capability="8.0",
        driver="580.105.08",
        bus_id="00000000:01:00.0",
        temperature=31,
        power=61.88,
        power_limit=500.0,
        mig_mode=True,
        mig_parent=PARENT,
        mig_profile="3g.40gb",
        mig_class="a100-80g-mig-3g.40gb",
    )
    assert (second.uuid, second.index, second.memory_total, second.memory_used) == (
        "MIG-c4819f07-3a6e-5d21-b9f4-60e2a7c31d8b",
        1,
        19968 * MiB,
        0,
    )
    assert (second.mig_parent, second.mig_profile, second.mig_class) == (
        PARENT,
        None,
        "a100-80g-mig-unknown",
    )


@pytest.mark.parametrize("instances", [None, []], ids=["not-read", "none-carved"])
def test_a_mig_card_with_no_instance_is_the_card_itself(
    instances: list[dict[str, Any]] | None,
) -> None:
    (gpu,), warnings = read_nvml(started(mig_card(instances)))
    assert warnings == []
    assert (gpu.uuid, gpu.name, gpu.mig_mode) == (PARENT, A100, True)
    assert (gpu.mig_parent, gpu.mig_profile, gpu.mig_class) == (None, None, None)
    assert (gpu.memory_total, gpu.temperature) == (81920 * MiB, 31)


def test_mig_instances_are_asked_for_only_in_mig_mode() -> None:
    nvml = started(full_card(mig_mode=False, mig_instances=INSTANCES))
    (gpu,), _ = read_nvml(nvml)
    assert gpu.uuid == "GPU-full" and nvml.figure_calls == GPU_FIGURES
    nvml = started(mig_card(INSTANCES))
    read_nvml(nvml)
    assert nvml.figure_calls == GPU_FIGURES + 1


def test_a_throttled_mig_card_still_warns() -> None:
    """A MIG card is reported only as its instances, and card_warnings judges the card
    through them ("a MIG instance shares its card's link and sensors"): the card's
    throttle reasons and PCIe link must reach the instances, or a MIG-mode card held
    down by heat, or trained to x8, never warns."""
    link = {"pcie_gen": 4, "pcie_width": 8, "pcie_gen_max": 4, "pcie_width_max": 16}
    nvml = started(mig_card(INSTANCES, throttle=0x40, **link))
    gpus, _ = read_nvml(nvml)
    assert [g.mig_parent for g in gpus] == [PARENT, PARENT]
    warnings = card_warnings(gpus, [], now=0.0)
    assert [warning_kind(w) for w in warnings] == ["pcie", "throttle"]


# -- read_nvml_health --------------------------------------------------------------------

HEALTH: dict[str, Any] = {
    "persistence_mode": True,
    "ecc_mode": True,
    "ecc_volatile_corrected": 7,
    "ecc_volatile_uncorrected": 1,
    "ecc_aggregate_corrected": 21,
    "ecc_aggregate_uncorrected": 2,
    "retired_pages": 3,
    "retired_pending": False,
    "remapped_rows": (3, 1, True, False),
    "nvlink": [
        (True, {"replay": 1, "recovery": 0, "crc_flit": 2, "crc_data": 0}),
        (False, {"replay": 3, "crc_flit": 5}),
        (True, {}),  # a link whose counters would not read
    ],
}


def test_health_figures_are_mapped() -> None:
    nvml = started(FakeCard("GPU-h", H100, figures=HEALTH))
    (health,) = read_nvml_health(nvml, 1)
    assert health == GpuHealth(
        uuid="GPU-h",
        index=0,
        persistence_mode=True,
        ecc_mode=True,
        ecc_volatile_corrected=7,
        ecc_volatile_uncorrected=1,
        ecc_aggregate_corrected=21,
        ecc_aggregate_uncorrected=2,
        retired_pages=3,
        retired_pending=False,
        remapped_correctable=3,
        remapped_uncorrectable=1,
        remap_pending=True,
        remap_failed=False,
        xids=None,
        nvlink_links=3,
        nvlink_active=2,
        nvlink_errors={"replay": 4, "recovery": 0, "crc_flit": 7, "crc_data": 0},
    )


def test_health_of_a_card_with_no_figures_is_all_none() -> None:
    nvml = started(FakeCard("GPU-bare", "NVIDIA L4"))
    (health,) = read_nvml_health(nvml, 1)
    assert (health.uuid, health.index) == ("GPU-bare", 0)
    rest = [f.name for f in dataclasses.fields(GpuHealth) if f.name not in {"uuid", "index"}]
    assert {name: getattr(health, name) for name in rest} == dict.fromkeys(rest)
    health_figures = [n for n in FIGURES if n in HEALTH]
    # Each figure asked for once; "fabric" (multi-node NVLink) is tested apart, in
    # tests/agent/test_nvlink_fabric.py.
    assert nvml.figure_calls == len(health_figures) + 1 == 11


def test_health_with_zero_counts_reads_zero_not_none() -> None:
    figures = {
        "ecc_volatile_uncorrected": 0,
        "ecc_aggregate_uncorrected": 0,
        "remapped_rows": (0, 0, False, False),
        "nvlink": [(True, {"replay": 0})] * 18,
    }
    (health,) = read_nvml_health(started(FakeCard("GPU-z", H100, figures=figures)), 1)
    assert (health.ecc_volatile_uncorrected, health.ecc_aggregate_uncorrected) == (0, 0)
    assert (health.remapped_correctable, health.remap_pending, health.remap_failed) == (
        0,
        False,
        False,
    )
    assert (health.nvlink_links, health.nvlink_active, health.nvlink_errors) == (
        18,
        18,
        {"replay": 0},
    )


def test_health_remapped_rows_of_the_wrong_shape_is_absent() -> None:
    figures = {"remapped_rows": (3, 1, True), "ecc_mode": "Enabled"}
    (health,) = read_nvml_health(started(FakeCard("GPU-r", H100, figures=figures)), 1)
    assert (health.remapped_correctable, health.remap_pending, health.remap_failed) == (
        None,
        None,
        None,
    )
    assert health.ecc_mode is None


def test_health_skips_a_lost_card_and_reads_only_count_cards() -> None:
    nvml = started(
        FakeCard("GPU-0", H100, figures=HEALTH),
        FakeCard("GPU-1", H100, lost=True, figures=HEALTH),
        FakeCard("GPU-2", H100, figures={"ecc_volatile_uncorrected": 5}),
        FakeCard("GPU-3", H100, figures=HEALTH),
    )
    found = read_nvml_health(nvml, 3)
    assert [(h.index, h.uuid) for h in found] == [(0, "GPU-0"), (2, "GPU-2")]
    assert found[1].ecc_volatile_uncorrected == 5


# -- nvidia-smi -q -x --------------------------------------------------------------------


def smi(name: str) -> tuple[list[GPU], list[GpuHealth]]:
    return from_smi_xml(parse_smi_xml((SMI / name).read_text()))


def test_from_smi_xml_h100() -> None:
    gpus, health = smi("h100-hgx_2cards_580.105.08.xml")
    first, second = gpus
    assert first == GPU(
        index=0,
        uuid="GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f001",
        name=H100,
        memory_total=81559 * MiB,
        memory_used=0,
        utilization=0,
        compute_capability=None,
        driver="580.105.08",
        bus_id="00000000:53:00.0",
        memory_utilization=0,
        temperature=34,
        memory_temperature=45,
        power=70.12,
        power_limit=700.0,
        energy=None,
        sm_clock=345,
        memory_clock=2619,
        fan=None,
        pstate="P0",
        throttle=["sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"],
        pcie_gen=5,
        pcie_width=16,
        pcie_gen_max=5,
        pcie_width_max=16,
        pcie_gen_device_max=5,  # the host's most is N/A in this capture: absent
        processes=[],
        mig_mode=False,
    )
    assert (second.index, second.bus_id, second.throttle) == (1, "00000000:64:00.0", ["gpu_idle"])
    assert (second.pcie_gen, second.pcie_width, second.pcie_gen_max, second.pcie_width_max) == (
        3,
        8,
        5,
        16,
    )
    h0, h1 = health
    assert h0 == GpuHealth(
        uuid=first.uuid,
        index=0,
        persistence_mode=True,
        ecc_mode=True,
        ecc_volatile_corrected=7,
        ecc_volatile_uncorrected=1,
        ecc_aggregate_corrected=21,
        ecc_aggregate_uncorrected=2,
        remapped_correctable=3,
        remapped_uncorrectable=1,
        remap_pending=True,
        remap_failed=False,
        # An HGX board's own NVSwitch fabric: all-zero ClusterUUID, clique 0.
        fabric_state="Completed",
        fabric_status="Success",
        fabric_cluster_uuid="00000000-0000-0000-0000-000000000000",
        fabric_clique_id=0,
    )
    assert (h1.uuid, h1.ecc_volatile_uncorrected, h1.remap_pending) == (second.uuid, 0, False)
    # What nvidia-smi -q -x does not give stays absent (NVLink, Xids); persistence
    # mode it does give.
    assert (h0.persistence_mode, h0.nvlink_links, h0.xids) == (True, None, None)


def test_from_smi_xml_rtx4090_absent_figures_are_none() -> None:
    (gpu,), (health,) = smi("rtx4090-consumer_535.86.05.xml")
    assert (gpu.name, gpu.driver, gpu.pstate, gpu.fan) == (
        "NVIDIA GeForce RTX 4090",
        "535.86.05",
        "P8",
        0,
    )
    assert (gpu.temperature, gpu.power, gpu.power_limit) == (38, 21.37, 450.0)
    assert gpu.memory_used == 417 * MiB
    assert (gpu.memory_temperature, gpu.mig_mode, gpu.energy) == (None, None, None)
    assert (gpu.pcie_gen, gpu.pcie_gen_max) == (1, 3)
    assert health.ecc_mode is False
    assert (
        health.ecc_volatile_corrected,
        health.ecc_volatile_uncorrected,
        health.ecc_aggregate_corrected,
        health.ecc_aggregate_uncorrected,
    ) == (None, None, None, None)


def test_from_smi_xml_v100_old_driver() -> None:
    (gpu,), (health,) = smi("v100-old-driver_470.182.03.xml")
    assert (gpu.name, gpu.driver, gpu.bus_id) == (
        "Tesla V100-SXM2-32GB",
        "470.182.03",
        "00000000:1a:00.0",
    )
    assert (gpu.utilization, gpu.power, gpu.power_limit) == (97, 298.47, 300.0)
    assert gpu.throttle == ["applications_clocks", "sw_power_cap"]
    assert gpu.processes == [GpuProcess(pid=48213, name="python3", memory=31682723840)]
    assert (
        health.ecc_volatile_corrected,
        health.ecc_volatile_uncorrected,
        health.ecc_aggregate_corrected,
        health.ecc_aggregate_uncorrected,
    ) == (2, 0, 10, 1)
    assert (health.retired_pages, health.retired_pending) == (3, True)
    assert (health.remapped_correctable, health.remap_pending, health.remap_failed) == (
        None,
        None,
        None,
    )


def test_from_smi_xml_mig_card_without_instances_is_itself() -> None:
    (gpu,), (health,) = smi("a100-mig_535.54.03.xml")
    assert (gpu.uuid, gpu.mig_mode, gpu.utilization) == (PARENT, True, None)
    assert health.uuid == PARENT


def test_from_smi_xml_mig_card_with_instances_given() -> None:
    log = parse_smi_xml((SMI / "a100-mig_535.54.03.xml").read_text())
    inst = GPU(index=1, uuid="MIG-x", name=A100, mig_mode=True, mig_parent=PARENT)
    gpus, (health,) = from_smi_xml(log, {PARENT: [inst], "GPU-other": [inst]})
    card = from_smi_xml(log)[0][0]  # the card itself, read without its instances
    # The instance carries its card's card-wide figures (temperature, power, link...).
    wide = {name: getattr(card, name) for name in CARD_WIDE_FIGURES}
    assert wide["bus_id"] == "00000000:01:00.0" and wide["temperature"] == 31
    assert gpus == [dataclasses.replace(inst, driver="535.54.03", **wide)]
    assert health.uuid == PARENT  # the slow figures stay the card's


def test_card_wide_types_the_fields_the_wire_names() -> None:
    wide = typing.get_type_hints(CardWide)
    assert tuple(wide) == CARD_WIDE_FIGURES
    assert wide == {k: v for k, v in typing.get_type_hints(GPU).items() if k in wide}
