"""PCIe links from lspci -vv: capability, state, degradation, bandwidth."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.discovery.pcilink import (
    PciLink,
    bandwidth_gbs,
    gen_of,
    link_warning,
    parse_lspci_link,
)

LSPCI = Path(__file__).parent / "fixtures" / "lspci"


def read(name: str) -> dict[str, PciLink]:
    return parse_lspci_link((LSPCI / name).read_text())


def test_gen5_x16_ok() -> None:
    links = read("lspci-vvv_H100-SXM_19-00.0_gen5-x16-ok.txt")
    assert links == {
        "19:00.0": PciLink(
            speed_cap_gts=32.0,
            width_cap=16,
            speed_sta_gts=32.0,
            width_sta=16,
            gen_cap=5,
            gen_sta=5,
            degraded=False,
            downgraded_words=None,
        )
    }
    assert link_warning("card 0", links["19:00.0"]) is None


def test_x8_gen4_on_a_x16_gen5_card_is_degraded() -> None:
    link = read("lspci-vvv_H100-SXM_3b-00.0_x8-gen4-downgraded.txt")["3b:00.0"]
    assert (link.speed_cap_gts, link.width_cap, link.gen_cap) == (32.0, 16, 5)
    assert (link.speed_sta_gts, link.width_sta, link.gen_sta) == (16.0, 8, 4)
    assert link.degraded
    assert link.width_degraded and link.speed_degraded
    assert link.downgraded_words == "Speed 16GT/s (downgraded), Width x8 (downgraded)"
    assert link.bandwidth_sta_gbs == pytest.approx(15.75, abs=0.01)
    assert link.bandwidth_cap_gbs == pytest.approx(63.0, abs=0.02)
    assert link_warning("card 3", link) == (
        "card 3 runs at x8 Gen4: 15.8 GB/s of 63.0 (x16 Gen5 possible)"
    )


def test_idle_speed_drop_is_degraded_but_not_narrow() -> None:
    links = read("lspci-vvv_RTX6000Ada_01-00.0_idle-2.5GT.txt")
    assert set(links) == {"01:00.0", "01:00.1"}
    card = links["01:00.0"]
    assert (card.gen_cap, card.gen_sta, card.width_sta) == (4, 1, 16)
    assert card.degraded
    assert card.speed_degraded and not card.width_degraded
    assert card.downgraded_words == "Speed 2.5GT/s (downgraded), Width x16"


def test_old_pciutils_without_annotations() -> None:
    links = read("lspci-vv-D_old-pciutils_4-devices.txt")
    assert list(links) == ["0000:3b:00.0", "0000:5e:00.0", "0000:af:00.0"]  # no host bridge
    v100 = links["0000:3b:00.0"]
    assert (v100.gen_cap, v100.width_cap, v100.gen_sta, v100.width_sta) == (3, 16, 3, 8)
    assert v100.degraded and v100.width_degraded and not v100.speed_degraded
    assert v100.downgraded_words is None  # this lspci did not say so; we worked it out
    nic = links["0000:5e:00.0"]
    assert not nic.degraded
    down = links["0000:af:00.0"]
    assert down.speed_sta_gts is None and down.gen_sta is None  # "Speed unknown"
    assert down.width_sta == 0
    assert down.degraded
    assert down.bandwidth_sta_gbs is None
    assert link_warning("nic af:00.0", down) == "nic af:00.0 runs at x0 Gen? of x16 Gen4 possible"


def test_no_devices() -> None:
    assert parse_lspci_link("") == {}
    assert parse_lspci_link("pcilib: Cannot open /proc/bus/pci\n") == {}


@pytest.mark.parametrize(
    ("speed", "gen"),
    [(2.5, 1), (5.0, 2), (8.0, 3), (16.0, 4), (32.0, 5), (64.0, 6), (None, None), (3.0, None)],
)
def test_gen_of(speed: float | None, gen: int | None) -> None:
    assert gen_of(speed) == gen


@pytest.mark.parametrize(
    ("gen", "width", "gbs"),
    [(1, 1, 0.25), (2, 16, 8.0), (3, 16, 15.75), (4, 16, 31.5), (4, 8, 15.75), (5, 16, 63.0)],
)
def test_bandwidth(gen: int, width: int, gbs: float) -> None:
    assert bandwidth_gbs(gen, width) == pytest.approx(gbs, abs=0.06)


def test_bandwidth_gen4_figures_in_a_warning() -> None:
    assert f"{bandwidth_gbs(4, 8):.1f} GB/s of {bandwidth_gbs(4, 16):.1f}" == "15.8 GB/s of 31.5"


def test_bandwidth_of_unknown_generation_is_refused() -> None:
    with pytest.raises(ValueError, match="generation 9"):
        bandwidth_gbs(9, 16)
