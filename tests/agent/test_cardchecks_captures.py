"""Doctor's per-card checks (PCIe link, ECC, persistence mode, MIG) fed from the real
captures in ``../shared/fixtures``: a stand-in ``nvidia-smi`` prints a capture, the
agent reads it as it reads a node's cards (``NvidiaCards``, no NVML), the warnings are
made as discovery makes them, and ``card_checks`` judges. Each check passes on a capture
as recorded and fails, with the words and fix a user sees, on a copy with one value
changed (``tests/fixtures/cardchecks``, its README says which)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.cardchecks import PERSISTENCE_FIX, card_checks
from llmgw.agent.discovery import card_warnings
from llmgw.agent.discovery.health import BUSY_FOR_SPEED
from llmgw.agent.discovery.pcilink import PciLink, parse_lspci_link
from llmgw.agent.doctor import Check
from llmgw.wire.hardware import GPU, GpuHealth
from tests.support.fakesmi import cards, fake_smi
from tests.support.shared import SHARED_FIXTURES

OURS = Path(__file__).parents[1] / "fixtures" / "cardchecks"
H100_XML = SHARED_FIXTURES / "nvidia-smi-q-x_8xH100-80GB-HBM3_580.105.08.xml"
H100_TEXT = SHARED_FIXTURES / "nvidia-smi-q_8xH100-SXM_535.183.01.txt"
A100_MIG_XML = SHARED_FIXTURES / "nvidia-smi-q-x_A100-SXM4-80GB_MIG-enabled_535.54.03.xml"
H100_MIG_TEXT = SHARED_FIXTURES / "nvidia-smi-q_H100-MIG-enabled_590.48.01.txt"
H100_MIG_LIST = SHARED_FIXTURES / "nvidia-smi-L_H100-MIG-enabled_590.48.01.txt"
H100_LSPCI = SHARED_FIXTURES / "lspci-vvv_excerpt_H100-SXM-19-00.0.txt"
ADA_LSPCI = SHARED_FIXTURES / "lspci-vvv_excerpt_RTX6000Ada-PCIe-01-00.0.txt"
ALTERED_XML = OURS / "nvidia-smi-q-x_4xH100_link-x8-ecc-2-persistence-off_580.105.08.xml"
ALTERED_MIG_TEXT = OURS / "nvidia-smi-q_H100-MIG_persistence-off_590.48.01.txt"
NOTHING_CARVED_LIST = OURS / "nvidia-smi-L_H100-MIG-on-nothing-carved_590.48.01.txt"
NARROW_LSPCI = OURS / "lspci-vvv_H100-SXM-19-00.0_width-x8.txt"
NOW = 1_800_000_000.0

H100_OK = (
    "NVIDIA H100 80GB HBM3: PCIe Gen5 x16 of Gen5 x16; ECC on (0 corrected, 0 uncorrected "
    "since the driver loaded); throttled: gpu_idle; persistence mode on"
)


def smi_body(query: Path, listing: Path | None = None) -> str:
    """nvidia-smi answering ``-q -x`` from an XML capture, or only the plain ``-q`` from a
    text one (as a build without XML does), and ``-L`` from ``listing``."""
    if query.suffix == ".xml":
        q = f'-q) cat "{query}";;'
    else:
        q = f'-q) [ "$2" = "-x" ] && exit 9; cat "{query}";;'
    listed = f'-L) cat "{listing}";;' if listing else "-L) exit 9;;"
    return f'case "$1" in {q} {listed} *) exit 3;; esac'


async def doctor_lines(
    tmp_path: Path, query: Path, listing: Path | None = None
) -> dict[str, Check]:
    """The doctor's card lines by name for a node whose nvidia-smi prints these captures."""
    tmp_path.mkdir(exist_ok=True)
    nv = cards(tmp_path, fake_smi(tmp_path, smi_body(query, listing)))
    try:
        reading = await nv.read(slow=True)
    finally:
        await nv.close()
    assert reading.source == "nvidia-smi" and reading.gpus and reading.health is not None
    # As the heartbeat carries them to doctor: the cards' judged warnings and the read's.
    warnings = [*card_warnings(reading.gpus, reading.health, NOW), *reading.warnings]
    made = card_checks(reading.gpus, reading.health, warnings, reading.cuda_version, True)
    by_name = {c.name: c for c in made}
    assert len(by_name) == len(made)
    return by_name


# --- the captures as recorded: every check passes --------------------------------------


@pytest.mark.parametrize("capture", [H100_XML, H100_TEXT], ids=["xml-580", "text-535"])
async def test_a_healthy_hgx_node_is_ok_card_by_card(tmp_path: Path, capture: Path) -> None:
    lines = await doctor_lines(tmp_path, capture)
    assert list(lines) == ["driver", *(f"card {i}" for i in range(8)), "xid"]
    assert lines["driver"].status == "ok"
    for i in range(8):
        line = lines[f"card {i}"]
        if capture == H100_TEXT and i == 2:
            continue  # this capture's card 2 is throttled (below)
        assert (line.status, line.detail, line.fix) == ("ok", H100_OK, None), i


async def test_the_535_text_capture_names_card_2s_real_throttle(tmp_path: Path) -> None:
    line = (await doctor_lines(tmp_path, H100_TEXT))["card 2"]
    assert line.status == "warn"
    assert "throttled: sw_power_cap, hw_power_brake_slowdown, sw_thermal_slowdown" in line.detail
    assert "persistence mode on" in line.detail
    assert line.fix is not None and "power supply" in line.fix


# ``-L`` for the A100 capture (it has none): its card's UUID, and four 1g.20gb devices,
# which is what its four 19968 MiB <mig_device> entries are on an A100 80GB.
A100_LIST = "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e69664bb298)\n" + (
    "".join(
        f"  MIG 1g.20gb     Device  {n}: (UUID: MIG-0000000{n}-0000-0000-0000-00000000000{n})\n"
        for n in range(4)
    )
)


async def test_persistence_mode_is_read_from_the_xml_and_the_text(tmp_path: Path) -> None:
    # Bug this found: -q -x and -q were read without <persistence_mode>, so a node read
    # through nvidia-smi showed no persistence mode, on or off. The A100 capture has it
    # off; the H100 MIG capture (plain text) on.
    listing = tmp_path / "a100-L.txt"
    listing.write_text(A100_LIST)
    a100 = (await doctor_lines(tmp_path / "x", A100_MIG_XML, listing))["card 1"]
    assert a100.status == "warn" and a100.fix == PERSISTENCE_FIX
    assert a100.detail.endswith(
        "; not throttled; persistence mode off; MIG on, 4 instance(s): "
        "1g.20gb, 1g.20gb, 1g.20gb, 1g.20gb"
    )
    text = (await doctor_lines(tmp_path / "t", H100_MIG_TEXT, H100_MIG_LIST))["card 0"]
    assert "; persistence mode on; " in text.detail


async def test_persistence_off_keeps_its_fix_beside_another_warning(tmp_path: Path) -> None:
    # Bug this found: a card with any other warning lost the persistence-mode fix.
    listing = tmp_path / "a100-L.txt"
    listing.write_text(A100_LIST.splitlines()[0] + "\n")  # MIG on, nothing carved
    line = (await doctor_lines(tmp_path / "x", A100_MIG_XML, listing))["card 1"]
    assert line.status == "warn"
    assert "persistence mode off; MIG on, no instance carved" in line.detail
    assert line.fix is not None
    assert line.fix.startswith("carve instances (`nvidia-smi mig -i 1 -cgi PROFILES -C`)")
    assert line.fix.endswith(" / " + PERSISTENCE_FIX)


async def test_a_mig_card_whose_list_fails_is_not_called_empty(tmp_path: Path) -> None:
    # `nvidia-smi -L` exits 9: the instances are not known, which is not "none carved".
    line = (await doctor_lines(tmp_path, A100_MIG_XML))["card 1"]
    assert line.status == "warn"
    assert "MIG on, its instances not read" in line.detail
    assert "no instance carved" not in line.detail
    assert "nvidia-smi -L: the MIG instances could not be listed" in line.detail
    assert line.fix is not None and line.fix.startswith("run `nvidia-smi` by hand")
    assert "carve instances" not in line.fix


async def test_a_mig_card_lists_its_instances_from_the_list(tmp_path: Path) -> None:
    lines = await doctor_lines(tmp_path, H100_MIG_TEXT, H100_MIG_LIST)
    assert list(lines) == ["driver", "card 0", "xid"]
    card = lines["card 0"]
    assert card.status == "ok", card
    assert card.detail == (
        "NVIDIA H100 80GB HBM3: PCIe Gen5 x16 of Gen5 x16; ECC on (0 corrected, 0 "
        "uncorrected since the driver loaded); throttled: gpu_idle; persistence mode on; "
        "MIG on, 4 instance(s): 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb"
    )
    assert lines["driver"].detail == "driver 590.48.01; CUDA 13.1"


# --- one value changed: each check fails with its words and fix ------------------------


async def test_each_altered_card_fails_its_own_check_only(tmp_path: Path) -> None:
    lines = await doctor_lines(tmp_path, ALTERED_XML)
    assert list(lines) == ["driver", "card 0", "card 1", "card 2", "card 3", "xid"]
    assert (lines["card 0"].status, lines["card 0"].detail) == ("ok", H100_OK)
    assert lines["xid"].status == "ok"

    link = lines["card 1"]
    assert link.status == "warn"
    assert link.detail.startswith("NVIDIA H100 80GB HBM3: PCIe Gen5 x8 of Gen5 x16; ")
    assert "pcie: card 1 (NVIDIA H100 80GB HBM3)" in link.detail
    assert link.fix is not None
    assert "reseat it or check the slot and riser" in link.fix
    assert "`lspci -vv -s 00000000:64:00.0` LnkCap/LnkSta" in link.fix

    ecc = lines["card 2"]
    assert ecc.status == "warn"
    assert "ECC on (0 corrected, 2 uncorrected since the driver loaded)" in ecc.detail
    assert "card 2 (NVIDIA H100 80GB HBM3) has uncorrected ECC errors (2 since" in ecc.detail
    assert ecc.fix is not None and "nvidia-smi -r -i 2" in ecc.fix
    assert "llmgw ctl node drain NODE" in ecc.fix

    persistence = lines["card 3"]
    assert persistence.status == "warn"
    assert persistence.detail == H100_OK.replace("persistence mode on", "persistence mode off")
    assert persistence.fix == PERSISTENCE_FIX


async def test_persistence_off_in_the_plain_text_warns_too(tmp_path: Path) -> None:
    line = (await doctor_lines(tmp_path, ALTERED_MIG_TEXT, H100_MIG_LIST))["card 0"]
    assert line.status == "warn" and line.fix == PERSISTENCE_FIX
    assert "; persistence mode off; MIG on, 4 instance(s)" in line.detail


async def test_mig_on_with_nothing_carved_says_how_to_carve(tmp_path: Path) -> None:
    line = (await doctor_lines(tmp_path, H100_MIG_TEXT, NOTHING_CARVED_LIST))["card 0"]
    assert line.status == "warn"
    assert "; MIG on, no instance carved. mig: no MIG instance is carved" in line.detail
    assert line.fix is not None
    assert "`nvidia-smi mig -i 0 -cgi PROFILES -C`" in line.fix
    assert "`nvidia-smi -i 0 -mig 0`" in line.fix


# --- lspci: the link as the kernel sees it --------------------------------------------


def card_on(link: PciLink, bus: str, utilization: int | None) -> GPU:
    """A card whose link figures are lspci's (what NVML and nvidia-smi give besides)."""
    return GPU(
        index=0,
        uuid="GPU-0",
        name="NVIDIA card",
        bus_id=bus,
        utilization=utilization,
        throttle=[],
        pcie_gen=link.gen_sta,
        pcie_width=link.width_sta,
        pcie_gen_max=link.gen_cap,
        pcie_width_max=link.width_cap,
    )


def lspci_line(capture: Path, bus: str, utilization: int | None = 0) -> Check:
    link = parse_lspci_link(capture.read_text())[bus]
    gpu = card_on(link, bus, utilization)
    health = [GpuHealth(uuid="GPU-0", index=0, persistence_mode=True, ecc_mode=True)]
    made = card_checks([gpu], health, card_warnings([gpu], health, NOW), "12.8", True)
    return {c.name: c for c in made}["card 0"]


def test_a_full_link_in_lspci_is_ok() -> None:
    line = lspci_line(H100_LSPCI, "19:00.0")
    assert (line.status, line.detail) == (
        "ok",
        "NVIDIA card: PCIe Gen5 x16 of Gen5 x16; ECC on; not throttled; persistence mode on",
    )


def test_a_narrow_link_in_lspci_warns_and_its_fix_names_that_device() -> None:
    line = lspci_line(NARROW_LSPCI, "19:00.0")
    assert line.status == "warn"
    assert line.detail.startswith("NVIDIA card: PCIe Gen5 x8 of Gen5 x16; ")
    assert line.fix is not None and "`lspci -vv -s 19:00.0` LnkCap/LnkSta" in line.fix


def test_an_idle_card_at_2_5_gts_is_power_saving_until_it_is_busy() -> None:
    # The RTX 6000 Ada capture: lspci says "2.5GT/s (downgraded)" at idle.
    idle = lspci_line(ADA_LSPCI, "01:00.0", utilization=0)
    assert (idle.status, idle.detail.split("; ")[0]) == (
        "ok",
        "NVIDIA card: PCIe Gen1 x16 of Gen4 x16",
    )
    busy = lspci_line(ADA_LSPCI, "01:00.0", utilization=BUSY_FOR_SPEED)
    assert busy.status == "warn" and "PCIe Gen1 x16 of Gen4 x16" in busy.detail
    assert busy.fix is not None and "`lspci -vv -s 01:00.0`" in busy.fix
