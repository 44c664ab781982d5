"""Slow collectors apart from the heartbeat: a card read that hangs, prints garbage,
exits 9, or answers a field as "[N/A]" or "is not a valid field" never holds a
heartbeat's figures; one read is in flight at a time; a failed read leaves its figures
absent (not the last good ones) with a warning naming the tool, since when and its fix,
and both clear when the tool answers again.

``nvidia-smi`` is a stand-in script that prints a real capture (NVML is absent here, as
on a node whose NVML is broken) and whose behaviour a file switches.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import cast

import pytest

from llmgw.agent.discovery import Discovery, FakeCard, FakeNvml, Live
from llmgw.agent.discovery.collector import Collector, ReadFailed
from llmgw.agent.discovery.ibwatch import PortWatch
from llmgw.wire.codec import from_map, to_map
from llmgw.wire.messages import Heartbeat

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURE = FIXTURES / "smi" / "h100-hgx_8cards_580.105.08_verbatim.xml"
CARD = "NVIDIA H100 80GB HBM3"
# A heartbeat's own work (memory, load, hwmon) is quick; this much leaves room for a
# loaded test machine and is still half a card read's deadline (a beat that waited for a
# hung read would take all of it).
BEAT_BUDGET = 1.0
# Room for a read of the 200 KB capture on a loaded machine: one that answers must not
# be taken for one that hangs.
DEADLINE = 2.0
INTERVAL = 0.2


def stand_in(tmp_path: Path) -> Path:
    """An ``nvidia-smi`` whose behaviour ``mode`` (a file beside it) picks: ``ok``
    prints the capture for ``-q -x``; ``hang`` sleeps a minute; ``garbage`` prints
    what is no format of nvidia-smi's; ``exit9`` fails as a lost card does; ``na``
    prints the capture with every card's temperature "N/A"; ``old`` is a build that
    refuses compute_cap ("is not a valid field") and answers only the CSV query. Each
    run appends its pid to ``pids`` first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mode").write_text("ok\n")
    old_rows = "\\n".join(
        f"{i}, GPU-0000000{i}-0000-0000-0000-00000000000{i}, {CARD}, 81559, {i}, 5, 580.105.08"
        for i in range(2)
    )
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo $$ >> "{bin_dir}/pids"\n'
        f'mode=$(cat "{bin_dir}/mode")\n'
        'case "$mode" in\n'
        "  hang) exec sleep 60 ;;\n"
        "  garbage) echo 'GPU 0: <<<%%% not a report'; exit 0 ;;\n"
        "  exit9) echo 'Unable to determine the device handle for GPU0000:18:00.0: "
        "Unknown Error'; exit 9 ;;\n"
        "  old)\n"
        '    case "$*" in\n'
        "      *compute_cap*) echo 'Field \"compute_cap\" is not a valid field to query.';"
        " exit 2 ;;\n"
        f"      --query-gpu=*) printf '{old_rows}\\n'; exit 0 ;;\n"
        "      *) echo 'Invalid combination of input arguments.'; exit 2 ;;\n"
        "    esac ;;\n"
        "esac\n"
        'case "$*" in\n'
        '  "-q -x")\n'
        '    if [ "$mode" = na ]; then\n'
        f"      sed 's|<gpu_temp>[^<]*</gpu_temp>|<gpu_temp>N/A</gpu_temp>|' \"{CAPTURE}\"\n"
        f'    else cat "{CAPTURE}"; fi ;;\n'
        '  *) echo "unexpected arguments: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def set_mode(smi: Path, mode: str) -> None:
    (smi.parent / "mode").write_text(mode + "\n")


def alive(smi: Path) -> list[int]:
    """The stand-in's runs still alive (not reaped: a zombie counts as alive)."""
    pids_file = smi.parent / "pids"
    pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        out.append(pid)
    return out


def runs(smi: Path) -> int:
    pids_file = smi.parent / "pids"
    return len(pids_file.read_text().split()) if pids_file.exists() else 0


def discovery(tmp_path: Path, smi: Path) -> Discovery:
    sysfs = tmp_path / "sys" / "class"
    sysfs.mkdir(parents=True)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    return Discovery(
        [tmp_path],
        FakeNvml(unavailable=True),
        str(smi),
        card_deadline=DEADLINE,
        collect_interval=INTERVAL,
        kmsg=kmsg,
        sysfs=sysfs,
    )


async def timed_beat(d: Discovery) -> tuple[Live, float]:
    began = time.monotonic()
    live = await d.live()
    return live, time.monotonic() - began


async def beats_until(d: Discovery, check: object, timeout: float, what: str) -> list[Live]:
    """Heartbeats every INTERVAL until ``check(live)`` holds, each timed: none may take
    longer than BEAT_BUDGET. Returns them all, the last one the one that held."""
    assert callable(check)
    seen: list[Live] = []
    deadline = time.monotonic() + timeout
    while True:
        live, took = await timed_beat(d)
        assert took < BEAT_BUDGET, f"a heartbeat waited {took:.2f} s for its figures"
        seen.append(live)
        if check(live):
            return seen
        assert time.monotonic() < deadline, f"no heartbeat showed {what} in {timeout} s"
        await asyncio.sleep(INTERVAL)


def temperatures(live: Live) -> list[int | None] | None:
    return None if live.gpus is None else [g.temperature for g in live.gpus]


SINCE = re.compile(r"\(since \d\d:\d\d:\d\d UTC\)\. Fix: ")


DRIVER = "Fix: run `nvidia-smi` by hand"


@pytest.mark.parametrize(
    ("mode", "said", "fix"),
    [
        ("hang", f"nvidia-smi: no answer in {DEADLINE:g} s", DRIVER),
        ("garbage", "nvidia-smi: unreadable output", "Fix: check that "),
        ("exit9", "nvidia-smi: failed (exit 9): Unable to determine the device handle", DRIVER),
    ],
)
async def test_a_failing_nvidia_smi_leaves_the_figures_absent_and_warns(
    tmp_path: Path, mode: str, said: str, fix: str
) -> None:
    smi = stand_in(tmp_path)
    d = discovery(tmp_path, smi)
    try:
        facts = await d.facts("gpu-node")
        assert len(facts.gpus) == 8 and facts.warnings == []
        (first,) = await beats_until(d, lambda live: True, 5, "the cards")
        assert temperatures(first) == [29, 30, 29, 32, 32, 29, 31, 29]
        assert first.unread is None and first.ages is not None and first.ages["gpus"] < 5

        set_mode(smi, mode)
        began = time.monotonic()
        failed = await beats_until(d, lambda live: live.gpus is None, 10, "the cards absent")
        assert time.monotonic() - began < INTERVAL + DEADLINE + 2
        last = failed[-1]
        assert last.unread == ["gpus", "gpu_health"]
        # Not the last good figures: none at all, and the control plane is told so.
        assert last.gpus is None and last.gpu_health is None
        warned = [w for w in last.warnings if w.startswith("nvidia-smi:")]
        assert len(warned) == 1 and warned[0].startswith(said), warned
        assert SINCE.search(warned[0]) and fix in warned[0]
        # The warning rides on the heartbeat, as one of the node's warnings.
        assert last.health_warnings is not None and warned[0] in last.health_warnings
        # While it keeps failing, the same warning is not sent again with every beat.
        again = await beats_until(d, lambda live: True, 5, "another beat")
        assert again[-1].gpus is None and again[-1].health_warnings is None
        if mode == "hang":
            # One run at a time: the hung one was killed and reaped before another began.
            await beats_until(d, lambda live: runs(smi) >= 4, 20, "a few more runs")
            assert len(alive(smi)) <= 1

        set_mode(smi, "ok")
        back = await beats_until(d, lambda live: live.gpus is not None, 10, "the cards back")
        recovered = back[-1]
        assert temperatures(recovered) == [29, 30, 29, 32, 32, 29, 31, 29]
        assert recovered.unread is None
        assert not any(w.startswith("nvidia-smi:") for w in recovered.warnings)
        assert recovered.health_warnings is not None
        assert not any(w.startswith("nvidia-smi:") for w in recovered.health_warnings)
    finally:
        await d.close()
    assert alive(smi) == []  # closing the agent's discovery leaves no nvidia-smi behind


async def test_news_goes_out_when_nvidia_smi_stops_and_starts_answering(tmp_path: Path) -> None:
    """The heartbeat waits on ``news`` as well as its interval: a tool that stops
    answering (or answers again) is told at once, not with the next beat. A tool that
    keeps failing, or keeps answering, is no news."""
    smi = stand_in(tmp_path)
    d = discovery(tmp_path, smi)
    try:
        await d.facts("gpu-node")
        await beats_until(d, lambda live: live.gpus is not None, 5, "the cards")
        quiet = asyncio.ensure_future(d.news())
        await beats_until(d, lambda live: runs(smi) >= 4, 10, "a few good reads")
        assert not quiet.done()  # answering as before: nothing to tell

        set_mode(smi, "exit9")
        async with asyncio.timeout(5):
            await quiet
        live = await d.live()
        assert live.gpus is None and live.unread == ["gpus", "gpu_health"]
        failing = asyncio.ensure_future(d.news())
        tried = runs(smi)
        await beats_until(d, lambda live: runs(smi) >= tried + 3, 10, "more failed reads")
        assert not failing.done()  # still failing: told once

        set_mode(smi, "ok")
        async with asyncio.timeout(5):
            await failing
        assert (await d.live()).gpus is not None
    finally:
        await d.close()


async def test_a_hung_nvidia_smi_is_not_started_again_while_it_lives(tmp_path: Path) -> None:
    """A run that even SIGKILL does not end at once (a process stuck in the driver) is
    waited for: no second run starts while it lives, however many beats go by."""
    release = asyncio.Event()
    started: list[float] = []

    async def stuck() -> int:
        started.append(time.monotonic())
        while True:
            try:
                await release.wait()
                return 1
            except asyncio.CancelledError:
                continue  # ignores its kill, as a process in uninterruptible sleep does

    clock_start = time.time()
    c: Collector[int] = Collector(
        "nvidia-smi", stuck, interval=0.05, deadline=0.2, fix="reboot the node"
    )
    c.start()
    try:
        await asyncio.sleep(0)
        async with asyncio.timeout(5):
            while c.warning is None:
                await asyncio.sleep(0.02)
        assert c.latest is None and c.failing
        assert c.warning.startswith("nvidia-smi: no answer in 0.2 s (since ")
        assert c.warning.endswith("). Fix: reboot the node")
        # Since when: the wall clock of the first failure (its deadline, 0.2 s in).
        near = {time.strftime("%H:%M:%S", time.gmtime(clock_start + s)) for s in range(3)}
        assert c.warning.split("(since ")[1][:8] in near
        # Many intervals later, still the one run.
        ended = c.ended
        async with asyncio.timeout(5):
            while time.monotonic() - started[0] < 1.0:
                await asyncio.sleep(0.05)
        assert len(started) == 1 and c.in_flight and c.ended == ended
        release.set()
        async with asyncio.timeout(5):
            while c.latest is None:
                await asyncio.sleep(0.02)
        assert c.latest.value == 1 and c.warning is None and not c.failing
        assert len(started) >= 2  # the schedule went on once the stuck run ended
    finally:
        release.set()
        await c.close()


async def test_a_read_that_raises_fails_with_its_own_words(tmp_path: Path) -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ReadFailed("printed no cards", "reload the driver")
        return f"read {calls}"

    c: Collector[str] = Collector("tool", flaky, interval=10, deadline=1, fix="x")
    try:
        got = await c.next(2)
        assert got is not None and got.value == "read 1" and c.warning is None
        assert await c.next(2) is None
        assert c.warning is not None and c.warning.startswith("tool: printed no cards (since ")
        assert c.warning.endswith("Fix: reload the driver")
        got = await c.next(2)
        assert got is not None and got.value == "read 3" and c.warning is None
    finally:
        await c.close()


async def test_a_field_read_as_na_is_absent_and_the_rest_live(tmp_path: Path) -> None:
    smi = stand_in(tmp_path)
    set_mode(smi, "na")
    d = discovery(tmp_path, smi)
    try:
        await d.facts("gpu-node")
        (live,) = await beats_until(d, lambda live: True, 5, "the cards")
        assert live.gpus is not None and len(live.gpus) == 8
        assert temperatures(live) == [None] * 8  # "N/A": absent, never 0
        assert all(g.memory_total and g.power_limit for g in live.gpus)
        assert live.unread is None and live.warnings == []
    finally:
        await d.close()


async def test_a_build_that_refuses_a_field_is_asked_without_it(tmp_path: Path) -> None:
    smi = stand_in(tmp_path)
    set_mode(smi, "old")
    d = discovery(tmp_path, smi)
    try:
        facts = await d.facts("gpu-node")
        assert [g.uuid for g in facts.gpus] == [
            "GPU-00000000-0000-0000-0000-000000000000",
            "GPU-00000001-0000-0000-0000-000000000001",
        ]
        count = [0]

        def third(live: Live) -> bool:
            count[0] += 1
            return count[0] >= 3

        seen = await beats_until(d, third, 10, "three beats")
        for live in seen:
            assert live.gpus is not None and [g.memory_used for g in live.gpus] == [0, 1 << 20]
            assert live.gpus[0].compute_capability is None  # the field it refused
            assert live.unread is None and live.warnings == []
    finally:
        await d.close()


def test_ages_and_unread_cross_the_wire_and_an_old_heartbeat_has_neither() -> None:
    beat = Heartbeat(seq=1, ages={"gpus": 2.5}, unread=["gpus", "gpu_health"])
    back = from_map(Heartbeat, to_map(beat))
    assert (back.ages, back.unread) == ({"gpus": 2.5}, ["gpus", "gpu_health"])
    old = from_map(Heartbeat, {"seq": 2, "memory_available": 1})  # an older agent's
    assert (old.ages, old.unread) == (None, None)


class HungPorts:
    """InfiniBand ports whose read (ibstat) never answers."""

    def __init__(self) -> None:
        self.reads = 0

    async def read(self) -> list[object]:
        self.reads += 1
        await asyncio.Event().wait()
        return []


async def test_after_register_no_heartbeat_waits_for_a_first_read(tmp_path: Path) -> None:
    """Register's facts() sets every collector going; the first heartbeat after it
    takes what there is, even while a tool's very first read still hangs."""
    smi = stand_in(tmp_path)
    sysfs = tmp_path / "sys" / "class"
    sysfs.mkdir(parents=True)
    ports = HungPorts()
    d = Discovery(
        [tmp_path],
        FakeNvml(unavailable=True),
        str(smi),
        card_deadline=DEADLINE,
        collect_interval=INTERVAL,
        sysfs=sysfs,
        ports=cast(PortWatch, ports),
    )
    try:
        await d.facts("gpu-node")
        async with asyncio.timeout(5):
            while ports.reads == 0:  # its first read under way, and hanging
                await asyncio.sleep(0.01)
        live, took = await timed_beat(d)
        assert took < BEAT_BUDGET and ports.reads == 1
        assert live.gpus is not None and live.ib_ports is None
        failed = await beats_until(d, lambda live: live.unread is not None, 5, "ibstat")
        assert failed[-1].unread == ["ib_ports"] and failed[-1].gpus is not None
        (said,) = [w for w in failed[-1].warnings if w.startswith("ibstat:")]
        assert said.startswith(f"ibstat: no answer in {DEADLINE:g} s (since ")
    finally:
        await d.close()


async def test_nvml_stuck_in_the_driver_is_one_thread_not_one_per_read(tmp_path: Path) -> None:
    """NVML answers in a worker thread, which no deadline can stop: a call stuck in the
    driver is waited on again by the next read, never joined by another; the figures
    are absent and the warning names NVML until it answers."""
    gate = threading.Event()
    hung = threading.Event()
    calls: list[float] = []
    nvml = FakeNvml([FakeCard("GPU-a", CARD, 80 << 30, 1 << 30, 12, (9, 0))])
    counted = nvml.device_count

    def device_count() -> int:
        if hung.is_set():  # Register's read answered; from then on the driver hangs
            calls.append(time.monotonic())
            gate.wait(30)
        return counted()

    nvml.device_count = device_count  # type: ignore[method-assign]
    sysfs = tmp_path / "sys" / "class"
    sysfs.mkdir(parents=True)
    d = Discovery(
        [tmp_path],
        nvml,
        str(tmp_path / "no-smi"),
        card_deadline=0.3,
        collect_interval=0.1,
        sysfs=sysfs,
    )
    try:
        facts = await d.facts("gpu-node")
        assert facts.gpu_source == "nvml" and len(facts.gpus) == 1
        hung.set()
        failed = await beats_until(d, lambda live: live.gpus is None, 5, "the cards absent")
        (said,) = [w for w in failed[-1].warnings if w.startswith("NVML:")]
        assert said.startswith("NVML: no answer in 0.3 s (since ")
        assert failed[-1].unread == ["gpus", "gpu_health"]
        # Many deadlines later, still the one stuck call.
        await beats_until(d, lambda live: time.monotonic() - calls[0] > 1.5, 5, "1.5 s more")
        assert len(calls) == 1
        gate.set()
        back = await beats_until(d, lambda live: live.gpus is not None, 5, "the cards back")
        assert back[-1].gpus is not None and back[-1].gpus[0].utilization == 12
        assert not any(w.startswith("NVML:") for w in back[-1].warnings)
    finally:
        gate.set()
        await d.close()
