"""Discovery as a whole: facts for Register, live figures for heartbeats."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llmgw.agent.discovery import Discovery, FakeCard, FakeNvml, is_gpu_warning
from llmgw.agent.discovery import node as node_module
from llmgw.wire.framing import FrameDecoder
from llmgw.wire.hardware import Disk, HostFacts
from llmgw.wire.messages import Register, decode_message, encode_message

GiB = 1 << 30
CARD = FakeCard("GPU-a", "NVIDIA H100 80GB HBM3", 80 * GiB, GiB, 12, (9, 0))


async def test_facts_from_this_machine_and_a_fake_card(tmp_path: Path) -> None:
    nvml = FakeNvml([CARD], driver="550.54.15")
    discovery = Discovery([tmp_path, tmp_path / "missing"], nvml, str(tmp_path / "no-smi"))
    await asyncio.sleep(0.06)  # let the CPU meter have a window
    started = time.monotonic()
    facts = await discovery.facts("node-1")
    took = time.monotonic() - started
    await discovery.close()

    assert took < 1.0
    assert facts.hostname == "node-1"
    assert facts.os and facts.arch
    assert facts.memory_total and facts.memory_available
    assert facts.cpu_count and facts.cpu_count >= 1
    assert facts.cpu_percent is not None and 0.0 <= facts.cpu_percent <= 100.0
    assert facts.disks is not None and len(facts.disks) == 1  # the missing dir is skipped
    assert facts.gpu_source == "nvml"
    assert [(g.uuid, g.compute_capability) for g in facts.gpus] == [("GPU-a", "9.0")]
    assert not [w for w in facts.warnings if is_gpu_warning(w)]
    assert not nvml.started  # close() shut NVML down


async def test_facts_travel_in_a_register_frame(tmp_path: Path) -> None:
    discovery = Discovery([tmp_path], FakeNvml(unavailable=True), str(tmp_path / "no-smi"))
    facts = await discovery.facts("node-2")
    await discovery.close()
    assert (facts.gpus, facts.gpu_source) == ([], None)
    frame = encode_message(Register(node_id="node-2", version="0.1.0", host=facts))
    decoder = FrameDecoder()
    (payload,) = decoder.feed(frame)
    back = decode_message(payload)
    assert isinstance(back, Register) and isinstance(back.host, HostFacts)
    assert back.host == facts


async def test_live_figures(tmp_path: Path) -> None:
    discovery = Discovery([tmp_path], FakeNvml([CARD]), str(tmp_path / "no-smi"))
    await discovery.live()
    await asyncio.sleep(0.06)
    live = await discovery.live()
    await discovery.close()
    assert live.memory_available and live.memory_available > 0
    assert live.cpu_percent is not None
    assert live.load is not None and len(live.load) == 3
    assert live.disks is not None and len(live.disks) == 1
    assert live.gpus is not None and live.gpus[0].utilization == 12
    assert live.warnings == []


async def test_a_hung_disk_scan_does_not_hold_the_heartbeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    calls: list[list[str]] = []

    def hung_scan(directories: list[str]) -> list[Disk]:
        calls.append(directories)
        release.wait(5)
        return [Disk(path="/srv", fstype="nfs4", total=10 * GiB, free=GiB, shared=True)]

    monkeypatch.setattr(node_module, "scan_disks", hung_scan)
    discovery = Discovery([tmp_path], FakeNvml(), str(tmp_path / "no-smi"), disk_timeout=0.05)
    try:
        first = await discovery.live()
        await discovery.collect()  # the disks' collector tries again
        second = await discovery.live()
        assert first.disks is None and second.disks is None
        assert first.warnings[0].startswith("disk: no answer in 0.05 s")
        assert first.unread == ["disks"]
        assert len(calls) == 1  # the hung scan is waited on again, not started twice
        release.set()
        await discovery.collect()
        third = await discovery.live()
        assert third.disks is not None and third.disks[0].path == "/srv"
        assert third.warnings == [] and third.unread is None
        # Whether that read still found the hung scan running (and took its answer) or
        # started a new one depends on when its thread's end reached the loop; from
        # here each read scans afresh.
        scanned = len(calls)
        assert scanned in (1, 2)
        await discovery.collect()
        fourth = await discovery.live()
        assert fourth.disks is not None
        assert len(calls) == scanned + 1  # a finished scan is not reused
    finally:
        release.set()
        await discovery.close()


def test_discovery_and_doctor_do_not_import_the_ui_or_the_server_stack() -> None:
    code = (
        "import sys, llmgw.agent.discovery, llmgw.agent.doctor\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('textual', 'starlette', 'hypercorn', 'pynvml'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
