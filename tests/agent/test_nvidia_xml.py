"""NvidiaCards without NVML: ``nvidia-smi -q -x`` first, the CSV query when it cannot."""

from __future__ import annotations

from pathlib import Path

from llmgw.agent.discovery import QUERY_FIELDS, FakeCard, FakeNvml, NvidiaCards
from llmgw.agent.discovery.smicsv import FULL_QUERY_FIELDS
from llmgw.agent.discovery.xidwatch import XidWatch
from llmgw.wire.hardware import GpuHealth
from tests.support.fakesmi import calls, cards, fake_smi

FIXTURES = Path(__file__).parent / "fixtures"
H100_XML = FIXTURES / "smi" / "h100-hgx_2cards_580.105.08.xml"
A100_MIG_XML = FIXTURES / "smi" / "a100-mig_535.54.03.xml"
H100_CSV = FIXTURES / "nvidia-smi_8xH100_noheader-nounits.csv"
MiB = 1 << 20
H100_0 = "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f001"
H100_1 = "GPU-3f6d2a10-8c41-4e2b-9a7d-51c0e8b2f002"
A100 = "GPU-d41f09c2-5e77-4a1b-8c3e-7f20b6a91c3d"
MIGS = [
    "MIG-7a2e51c4-09bd-5f3e-8c61-2b4d7e90f158",
    "MIG-c4819f07-3a6e-5d21-b9f4-60e2a7c31d8b",
    "MIG-15d3b8e2-7c40-5a9f-a306-e8f1c2b4975d",
    "MIG-e90f6a1d-4b25-5c87-9d13-a7c5f0e2b846",
]
A100_LIST = (
    f"GPU 1: NVIDIA A100-SXM4-80GB (UUID: {A100})\n"
    f"  MIG 1g.20gb     Device  0: (UUID: {MIGS[0]})\n"
    f"  MIG 1g.20gb     Device  1: (UUID: {MIGS[1]})\n"
    f"  MIG 1g.20gb     Device  2: (UUID: {MIGS[2]})\n"
    f"  MIG 1g.20gb     Device  3: (UUID: {MIGS[3]})\n"
)


XML_ONLY = f'case "$1" in -q) cat "{H100_XML}";; *) echo "unexpected $*"; exit 3;; esac'
CSV_ONLY = f'case "$1" in -q) echo "Invalid combination of input arguments"; exit 9;; --query-gpu=*) cat "{H100_CSV}";; *) exit 3;; esac'  # noqa: E501


async def test_xml_gives_every_figure(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, XML_ONLY)
    nv = cards(tmp_path, smi)
    reading = await nv.read()
    assert reading.source == "nvidia-smi" and reading.warnings == []
    assert reading.gpus is not None
    first, second = reading.gpus
    assert (first.uuid, first.name, first.driver) == (H100_0, "NVIDIA H100 80GB HBM3", "580.105.08")
    assert (first.temperature, first.memory_temperature, first.power, first.power_limit) == (
        34,
        45,
        70.12,
        700.0,
    )
    assert first.memory_total == 81559 * MiB
    assert first.throttle == ["sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"]
    assert (second.uuid, second.pcie_gen, second.pcie_width) == (H100_1, 3, 8)
    # Not slow: -q -x gives the slow figures anyway (sent when they change); no CUDA
    # version; no MIG card, so no -L.
    assert reading.health is not None and reading.health[0].ecc_volatile_uncorrected == 1
    assert reading.cuda_version is None
    assert calls(tmp_path) == ["-q -x"]
    await nv.close()


async def test_xml_slow_read_gives_health(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, XML_ONLY)
    nv = cards(tmp_path, smi)
    reading = await nv.read(slow=True)
    assert reading.source == "nvidia-smi" and reading.cuda_version == "13.0"
    assert reading.health is not None
    h0, h1 = reading.health
    assert h0 == GpuHealth(
        uuid=H100_0,
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
        xids=[],
        fabric_state="Completed",
        fabric_status="Success",
        fabric_cluster_uuid="00000000-0000-0000-0000-000000000000",
        fabric_clique_id=0,
    )
    assert (h1.uuid, h1.ecc_volatile_uncorrected, h1.xids) == (H100_1, 0, [])
    await nv.close()


async def test_xml_xids_from_the_kernel_log_reach_the_health(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("4,7,5000000,-;NVRM: Xid (PCI:0000:64:00): 79, pid=1, name=x, gone.\n")
    smi = fake_smi(tmp_path, XML_ONLY)
    nv = NvidiaCards(FakeNvml(unavailable=True), str(smi), xids=XidWatch(kmsg, boot=1000.0))
    reading = await nv.read(slow=True)
    assert reading.health is not None
    h0, h1 = reading.health
    assert h0.xids == []
    assert h1.xids is not None and [(x.code, x.count, x.last) for x in h1.xids] == [(79, 1, 1005.0)]
    await nv.close()


async def test_csv_only_falls_back_and_stops_asking_for_xml(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, CSV_ONLY)
    nv = cards(tmp_path, smi)
    first = await nv.read(slow=True)
    assert first.source == "nvidia-smi" and first.warnings == []
    assert first.gpus is not None and len(first.gpus) == 8
    assert first.gpus[0].name == "NVIDIA H100 80GB HBM3" and first.gpus[0].temperature is None
    assert first.health is None  # the CSV has no slow figures
    query = "--query-gpu=" + ",".join(QUERY_FIELDS)
    # -q -x, the plain -q, the full CSV (its answer has no header: refused), the CSV query.
    full = "--query-gpu=" + ",".join(FULL_QUERY_FIELDS) + " --format=csv"
    basic = f"{query} --format=csv,noheader,nounits"
    assert calls(tmp_path) == ["-q -x", "-q", full, basic]
    second = await nv.read()
    assert second.gpus is not None and len(second.gpus) == 8
    assert calls(tmp_path)[4:] == [basic]  # it stops asking for the others
    # A full scan asks -q -x again: the driver may have been upgraded since.
    await nv.read(retry_nvml=True)
    assert calls(tmp_path)[5:] == ["-q -x", "-q", full, basic]
    await nv.close()


async def test_csv_failing_too_keeps_asking_for_xml(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, 'echo "NVIDIA-SMI has failed"; exit 9')
    nv = cards(tmp_path, smi)
    reading = await nv.read()
    assert reading.gpus is None and reading.source is None
    (warning,) = reading.warnings
    assert warning.startswith("nvidia-smi: failed (exit 9): NVIDIA-SMI has failed")
    await nv.read()
    forms = [c.split()[0][:11] for c in calls(tmp_path)]
    assert forms == ["-q", "-q", "--query-gpu", "--query-gpu"] * 2
    await nv.close()


async def test_no_nvidia_smi_is_no_cards(tmp_path: Path) -> None:
    nv = cards(tmp_path, tmp_path / "absent")
    reading = await nv.read(slow=True)
    assert (reading.gpus, reading.source, reading.warnings, reading.health) == ([], None, [], None)
    await nv.close()


async def test_nvml_answering_wins_over_nvidia_smi(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, XML_ONLY)
    nvml = FakeNvml([FakeCard("GPU-n", "NVIDIA L4", figures={"temperature": 50})])
    nv = NvidiaCards(nvml, str(smi), xids=XidWatch(tmp_path / "no-kmsg", boot=0.0))
    reading = await nv.read(slow=True)
    assert reading.source == "nvml"
    assert reading.gpus is not None and [(g.uuid, g.temperature) for g in reading.gpus] == [
        ("GPU-n", 50)
    ]
    assert reading.cuda_version == "12.4"
    assert calls(tmp_path) == []
    await nv.close()


async def test_mig_capture_reports_instances_as_cards(tmp_path: Path) -> None:
    body = (
        f'case "$1" in -q) cat "{A100_MIG_XML}";; -L) printf "%s" "{A100_LIST}";; *) exit 3;; esac'
    )
    smi = fake_smi(tmp_path, body)
    nv = cards(tmp_path, smi)
    reading = await nv.read(slow=True)
    assert reading.source == "nvidia-smi" and reading.warnings == []
    assert reading.gpus is not None
    assert [g.uuid for g in reading.gpus] == MIGS
    for g in reading.gpus:
        assert g.name == "NVIDIA A100-SXM4-80GB"
        assert (g.mig_mode, g.mig_parent, g.mig_profile) == (True, A100, "1g.20gb")
        assert g.mig_class == "a100-80g-mig-1g.20gb"
        assert g.memory_total == 19968 * MiB
        assert (g.driver, g.bus_id) == ("535.54.03", "00000000:01:00.0")
        assert g.index == 1
    assert calls(tmp_path) == ["-q -x", "-L", "nvlink -s"]  # nvlink -s fails: no -e
    # The slow figures stay the card's.
    assert reading.health is not None and [h.uuid for h in reading.health] == [A100]
    await nv.close()


async def test_mig_capture_without_a_list_is_the_card(tmp_path: Path) -> None:
    body = f'case "$1" in -q) cat "{A100_MIG_XML}";; -L) exit 9;; *) exit 3;; esac'
    smi = fake_smi(tmp_path, body)
    nv = cards(tmp_path, smi)
    reading = await nv.read()
    assert reading.gpus is not None
    (card,) = reading.gpus
    assert (card.uuid, card.mig_mode, card.mig_class) == (A100, True, None)
    await nv.close()


async def test_the_plain_text_is_read_where_the_xml_cannot_be(tmp_path: Path) -> None:
    text = FIXTURES / "smitext" / "h100-hgx_2cards_580.105.08.txt"
    smi = fake_smi(
        tmp_path,
        f'case "$*" in "-q -x") echo "XML output is not supported"; exit 2;; '
        f'"-q") cat "{text}";; *) exit 3;; esac',
    )
    nv = cards(tmp_path, smi)
    reading = await nv.read(slow=True)
    assert reading.source == "nvidia-smi" and reading.gpus is not None
    # The same figures as the XML twin of the capture gives.
    from_xml = await cards(tmp_path / "x", fake_smi_dir(tmp_path / "x", XML_ONLY)).read(slow=True)
    assert reading.gpus == from_xml.gpus
    assert calls(tmp_path) == ["-q -x", "-q", "nvlink -s"]
    await nv.close()


def fake_smi_dir(where: Path, body: str) -> Path:
    where.mkdir()
    return fake_smi(where, body)


async def test_the_full_csv_query_is_read_where_neither_xml_nor_text_is(tmp_path: Path) -> None:
    csv = FIXTURES / "smicsv" / "h100-hgx_card0_csv_580.105.08.csv"
    smi = fake_smi(
        tmp_path,
        f'case "$1" in -q) echo "not supported"; exit 2;; --query-gpu=*) cat "{csv}";; '
        "*) exit 3;; esac",
    )
    nv = cards(tmp_path, smi)
    reading = await nv.read()
    assert reading.source == "nvidia-smi" and reading.gpus is not None
    (card,) = reading.gpus
    assert (card.temperature, card.power, card.pcie_width) == (34, 70.12, 16)
    assert reading.health is not None and reading.health[0].ecc_volatile_uncorrected == 1
    assert [c.split()[0][:11] for c in calls(tmp_path)] == ["-q", "-q", "--query-gpu"]
    await nv.close()
