"""Multi-node NVLink fabric per card (``-q -x``, ``-q`` and NVML) and IMEX per node."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pynvml
import pytest

from llmgw.agent.discovery import Discovery
from llmgw.agent.discovery.cardread import fabric_health, from_smi_xml, read_nvml_health
from llmgw.agent.discovery.imex import Imex, read_imex
from llmgw.agent.discovery.nvml import FIGURES, PynvmlSource, fabric_uuid
from llmgw.agent.discovery.nvmlfake import FakeCard, FakeNvml
from llmgw.agent.discovery.smitext import parse_smi_text
from llmgw.agent.discovery.smixml import parse_smi_xml
from llmgw.wire.framing import FrameDecoder
from llmgw.wire.hardware import GpuHealth, NodeVitals
from llmgw.wire.messages import Heartbeat, decode_message, encode_message

FIXTURES = Path(__file__).parent / "fixtures"
ZERO = "00000000-0000-0000-0000-000000000000"
FABRIC_FIELDS = (
    "fabric_state",
    "fabric_status",
    "fabric_cluster_uuid",
    "fabric_clique_id",
    "fabric_health",
)


def fabric(h: GpuHealth) -> tuple[Any, ...]:
    return tuple(getattr(h, name) for name in FABRIC_FIELDS)


def xml_health(path: Path) -> list[GpuHealth]:
    return from_smi_xml(parse_smi_xml(path.read_text()))[1]


# -- nvidia-smi -q -x and -q: the captures, as kept in the repository ------------------


def test_gb200_capture_is_joined_with_its_clique_cluster_and_health() -> None:
    (h,) = xml_health(FIXTURES / "smi" / "gb200-fabric_580.173.02.xml")
    assert fabric(h) == (
        "Completed",
        "Success",
        "00000001-0000-0000-0000-000000000001",
        2,
        {
            "summary": "Healthy",
            "bandwidth": "Full",
            "route_recovery_in_progress": "False",
            "route_unhealthy": "False",
            "access_timeout_recovery": "False",
        },  # incorrect_configuration and partition_assigned are N/A: left out
    )


@pytest.mark.parametrize(
    "name", ["a5000-workstation_590.44.01.xml", "rtx4090-consumer_535.86.05.xml"]
)
def test_a_card_outside_any_fabric_has_every_fabric_figure_absent(name: str) -> None:
    for h in xml_health(FIXTURES / "smi" / name):
        assert fabric(h) == (None,) * 5  # N/A, never 0 or ""


def test_hgx_h100_is_its_own_fabric_with_a_zero_cluster() -> None:
    for h in xml_health(FIXTURES / "smi" / "h100-hgx_2cards_580.105.08.xml"):
        assert fabric(h) == ("Completed", "Success", ZERO, 0, None)


def test_plain_text_fabric_blocks() -> None:
    mig = parse_smi_text((FIXTURES / "smitext" / "h100-mig_590.48.01.txt").read_text())
    (card,) = mig.cards
    assert (card.fabric_state, card.fabric_status, card.fabric_clique_id) == (
        "Completed",
        "Success",
        0,
    )
    assert (card.fabric_cluster_uuid, card.fabric_health) == (ZERO, None)
    old = parse_smi_text((FIXTURES / "smitext" / "h100-sxm_2cards_535.183.01.txt").read_text())
    for card in old.cards:  # 535 writes state and status only
        assert (card.fabric_state, card.fabric_status) == ("Completed", "Success")
        assert (card.fabric_clique_id, card.fabric_cluster_uuid) == (None, None)


# -- our fixtures ---------------------------------------------------------------------


def test_a_card_in_progress_and_a_degraded_one() -> None:
    waiting, degraded = xml_health(
        FIXTURES / "nvlinkfabric" / "gb200-2cards-unjoined-degraded_580.173.02.xml"
    )
    assert fabric(waiting) == ("In Progress", None, None, None, None)
    assert fabric(degraded) == (
        "Completed",
        "Success",
        "9f3a61c2-7d04-4b8e-a1f5-0c6e2d9b4a17",
        32766,
        {
            "summary": "Limited Capacity",
            "bandwidth": "Degraded",
            "route_recovery_in_progress": "False",
            "route_unhealthy": "True",
            "access_timeout_recovery": "False",
        },
    )


def test_plain_text_gb200_reads_like_the_xml() -> None:
    log = parse_smi_text(
        (FIXTURES / "nvlinkfabric" / "gb200-2cards-joined_580.173.02.txt").read_text()
    )
    _, health = from_smi_xml(log)
    assert [h.index for h in health] == [0, 1]
    for h in health:
        assert fabric(h) == (
            "Completed",
            "Success",
            "4b7d0e91-26a3-4c5f-9e18-b2f07a6c3d58",
            2,
            {
                "summary": "Healthy",
                "bandwidth": "Full",
                "route_recovery_in_progress": "False",
                "route_unhealthy": "False",
                "access_timeout_recovery": "False",
            },
        )


def test_xml_cluster_is_lower_cased_and_a_none_health_word_is_kept() -> None:
    text = (
        "<nvidia_smi_log><gpu id='00000000:29:00.0'><uuid>GPU-x</uuid><fabric>"
        "<state>Completed</state><status>Success</status><cliqueId>7</cliqueId>"
        "<clusterUuid>AB000000-0000-0000-0000-0000000000CD</clusterUuid>"
        "<health><incorrect_configuration>None</incorrect_configuration>"
        "<summary>[N/A]</summary></health></fabric></gpu></nvidia_smi_log>"
    )
    (card,) = parse_smi_xml(text).cards
    assert card.fabric_cluster_uuid == "ab000000-0000-0000-0000-0000000000cd"
    assert card.fabric_health == {"incorrect_configuration": "None"}


# -- NVML -----------------------------------------------------------------------------

JOINED = {
    "state": 3,
    "status": "Success",
    "cluster_uuid": "00000001-0000-0000-0000-000000000001",
    "clique_id": 2,
    # bandwidth Full (2), route recovery False (2 << 2), route unhealthy True (1 << 4),
    # access timeout not supported (0), incorrect configuration None (1 << 8)
    "health_mask": 2 | 2 << 2 | 1 << 4 | 1 << 8,
    "health_summary": 3,
}


def nvml_health(figure: Any) -> GpuHealth:
    figures = {} if figure is None else {"fabric": figure}
    nvml = FakeNvml([FakeCard("GPU-f", "NVIDIA GB200", figures=figures)])
    nvml.init()
    (h,) = read_nvml_health(nvml, 1)
    return h


def test_nvml_fabric_through_the_fake() -> None:
    assert "fabric" in FIGURES
    assert fabric(nvml_health(JOINED)) == (
        "Completed",
        "Success",
        "00000001-0000-0000-0000-000000000001",
        2,
        {
            "summary": "Limited Capacity",
            "bandwidth": "Full",
            "route_recovery_in_progress": "False",
            "route_unhealthy": "True",
            "incorrect_configuration": "None",
        },
    )


def test_nvml_fabric_not_completed_has_no_ids_and_none_is_absent() -> None:
    waiting = {**JOINED, "state": 2, "status": "Not Ready", "health_mask": 0}
    waiting.pop("health_summary")
    assert fabric(nvml_health(waiting)) == ("In Progress", None, None, None, None)
    assert fabric(nvml_health({**JOINED, "state": 0})) == (None,) * 5  # not supported
    assert fabric(nvml_health(None)) == (None,) * 5  # the call failed


def test_fabric_health_decodes_each_field_apart() -> None:
    assert fabric_health(None, None) is None
    assert fabric_health(0, 0) is None
    assert fabric_health(1 | 6 << 8 | 2 << 12 | 2 << 14, 1) == {
        "summary": "Healthy",
        "bandwidth": "Degraded",
        "incorrect_configuration": "Incompatible GPU Firmware",
        "partition_assigned": "False",
        "gfm_state": "Disconnected",
    }


def _started(monkeypatch: pytest.MonkeyPatch) -> PynvmlSource:
    for name, fn in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetHandleByIndex": lambda i: ("handle", i),
        "nvmlErrorString": lambda code: "Insufficient Resources",
    }.items():
        monkeypatch.setattr(pynvml, name, fn)
    source = PynvmlSource()
    source.init()
    return source


def _fill(info: Any, status: int = 0) -> None:
    info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    info.status = status
    info.cliqueId = 32766
    for n, byte in enumerate(bytes.fromhex("9f3a61c27d044b8ea1f50c6e2d9b4a17")):
        info.clusterUuid[n] = byte


def test_pynvml_fabric_v3_falls_back_to_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[str] = []

    def versioned(handle: Any, ref: Any) -> int:
        info = ref._obj
        tried.append(type(info).__name__)
        if isinstance(info, pynvml.c_nvmlGpuFabricInfo_v3_t):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        _fill(info)
        info.healthMask = 2
        return 0

    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", versioned)
    source = _started(monkeypatch)
    found = source.figure(0, "fabric")
    assert tried == ["c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"]
    assert found == {
        "state": 3,
        "status": "Success",
        "cluster_uuid": "9f3a61c2-7d04-4b8e-a1f5-0c6e2d9b4a17",
        "clique_id": 32766,
        "health_mask": 2,
    }


def test_pynvml_fabric_without_the_versioned_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def legacy(handle: Any, ref: Any) -> int:
        _fill(ref._obj, status=pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return 0

    monkeypatch.delattr(pynvml, "nvmlDeviceGetGpuFabricInfoV")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfo", legacy)
    found = _started(monkeypatch).figure(0, "fabric")
    assert found["status"] == "Insufficient Resources"  # nvmlErrorString's words
    assert "health_mask" not in found and found["clique_id"] == 32766


def test_fabric_uuid_is_written_as_nvidia_smi_does() -> None:
    raw = bytes.fromhex("00000001000000000000000000000001")
    assert fabric_uuid(raw) == "00000001-0000-0000-0000-000000000001"
    assert fabric_uuid(bytes(pynvml.c_nvmlGpuFabricInfo_t().clusterUuid)) == ZERO


# -- IMEX -----------------------------------------------------------------------------


def process(root: Path, pid: int, comm: str, state: str = "S") -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "stat").write_text(f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560\n")


def channels(root: Path, *names: str) -> None:
    d = root / "dev" / "nvidia-caps-imex-channels"
    d.mkdir(parents=True)
    for name in names:
        (d / name).write_text("")


def test_imex_running_with_its_channels(tmp_path: Path) -> None:
    process(tmp_path, 1, "systemd")
    process(tmp_path, 4211, "nvidia-imex")
    channels(tmp_path, "channel0", "channel1", "README")
    (tmp_path / "proc" / "self").mkdir()
    assert read_imex(tmp_path) == Imex(running=True, channels=2)


def test_imex_set_up_but_stopped(tmp_path: Path) -> None:
    process(tmp_path, 4211, "nvidia-imex", state="Z")  # a zombie does not serve
    process(tmp_path, 4300, "nvidia-imex-ctl")  # the control tool is not the daemon
    (tmp_path / "etc" / "nvidia-imex").mkdir(parents=True)
    assert read_imex(tmp_path) == Imex(running=False, channels=0)
    channels(tmp_path, "channel0")
    assert read_imex(tmp_path) == Imex(running=False, channels=1)


def test_no_imex_on_the_node_is_absent(tmp_path: Path) -> None:
    assert read_imex(tmp_path) is None  # no /proc to read
    process(tmp_path, 1, "systemd")
    assert read_imex(tmp_path) is None  # nothing of IMEX: not a node that uses it


def test_unreadable_channels_are_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    process(tmp_path, 4211, "nvidia-imex")
    channels(tmp_path, "channel0")
    listdir = os.listdir

    def refusing(path: Any) -> list[str]:
        if str(path).endswith("nvidia-caps-imex-channels"):
            raise PermissionError(13, "Permission denied")
        return listdir(path)

    monkeypatch.setattr(os, "listdir", refusing)
    assert read_imex(tmp_path) == Imex(running=True, channels=None)


async def test_discovery_sends_imex_with_the_vitals(tmp_path: Path) -> None:
    process(tmp_path, 4211, "nvidia-imex")
    channels(tmp_path, "channel0")
    sysfs = tmp_path / "sys" / "class"
    sysfs.mkdir(parents=True)
    discovery = Discovery(
        [tmp_path], FakeNvml(unavailable=True), str(tmp_path / "no-smi"), sysfs=sysfs
    )
    try:
        live = await discovery.live()
        assert live.vitals == NodeVitals(imex_running=True, imex_channels=1)
        (tmp_path / "proc" / "4211" / "comm").write_text("bash\n")
        again = await discovery.live()  # read each slow interval, not each beat
        assert again.vitals == live.vitals
    finally:
        await discovery.close()


def test_fabric_and_imex_travel_in_a_heartbeat() -> None:
    beat = Heartbeat(
        seq=3,
        gpu_health=[
            GpuHealth(
                uuid="GPU-f",
                index=0,
                fabric_state="Completed",
                fabric_status="Success",
                fabric_cluster_uuid="00000001-0000-0000-0000-000000000001",
                fabric_clique_id=2,
                fabric_health={"summary": "Healthy"},
            ),
            GpuHealth(uuid="GPU-p", index=1),
        ],
        vitals=NodeVitals(imex_running=False, imex_channels=0),
    )
    (payload,) = FrameDecoder().feed(encode_message(beat))
    assert "fabric_state" not in payload["gpu_health"][1]  # absent, not null
    assert decode_message(payload) == beat
