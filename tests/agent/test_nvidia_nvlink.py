"""NvidiaCards without NVML: NVLink from ``nvidia-smi nvlink -s``/``-e`` on slow reads."""

from __future__ import annotations

from pathlib import Path

from tests.support.fakesmi import calls, cards, fake_smi

FIXTURES = Path(__file__).parent / "fixtures"
H100_XML = FIXTURES / "smi" / "h100-hgx_2cards_580.105.08.xml"
STATUS = FIXTURES / "nvlink" / "nvlink-s_2xH100_card0-6-inactive.txt"
ERRORS = FIXTURES / "nvlink" / "nvlink-e_2xH100_535-layout.txt"
H100_0 = "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f001"
H100_1 = "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f002"


def answering(status: str, errors: str) -> str:
    return (
        f'case "$*" in "-q -x") cat "{H100_XML}";; "nvlink -s") {status};; '
        f'"nvlink -e") {errors};; *) echo "unexpected $*"; exit 3;; esac'
    )


WITH_NVLINK = answering(f'cat "{STATUS}"', f'cat "{ERRORS}"')


async def test_slow_read_gives_nvlink_figures(tmp_path: Path) -> None:
    nv = cards(tmp_path, fake_smi(tmp_path, WITH_NVLINK))
    reading = await nv.read(slow=True)
    assert reading.source == "nvidia-smi" and reading.health is not None
    h0, h1 = reading.health
    assert (h0.uuid, h0.nvlink_links, h0.nvlink_active) == (H100_0, 18, 12)
    assert h0.nvlink_errors == {"replay": 3, "recovery": 1, "crc_flit": 41}
    assert (h1.uuid, h1.nvlink_links, h1.nvlink_active) == (H100_1, 18, 18)
    assert h1.nvlink_errors == {"replay": 0, "recovery": 0, "crc_flit": 0}
    # The rest of the health record is still the XML's.
    assert (h0.ecc_volatile_uncorrected, h0.remapped_correctable, h0.xids) == (1, 3, [])
    assert calls(tmp_path) == ["-q -x", "nvlink -s", "nvlink -e"]
    await nv.close()


async def test_read_that_is_not_slow_runs_no_nvlink_command(tmp_path: Path) -> None:
    nv = cards(tmp_path, fake_smi(tmp_path, WITH_NVLINK))
    first = await nv.read()
    assert first.health is not None
    assert [(h.nvlink_links, h.nvlink_errors) for h in first.health] == [(None, None)] * 2
    assert calls(tmp_path) == ["-q -x"]
    slow = await nv.read(slow=True)
    later = await nv.read()
    # Between slow reads the last figures are repeated, without running nvlink again,
    # so the health records do not change for want of them.
    assert later.health == slow.health
    assert calls(tmp_path) == ["-q -x", "-q -x", "nvlink -s", "nvlink -e", "-q -x"]
    await nv.close()


async def test_headers_without_uuids_go_by_place(tmp_path: Path) -> None:
    no_uuid = "sed 's/ (UUID: [^)]*)//' \"{}\""
    body = answering(no_uuid.format(STATUS), no_uuid.format(ERRORS))
    nv = cards(tmp_path, fake_smi(tmp_path, body))
    reading = await nv.read(slow=True)
    assert reading.health is not None
    assert [(h.uuid, h.nvlink_active, h.nvlink_errors) for h in reading.health] == [
        (H100_0, 12, {"replay": 3, "recovery": 1, "crc_flit": 41}),
        (H100_1, 18, {"replay": 0, "recovery": 0, "crc_flit": 0}),
    ]
    await nv.close()


async def test_without_uuids_the_place_wins_over_the_minor_number(tmp_path: Path) -> None:
    # The A5000 capture lists minor number 1 first: nvidia-smi's "GPU 0" is that card.
    xml = FIXTURES / "smi" / "a5000-workstation_590.44.01.xml"
    no_uuid = f"sed 's/ (UUID: [^)]*)//' \"{STATUS}\""
    body = answering(no_uuid, "exit 9").replace(str(H100_XML), str(xml))
    nv = cards(tmp_path, fake_smi(tmp_path, body))
    reading = await nv.read(slow=True)
    assert reading.health is not None
    assert [(h.index, h.nvlink_active) for h in reading.health] == [(1, 12), (0, 18)]
    await nv.close()


async def test_nvlink_failing_costs_nothing_else(tmp_path: Path) -> None:
    body = answering('echo "NVLink is not supported"; exit 3', f'cat "{ERRORS}"')
    nv = cards(tmp_path, fake_smi(tmp_path, body))
    reading = await nv.read(slow=True)
    assert reading.source == "nvidia-smi" and reading.warnings == []
    assert reading.health is not None and len(reading.health) == 2
    assert all(h.nvlink_links is None and h.nvlink_errors is None for h in reading.health)
    assert reading.health[0].ecc_volatile_uncorrected == 1
    # -s failed: -e is not run.
    assert calls(tmp_path) == ["-q -x", "nvlink -s"]
    await nv.close()


async def test_errors_failing_keeps_the_link_counts(tmp_path: Path) -> None:
    nv = cards(tmp_path, fake_smi(tmp_path, answering(f'cat "{STATUS}"', "exit 9")))
    reading = await nv.read(slow=True)
    assert reading.health is not None
    assert [(h.nvlink_links, h.nvlink_active, h.nvlink_errors) for h in reading.health] == [
        (18, 12, None),
        (18, 18, None),
    ]
    await nv.close()
