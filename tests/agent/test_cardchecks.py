"""The cards' lines of ``llmgw doctor`` (``card_checks``, pure): the driver and CUDA,
one line per card (a MIG card once, with its instances) with its PCIe link, ECC,
throttling and persistence mode, its health warnings and their fixes, then the Xids.
A figure not read is said to be not read. The warnings are made as discovery makes them
(``card_warnings``), so the words checked are the ones a node shows."""

from __future__ import annotations

from dataclasses import replace

from llmgw.agent.cardchecks import PERSISTENCE_FIX, card_checks
from llmgw.agent.discovery import card_warnings
from llmgw.agent.doctor import Check
from llmgw.wire.hardware import GPU, GpuHealth, XidSeen

NOW = 1_800_000_000.0


def h100(index: int = 0, **kw: object) -> GPU:
    card = GPU(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA H100 80GB HBM3",
        driver="580.105.08",
        bus_id=f"00000000:{0x18 + index:02x}:00.0",
        throttle=[],
        pcie_gen=5,
        pcie_width=16,
        pcie_gen_max=5,
        pcie_width_max=16,
        pcie_gen_device_max=5,
        pcie_gen_host_max=5,
    )
    return replace(card, **kw)  # type: ignore[arg-type]


def healthy(index: int = 0, **kw: object) -> GpuHealth:
    h = GpuHealth(
        uuid=f"GPU-{index}",
        index=index,
        persistence_mode=True,
        ecc_mode=True,
        ecc_volatile_corrected=0,
        ecc_volatile_uncorrected=0,
    )
    return replace(h, **kw)  # type: ignore[arg-type]


def checks(
    gpus: list[GPU], health: list[GpuHealth], cuda: str | None = "12.8", kernel_log: bool = True
) -> dict[str, Check]:
    """The doctor's card lines by name, the warnings made as discovery makes them."""
    warnings = card_warnings(gpus, health, NOW)
    made = card_checks(gpus, health, warnings, cuda, kernel_log)
    by_name = {c.name: c for c in made}
    assert len(by_name) == len(made)
    return by_name


def test_a_node_without_cards_has_no_card_lines() -> None:
    assert card_checks([], [], [], None, True) == []


def test_a_healthy_card_is_ok_line_by_line() -> None:
    lines = checks([h100()], [healthy()])
    assert list(lines) == ["driver", "card 0", "xid"]
    assert lines["driver"] == Check("driver", "ok", "driver 580.105.08; CUDA 12.8")
    assert lines["card 0"] == Check(
        "card 0",
        "ok",
        "NVIDIA H100 80GB HBM3: PCIe Gen5 x16 of Gen5 x16; ECC on (0 corrected, "
        "0 uncorrected since the driver loaded); not throttled; persistence mode on",
    )
    assert lines["xid"] == Check("xid", "ok", "no Xid in the last hour of the kernel log")


def test_figures_not_read_are_said_not_read() -> None:
    bare = GPU(index=0, uuid="GPU-0", name="NVIDIA L4")
    lines = checks([bare], [], cuda=None)
    driver = lines["driver"]
    assert (driver.status, driver.detail) == ("warn", "the driver's version was not read")
    assert driver.fix is not None and "nvidia-smi" in driver.fix
    assert lines["card 0"].detail == "NVIDIA L4: PCIe link not read; ECC not read"
    # The driver read, CUDA not.
    assert checks([h100()], [healthy()], cuda=None)["driver"].detail == (
        "driver 580.105.08; CUDA version not read"
    )


def test_every_driver_version_is_named() -> None:
    lines = checks([h100(0), h100(1, driver="570.1")], [healthy(0), healthy(1)])
    assert lines["driver"].detail == "driver 570.1, 580.105.08; CUDA 12.8"


def test_a_card_in_a_slower_slot_says_both() -> None:
    card = h100(pcie_gen=4, pcie_gen_max=4, pcie_gen_host_max=4)
    detail = checks([card], [healthy()])["card 0"].detail
    assert "PCIe Gen4 x16 of Gen4 x16 (the card can run Gen5, its slot Gen4)" in detail


def test_ecc_off_and_throttle_reasons_are_named() -> None:
    card = h100(throttle=["sw_power_cap"])
    detail = checks([card], [healthy(ecc_mode=False)])["card 0"].detail
    assert "; ECC off; throttled: sw_power_cap; " in detail


def test_a_narrow_link_warns_with_its_fix_on_that_card_only() -> None:
    narrow = h100(1, pcie_width=8)
    lines = checks([h100(0), narrow], [healthy(0), healthy(1)])
    assert lines["card 0"].status == "ok"
    card = lines["card 1"]
    assert card.status == "warn"
    assert card.detail.startswith("NVIDIA H100 80GB HBM3: PCIe Gen5 x8 of Gen5 x16; ")
    assert "card 1 (NVIDIA H100 80GB HBM3)" in card.detail
    assert card.fix is not None and "lspci -vv -s 00000000:19:00.0" in card.fix
    assert "Fix:" not in card.detail


def test_a_warning_of_card_1_is_not_card_11s() -> None:
    gpus = [h100(i) for i in range(12)]
    gpus[11] = h100(11, pcie_width=4)
    lines = checks(gpus, [healthy(i) for i in range(12)])
    assert lines["card 11"].status == "warn"
    assert lines["card 1"].status == "ok"


def test_several_warnings_of_one_card_join_their_fixes() -> None:
    card = h100(throttle=["hw_thermal_slowdown"])
    h = healthy(ecc_volatile_uncorrected=2)
    line = checks([card], [h])["card 0"]
    assert line.status == "warn"
    assert "has uncorrected ECC errors (2 since the driver loaded)" in line.detail
    assert "is held down by heat (hardware thermal slowdown)" in line.detail
    assert line.fix is not None and " / " in line.fix
    assert "nvidia-smi -r -i 0" in line.fix and "airflow" in line.fix


def test_persistence_mode_off_warns_with_its_fix() -> None:
    line = checks([h100()], [healthy(persistence_mode=False)])["card 0"]
    assert line.status == "warn" and line.fix == PERSISTENCE_FIX
    assert line.detail.endswith("persistence mode off")


def test_an_xid_goes_to_the_xid_line_not_the_cards() -> None:
    h = healthy(xids=[XidSeen(code=79, count=2, last=NOW - 120)])
    lines = checks([h100()], [h])
    assert lines["card 0"].status == "ok"
    xid = lines["xid"]
    assert xid.status == "warn"
    assert xid.detail.startswith("xid: card 0 (NVIDIA H100 80GB HBM3) reported Xid 79 (2 times")
    assert xid.fix


def test_an_unread_kernel_log_leaves_xids_unknown() -> None:
    xid = checks([h100()], [healthy()], kernel_log=False)["xid"]
    assert xid.status == "warn" and "Xids since boot are unknown" in xid.detail
    assert xid.fix is not None and "/dev/kmsg" in xid.fix


def test_a_mig_card_is_one_line_with_its_instances() -> None:
    parent = "GPU-0"
    instances = [
        h100(0, uuid=f"MIG-{i}", mig_mode=True, mig_parent=parent, mig_profile="3g.40gb")
        for i in range(2)
    ]
    lines = checks(instances, [healthy(0)])
    assert list(lines) == ["driver", "card 0", "xid"]
    card = lines["card 0"]
    assert card.status == "ok"
    assert card.detail.endswith("; MIG on, 2 instance(s): 3g.40gb, 3g.40gb")


def test_mig_on_with_no_instance_carved_warns_how_to_carve() -> None:
    line = checks([h100(2, mig_mode=True)], [healthy(2)])["card 2"]
    assert line.status == "warn"
    assert "MIG on, no instance carved" in line.detail
    assert "no replica can be placed on it" in line.detail
    assert line.fix is not None
    assert "nvidia-smi mig -i 2 -cgi PROFILES -C" in line.fix
    assert "nvidia-smi -i 2 -mig 0" in line.fix
