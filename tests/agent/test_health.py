"""health.card_warnings: each rule fires on a fault and keeps quiet on what is not one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.discovery.cardread import LOST_CARD_FIX, from_smi_xml
from llmgw.agent.discovery.health import XID_WINDOW, card_warnings
from llmgw.agent.discovery.smixml import parse_smi_xml
from llmgw.agent.discovery.xid import xid_meaning
from llmgw.wire.hardware import GPU, GpuHealth, XidSeen
from llmgw.wire.warnings import warning_kind

NOW = 1_750_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
SMI = Path(__file__).parent / "fixtures" / "smi"


def gpu(index: int = 0, uuid: str = "GPU-a", **figures: Any) -> GPU:
    return GPU(index=index, uuid=uuid, name=H100, **figures)


def link(gen: int, width: int, gen_max: int = 5, width_max: int = 16, **more: Any) -> GPU:
    return gpu(
        pcie_gen=gen,
        pcie_width=width,
        pcie_gen_max=gen_max,
        pcie_width_max=width_max,
        bus_id="00000000:3b:00.0",
        **more,
    )


def health(uuid: str = "GPU-a", index: int = 0, **figures: Any) -> GpuHealth:
    return GpuHealth(uuid=uuid, index=index, **figures)


def kinds(warnings: list[str]) -> list[str]:
    return [warning_kind(w) for w in warnings]


# -- pcie --------------------------------------------------------------------------------


def test_width_degraded_at_idle_fires() -> None:
    (said,) = card_warnings([link(5, 8, utilization=0)], [], NOW)
    assert said == (
        f"pcie: card 0 ({H100}) runs at x8 Gen5: 31.5 GB/s of 63.0 (x16 Gen5 possible). "
        "Fix: reseat it or check the slot and riser: `lspci -vv -s 00000000:3b:00.0` "
        "LnkCap/LnkSta"
    )


@pytest.mark.parametrize("utilization", [None, 0, 49])
def test_gen_lower_at_idle_does_not_fire(utilization: int | None) -> None:
    assert card_warnings([link(1, 16, utilization=utilization)], [], NOW) == []


@pytest.mark.parametrize("utilization", [50, 97])
def test_gen_lower_while_busy_fires(utilization: int) -> None:
    (said,) = card_warnings([link(3, 16, gen_max=5, utilization=utilization)], [], NOW)
    assert said.startswith(f"pcie: card 0 ({H100}) runs at x16 Gen3: 15.8 GB/s of 63.0 ")
    assert "(x16 Gen5 possible)" in said


def test_full_link_does_not_fire_even_busy() -> None:
    assert card_warnings([link(5, 16, utilization=100)], [], NOW) == []


def test_pcie_without_a_bus_id_names_a_placeholder() -> None:
    g = gpu(pcie_gen=4, pcie_width=4, pcie_gen_max=4, pcie_width_max=16)
    (said,) = card_warnings([g], [], NOW)
    assert "`lspci -vv -s BUS`" in said


@pytest.mark.parametrize("absent", ["pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max"])
def test_pcie_with_a_figure_missing_does_not_fire(absent: str) -> None:
    figures = {"pcie_gen": 1, "pcie_width": 4, "pcie_gen_max": 5, "pcie_width_max": 16}
    figures[absent] = None
    assert card_warnings([gpu(utilization=100, **figures)], [], NOW) == []


@pytest.mark.parametrize(("gen", "gen_max"), [(0, 4), (4, 8)], ids=["gen-0", "gen-8"])
def test_a_generation_outside_the_table_still_warns_and_does_not_raise(
    gen: int, gen_max: int
) -> None:
    """A generation pcilink has no bandwidth for (0 from a link in reset, 8 from a card
    newer than the table) must not make card_warnings raise: Discovery.live calls it on
    every heartbeat. The width fault is still a warning, without the GB/s."""
    said = card_warnings([link(gen, 8, gen_max=gen_max, utilization=0)], [], NOW)
    assert kinds(said) == ["pcie"]
    assert f"runs at x8 Gen{gen} of x16 Gen{gen_max} possible. Fix: " in said[0]


# -- throttle ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reasons",
    [
        [],
        ["sw_power_cap"],
        ["gpu_idle", "applications_clocks", "sync_boost", "display_clocks", "sw_power_cap"],
        None,
    ],
)
def test_throttle_that_is_not_a_fault_does_not_fire(reasons: list[str] | None) -> None:
    assert card_warnings([gpu(throttle=reasons)], [], NOW) == []


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("hw_thermal_slowdown", "heat (hardware thermal slowdown)"),
        ("sw_thermal_slowdown", "heat (the driver's thermal slowdown)"),
        ("hw_slowdown", "a hardware slowdown (the board's own protection)"),
        ("hw_power_brake_slowdown", "the power brake (the system's power supply asked for it)"),
    ],
)
def test_thermal_and_hardware_throttle_fires(reason: str, words: str) -> None:
    (said,) = card_warnings([gpu(throttle=["sw_power_cap", reason])], [], NOW)
    assert said.startswith(f"throttle: card 0 ({H100}) is held down by {words}. Fix: ")
    assert "nvidia-smi -q -d TEMPERATURE,PERFORMANCE" in said


def test_throttle_names_every_fault_in_one_warning() -> None:
    (said,) = card_warnings([gpu(throttle=["hw_slowdown", "sw_thermal_slowdown"])], [], NOW)
    assert "held down by a hardware slowdown (the board's own protection), heat (the " in said


# -- ecc and remap -------------------------------------------------------------------------


def test_uncorrected_ecc_since_the_driver_loaded_fires() -> None:
    (said,) = card_warnings([gpu(index=3)], [health(index=3, ecc_volatile_uncorrected=4)], NOW)
    assert said.startswith(
        f"ecc: card 3 ({H100}) has uncorrected ECC errors (4 since the driver loaded). Fix: "
    )
    assert "`nvidia-smi -r -i 3`" in said


def test_uncorrected_ecc_over_the_cards_life_fires() -> None:
    (said,) = card_warnings([gpu()], [health(ecc_aggregate_uncorrected=2)], NOW)
    assert "has uncorrected ECC errors (2 over its life). Fix: " in said
    (said,) = card_warnings(
        [gpu()], [health(ecc_volatile_uncorrected=1, ecc_aggregate_uncorrected=2)], NOW
    )
    assert "(1 since the driver loaded, 2 over its life)" in said


def test_corrected_or_zero_ecc_does_not_fire() -> None:
    quiet = health(
        ecc_volatile_corrected=900,
        ecc_aggregate_corrected=12000,
        ecc_volatile_uncorrected=0,
        ecc_aggregate_uncorrected=0,
        retired_pages=2,
        remapped_correctable=5,
        remapped_uncorrectable=1,
        remap_pending=False,
        remap_failed=False,
        retired_pending=False,
    )
    assert card_warnings([gpu()], [quiet], NOW) == []


def test_remap_failed_fires_and_outranks_pending() -> None:
    (said,) = card_warnings([gpu()], [health(remap_failed=True, remap_pending=True)], NOW)
    assert said == (
        f"remap: card 0 ({H100}) could not remap a failing memory row: it has no spare rows "
        "left. Fix: take the card out of service and ask the vendor"
    )


def test_remap_pending_fires() -> None:
    (said,) = card_warnings([gpu(index=1)], [health(index=1, remap_pending=True)], NOW)
    assert said == (
        f"remap: card 1 ({H100}) has a memory row remap waiting for a reset. Fix: drain the "
        "node, then reset the card (`nvidia-smi -r -i 1`) or reboot"
    )


def test_retirement_pending_fires() -> None:
    (said,) = card_warnings([gpu()], [health(retired_pending=True, remap_pending=False)], NOW)
    assert said.startswith(f"remap: card 0 ({H100}) has a page retirement waiting for a reset.")


# -- xid ---------------------------------------------------------------------------------


def test_xid_within_the_hour_fires() -> None:
    seen = [XidSeen(code=79, count=1, last=NOW - 150), XidSeen(code=48, count=3, last=NOW - 60)]
    first, second = card_warnings([gpu()], [health(xids=seen)], NOW)
    meaning, fix = xid_meaning(79)
    assert first == (
        f"xid: card 0 ({H100}) reported Xid 79 (once, 2 min ago): {meaning}. Fix: {fix}"
    )
    assert second.startswith(f"xid: card 0 ({H100}) reported Xid 48 (3 times, last 1 min ago): ")


def test_xid_older_than_the_hour_does_not_fire() -> None:
    old = [XidSeen(code=79, count=5, last=NOW - XID_WINDOW - 1)]
    assert card_warnings([gpu()], [health(xids=old)], NOW) == []
    edge = [XidSeen(code=79, count=1, last=NOW - XID_WINDOW)]
    assert kinds(card_warnings([gpu()], [health(xids=edge)], NOW)) == ["xid"]


def test_xid_of_an_unknown_code_still_fires() -> None:
    (said,) = card_warnings([gpu()], [health(xids=[XidSeen(999, 1, NOW)])], NOW)
    assert said.startswith(f"xid: card 0 ({H100}) reported Xid 999 (once, 0 min ago): ")
    assert " Fix: look the code up in NVIDIA's Xid catalogue" in said


# -- nvlink ------------------------------------------------------------------------------


def test_nvlink_links_down_fires() -> None:
    (said,) = card_warnings(
        [gpu(index=5)], [health(index=5, nvlink_links=18, nvlink_active=16)], NOW
    )
    assert said == (
        f"nvlink: card 5 ({H100}) has 2 of 18 NVLink links down. Fix: "
        "`nvidia-smi nvlink -s -i 5`; reset the card, and check the NVSwitch or bridge"
    )


@pytest.mark.parametrize(("links", "active"), [(18, 18), (None, None), (18, None), (None, 0)])
def test_nvlink_all_up_or_not_read_does_not_fire(links: int | None, active: int | None) -> None:
    assert card_warnings([gpu()], [health(nvlink_links=links, nvlink_active=active)], NOW) == []


# -- across the rules -----------------------------------------------------------------------


def test_none_figures_never_warn() -> None:
    assert card_warnings([gpu(), gpu(1, "GPU-b")], [health(), health("GPU-b", 1)], NOW) == []
    assert card_warnings([], [health()], NOW) == []


def test_health_of_a_card_not_listed_is_not_judged() -> None:
    # Health keyed to another UUID (a card that left the listing) says nothing.
    assert card_warnings([gpu()], [health("GPU-gone", ecc_volatile_uncorrected=9)], NOW) == []


def test_warnings_come_in_card_order_and_rule_order() -> None:
    cards = [
        link(5, 8, utilization=0, throttle=["hw_slowdown"]),
        gpu(1, "GPU-b", throttle=["sw_thermal_slowdown"]),
    ]
    healths = [
        health("GPU-b", 1, nvlink_links=4, nvlink_active=3, ecc_volatile_uncorrected=1),
        health(
            remap_failed=True,
            ecc_aggregate_uncorrected=1,
            xids=[XidSeen(74, 1, NOW - 10)],
            nvlink_links=18,
            nvlink_active=0,
        ),
    ]
    said = card_warnings(cards, healths, NOW)
    assert kinds(said) == [
        "pcie",
        "throttle",
        "ecc",
        "remap",
        "xid",
        "nvlink",
        "throttle",
        "ecc",
        "nvlink",
    ]
    assert all(" Fix: " in w for w in said)
    assert [w.split(" (")[0] for w in said][6:] == [
        "throttle: card 1",
        "ecc: card 1",
        "nvlink: card 1",
    ]


def test_mig_instances_of_one_card_are_judged_once() -> None:
    parent = "GPU-parent"
    instances = [
        GPU(
            index=2,
            uuid=f"MIG-{n}",
            name="NVIDIA A100-SXM4-80GB",
            mig_mode=True,
            mig_parent=parent,
            throttle=["hw_thermal_slowdown"],
            pcie_gen=4,
            pcie_width=8,
            pcie_gen_max=4,
            pcie_width_max=16,
        )
        for n in range(3)
    ]
    slow = health(
        parent,
        2,
        ecc_volatile_uncorrected=1,
        remap_pending=True,
        xids=[XidSeen(94, 1, NOW - 5)],
        nvlink_links=12,
        nvlink_active=11,
    )
    said = card_warnings(instances, [slow], NOW)
    assert kinds(said) == ["pcie", "throttle", "ecc", "remap", "xid", "nvlink"]
    assert all("card 2 (NVIDIA A100-SXM4-80GB)" in w for w in said)
    # Health keyed by an instance's own UUID is not the card's.
    assert kinds(card_warnings(instances, [health("MIG-0", 2, remap_failed=True)], NOW)) == [
        "pcie",
        "throttle",
    ]


def test_two_cards_mig_and_plain_each_judged() -> None:
    a = GPU(index=0, uuid="MIG-a", name="X", mig_parent="GPU-p", throttle=["hw_slowdown"])
    b = GPU(index=1, uuid="GPU-p2", name="Y", throttle=["hw_slowdown"])
    assert [w.split(" (")[0] for w in card_warnings([a, b], [], NOW)] == [
        "throttle: card 0",
        "throttle: card 1",
    ]


def test_h100_fixture_through_nvidia_smi() -> None:
    gpus, healths = from_smi_xml(
        parse_smi_xml((SMI / "h100-hgx_2cards_580.105.08.xml").read_text())
    )
    said = card_warnings(gpus, healths, NOW)
    # Card 0: thermal + hardware throttle, uncorrected ECC, a remap pending.
    # Card 1: trained to x8 Gen3 at idle (the width is the fault, the generation is not).
    assert kinds(said) == ["throttle", "ecc", "remap", "pcie"]
    assert said[1].startswith(
        "ecc: card 0 (NVIDIA H100 80GB HBM3) has uncorrected ECC errors "
        "(1 since the driver loaded, 2 over its life)."
    )
    assert said[3].startswith("pcie: card 1 (NVIDIA H100 80GB HBM3) runs at x8 Gen3: ")
    assert all(" Fix: " in w for w in said)


# -- warning_kind --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("pcie: card 0 runs at x8. Fix: reseat", "pcie"),
        ("xid: card 0 reported Xid 79. Fix: reboot", "xid"),
        (f"NVML: card 1 could not be read (GPU is lost). Fix: {LOST_CARD_FIX}", "nvml"),
        ("nvidia-smi: failed (exit 9): x. Fix: y", "nvidia-smi"),
        ("disk: no answer in 5 s. Fix: remount", "disk"),
        ("no colon at all", "other"),
        ("two words: then a colon", "other"),
        ("", "other"),
    ],
)
def test_warning_kind(text: str, kind: str) -> None:
    assert warning_kind(text) == kind
