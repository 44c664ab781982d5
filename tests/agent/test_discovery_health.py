"""Discovery.live and the cards' health: slow figures when due or when an Xid arrives,
health warnings only when they change, this node's engines kept out of the processes."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from llmgw.agent.discovery import Discovery, FakeCard, FakeNvml, Live
from llmgw.agent.discovery.xid import xid_meaning
from llmgw.agent.discovery.xidwatch import boot_time
from llmgw.wire.hardware import GpuProcess
from llmgw.wire.warnings import warning_kind

GiB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
FIGURES: dict[str, Any] = {
    "bus_id": "00000000:3b:00.0",
    "temperature": 55,
    "power": 300.0,
    "throttle": 0x4,  # power capping: no fault
    "pcie_gen": 5,
    "pcie_width": 16,
    "pcie_gen_max": 5,
    "pcie_width_max": 16,
    "ecc_mode": True,
    "ecc_volatile_uncorrected": 0,
    "ecc_aggregate_uncorrected": 0,
    "remapped_rows": (0, 0, False, False),
    "nvlink": [(True, {"replay": 0})] * 18,
}


class Clock:
    def __init__(self) -> None:
        import time

        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def card(uuid: str = "GPU-a", **figures: Any) -> FakeCard:
    return FakeCard(uuid, H100, 80 * GiB, GiB, 12, (9, 0), figures={**FIGURES, **figures})


def kmsg_xid(path: Path, at: float, code: int = 79, pci: str = "0000:3b:00") -> None:
    """Append an Xid record to a /dev/kmsg-format file, stamped ``at`` (wall clock)."""
    micros = int((at - boot_time()) * 1e6)
    with path.open("a") as f:
        f.write(f"4,99,{micros},-;NVRM: Xid (PCI:{pci}): {code}, pid=1, name=x, lost.\n")


async def beat(d: Discovery) -> Live:
    """A heartbeat's figures after the collectors read afresh (a heartbeat itself takes
    what they last read, on their own schedule)."""
    await d.collect()
    return await d.live()


def discovery(tmp_path: Path, nvml: FakeNvml, clock: Clock, **kw: Any) -> Discovery:
    kmsg = tmp_path / "kmsg"
    if not kmsg.exists():
        kmsg.write_text("")
    sysfs = tmp_path / "sys"
    sysfs.mkdir(exist_ok=True)
    return Discovery(
        [tmp_path],
        nvml,
        str(tmp_path / "no-smi"),
        kmsg=kmsg,
        sysfs=sysfs,
        clock=clock,
        **kw,
    )


async def test_slow_figures_when_due_and_warnings_when_changed(tmp_path: Path) -> None:
    nvml = FakeNvml([card()])
    clock = Clock()
    t0 = clock.now
    d = discovery(tmp_path, nvml, clock, slow_interval=60.0)  # a minute, to see them not due

    first = await beat(d)
    assert first.gpus is not None and first.gpus[0].temperature == 55
    assert first.gpu_health is not None
    (health,) = first.gpu_health
    assert (health.uuid, health.ecc_mode, health.ecc_volatile_uncorrected) == ("GPU-a", True, 0)
    assert (health.nvlink_links, health.nvlink_active, health.xids) == (18, 18, [])
    assert first.health_warnings == []  # sent, empty: nothing wrong
    assert first.vitals is None  # an empty sysfs

    clock.now = t0 + 5
    second = await beat(d)
    assert second.gpus is not None and second.gpus[0].temperature == 55
    assert (second.gpu_health, second.health_warnings) == (None, None)

    # A figure that makes a warning: the warnings are sent, the slow figures are not due.
    nvml.set(0, throttle=0x40, temperature=92)
    clock.now = t0 + 10
    third = await beat(d)
    assert third.gpu_health is None
    assert third.health_warnings is not None
    (said,) = third.health_warnings
    assert said.startswith(f"throttle: card 0 ({H100}) is held down by heat (hardware ")

    clock.now = t0 + 15
    fourth = await beat(d)
    assert (fourth.gpu_health, fourth.health_warnings) == (None, None)

    # Due again at the minute: the slow figures come with what changed since.
    nvml.set(0, ecc_volatile_uncorrected=2, nvlink=[(True, {"replay": 3})] * 17 + [(False, {})])
    clock.now = t0 + 61
    fifth = await beat(d)
    assert fifth.gpu_health is not None
    (health,) = fifth.gpu_health
    assert (health.ecc_volatile_uncorrected, health.nvlink_active, health.nvlink_errors) == (
        2,
        17,
        {"replay": 51},
    )
    assert fifth.health_warnings is not None
    assert [warning_kind(w) for w in fifth.health_warnings] == ["throttle", "ecc", "nvlink"]

    # The fault clears: the now empty list is sent once.
    nvml.set(0, throttle=0, ecc_volatile_uncorrected=0, nvlink=[(True, {})] * 18)
    clock.now = t0 + 66
    sixth = await beat(d)
    assert sixth.gpu_health is None
    # The slow figures are not due: the ECC and NVLink warnings stand until they are.
    assert sixth.health_warnings is not None
    assert [warning_kind(w) for w in sixth.health_warnings] == ["ecc", "nvlink"]
    clock.now = t0 + 122
    seventh = await beat(d)
    assert seventh.gpu_health is not None and seventh.health_warnings == []
    clock.now = t0 + 127
    eighth = await beat(d)
    assert (eighth.gpu_health, eighth.health_warnings) == (None, None)
    await d.close()


async def test_an_xid_sends_the_slow_figures_at_once(tmp_path: Path) -> None:
    nvml = FakeNvml([card(), card("GPU-b", bus_id="00000000:19:00.0")])
    clock = Clock()
    t0 = clock.now
    d = discovery(tmp_path, nvml, clock)
    first = await beat(d)
    assert first.gpu_health is not None and [h.xids for h in first.gpu_health] == [[], []]

    kmsg_xid(tmp_path / "kmsg", t0 + 3, code=79, pci="0000:19:00")
    clock.now = t0 + 5
    second = await beat(d)
    assert second.gpu_health is not None
    a, b = second.gpu_health
    assert (a.uuid, a.xids) == ("GPU-a", [])
    assert b.uuid == "GPU-b" and b.xids is not None
    (seen,) = b.xids
    assert (seen.code, seen.count, seen.meaning) == (79, 1, xid_meaning(79)[0])
    assert seen.last == pytest.approx(t0 + 3, abs=0.01)
    assert second.health_warnings is not None
    (said,) = second.health_warnings
    assert said.startswith(f"xid: card 1 ({H100}) reported Xid 79 (once, 0 min ago): ")

    clock.now = t0 + 10
    third = await beat(d)
    assert (third.gpu_health, third.health_warnings) == (None, None)

    # The same code again: the count moves, so the figures are sent again.
    kmsg_xid(tmp_path / "kmsg", t0 + 12, code=79, pci="0000:19:00")
    clock.now = t0 + 15
    fourth = await beat(d)
    assert fourth.gpu_health is not None
    assert fourth.gpu_health[1].xids is not None
    assert [(x.code, x.count) for x in fourth.gpu_health[1].xids] == [(79, 2)]
    assert fourth.health_warnings is not None
    assert "(2 times, last 0 min ago)" in fourth.health_warnings[0]

    # An hour on, the Xid is old news: the warning goes, the count stays.
    clock.now = t0 + 12 + 3601
    late = await beat(d)
    assert late.gpu_health is not None
    assert late.gpu_health[1].xids is not None and late.gpu_health[1].xids[0].count == 2
    assert late.health_warnings == []
    await d.close()


async def test_nvml_xids_when_the_log_cannot_be_read(tmp_path: Path) -> None:
    nvml = FakeNvml([card()])
    clock = Clock()
    t0 = clock.now
    d = Discovery(
        [tmp_path],
        nvml,
        str(tmp_path / "no-smi"),
        kmsg=tmp_path / "no-kmsg",
        sysfs=tmp_path / "sys",
        clock=clock,
    )
    await beat(d)
    nvml.xid(0, 48)
    clock.now = t0 + 5
    live = await beat(d)
    assert live.gpu_health is not None
    (health,) = live.gpu_health
    assert health.xids is not None and [(x.code, x.count) for x in health.xids] == [(48, 1)]
    assert live.health_warnings is not None
    assert [warning_kind(w) for w in live.health_warnings] == ["xid"]
    await d.close()


async def test_engine_processes_are_left_out(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert os.getpgid(other.pid) != os.getpgid(0)
        procs = [(os.getpid(), 2 * GiB), (other.pid, 3 * GiB)]
        nvml = FakeNvml([card(processes=procs), card("GPU-b", bus_id="00000000:19:00.0")])
        clock = Clock()
        d = discovery(tmp_path, nvml, clock)

        live = await beat(d)
        assert live.gpus is not None
        assert live.gpus[0].processes == [
            GpuProcess(pid=os.getpid(), memory=2 * GiB),
            GpuProcess(pid=other.pid, memory=3 * GiB),
        ]
        assert live.gpus[1].processes is None  # not read stays not read

        d.engine_groups = lambda: {os.getpgid(0)}
        clock.now += 5
        live = await beat(d)
        assert live.gpus is not None
        assert live.gpus[0].processes == [GpuProcess(pid=other.pid, memory=3 * GiB)]
        assert live.gpus[1].processes is None

        # Only ours: an empty list, which says "read, and none".
        nvml.set(0, processes=[(os.getpid(), GiB)])
        clock.now += 5
        live = await beat(d)
        assert live.gpus is not None and live.gpus[0].processes == []
        await d.close()
    finally:
        other.kill()
        other.wait()


# -- dcgm-exporter --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def dcgm_url() -> AsyncIterator[str]:
    page = (
        'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a"} 0.5\n'
        'DCGM_FI_PROF_SM_OCCUPANCY{gpu="0",UUID="GPU-a"} 0.25\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-a"} 0.75\n'
        'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-a"} 0.125\n'
        'DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-b"} 0.9\n'
    )

    async def metrics(request: web.Request) -> web.StreamResponse:
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/metrics"
    await runner.cleanup()


async def test_dcgm_counters_fill_in_where_gpm_gave_none(tmp_path: Path, dcgm_url: str) -> None:
    gpm = {"sm_active": 0.1, "sm_occupancy": 0.2, "tensor_active": 0.3, "dram_active": 0.4}
    nvml = FakeNvml([card(), card("GPU-b", bus_id="00000000:19:00.0", gpm=gpm), card("GPU-c")])
    d = discovery(tmp_path, nvml, Clock(), dcgm_exporter=dcgm_url)
    live = await beat(d)
    await d.close()
    assert live.gpus is not None
    a, b, c = live.gpus
    assert (a.sm_active, a.sm_occupancy, a.tensor_active, a.dram_active) == (0.5, 0.25, 0.75, 0.125)
    assert (b.sm_active, b.sm_occupancy, b.tensor_active, b.dram_active) == (0.1, 0.2, 0.3, 0.4)
    assert (c.sm_active, c.tensor_active) == (None, None)


async def test_a_new_stream_gets_the_slow_figures_and_warnings_again(tmp_path: Path) -> None:
    """facts() starts a stream (Register): its first heartbeat repeats what the control
    plane's fresh copy lacks, though nothing changed, and NVML is not read twice."""
    nvml = FakeNvml([card(throttle=0x40)])
    clock = Clock()
    d = discovery(tmp_path, nvml, clock)
    await d.facts("n1")
    asked = nvml.figure_calls
    first = await d.live()
    # The first heartbeat read nothing: it sends what facts() read, slow figures and all.
    assert nvml.figure_calls == asked
    assert first.gpu_health is not None and first.health_warnings
    clock.now += 5
    quiet = await beat(d)
    assert quiet.gpu_health is None and quiet.health_warnings is None
    await d.facts("n1")  # reconnected
    again = await d.live()
    assert again.gpu_health == first.gpu_health
    assert again.health_warnings == first.health_warnings
    await d.close()
