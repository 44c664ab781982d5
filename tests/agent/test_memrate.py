"""The memory read rate: measured once, kept in the state dir, sent in heartbeats."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.agent import memrate
from llmgw.agent.memrate import CACHE_FILE, MemoryRate, MemoryRateProbe, measure


def test_measure_gives_positive_figures_quickly() -> None:
    rate = measure(buffer_bytes=16 * 1024 * 1024, passes=2, threads=2)
    assert rate.one_core_gbs > 0
    assert rate.all_cores_gbs >= rate.one_core_gbs
    assert rate.threads == 2


def fake_rate() -> MemoryRate:
    return MemoryRate(
        all_cores_gbs=30.0,
        one_core_gbs=10.0,
        threads=4,
        cpu_model=memrate.cpu_model(),
        measured_at=1.0,
    )


async def test_measured_once_then_read_from_the_state_dir(tmp_path: Path) -> None:
    calls: list[int] = []

    def counted() -> MemoryRate:
        calls.append(1)
        return fake_rate()

    first = MemoryRateProbe(tmp_path, measure_fn=counted, threads=4)
    assert first.heartbeat_fields() == {}  # absent until measured, never 0
    await first.run()
    assert first.measured and calls == [1]
    assert first.heartbeat_fields() == {
        "memory_read_gbs": 30.0,
        "memory_read_one_core_gbs": 10.0,
    }
    kept = json.loads((tmp_path / CACHE_FILE).read_text())
    assert kept["cpu_model"] == memrate.cpu_model() and kept["all_cores_gbs"] == 30.0

    second = MemoryRateProbe(tmp_path, measure_fn=counted, threads=4)
    await second.run()
    assert calls == [1] and not second.measured
    assert second.rate == first.rate


async def test_a_different_cpu_measures_again(tmp_path: Path) -> None:
    calls: list[int] = []

    def counted() -> MemoryRate:
        calls.append(1)
        return fake_rate()

    await MemoryRateProbe(tmp_path, measure_fn=counted, threads=4).run()
    data = json.loads((tmp_path / CACHE_FILE).read_text())
    data["cpu_model"] = "Another CPU"
    (tmp_path / CACHE_FILE).write_text(json.dumps(data))
    await MemoryRateProbe(tmp_path, measure_fn=counted, threads=4).run()
    # A new core count is a different machine too (a resized VM).
    await MemoryRateProbe(tmp_path, measure_fn=counted, threads=8).run()
    assert calls == [1, 1, 1]


async def test_a_failed_measurement_leaves_the_figures_absent(tmp_path: Path) -> None:
    def broken() -> MemoryRate:
        raise MemoryError("no room")

    probe = MemoryRateProbe(tmp_path, measure_fn=broken)
    await probe.run()
    assert probe.heartbeat_fields() == {}
    assert not (tmp_path / CACHE_FILE).exists()


async def test_start_runs_in_the_background(tmp_path: Path) -> None:
    probe = MemoryRateProbe(tmp_path, measure_fn=fake_rate, threads=4)
    probe.start()
    await probe.close()  # cancelling before it finished is fine
    probe = MemoryRateProbe(tmp_path, measure_fn=fake_rate, threads=4)
    probe.start()
    assert probe._task is not None
    await probe._task
    assert probe.heartbeat_fields()["memory_read_gbs"] == 30.0


async def test_figures_travel_in_a_heartbeat(tmp_path: Path) -> None:
    from llmgw.wire import FrameDecoder
    from llmgw.wire.messages import Heartbeat, decode_message, encode_message

    probe = MemoryRateProbe(tmp_path, measure_fn=fake_rate, threads=4)
    await probe.run()
    beat = Heartbeat(seq=1, **probe.heartbeat_fields())
    (frame,) = FrameDecoder().feed(encode_message(beat))
    back = decode_message(frame)
    assert isinstance(back, Heartbeat)
    assert back.memory_read_gbs == 30.0 and back.memory_read_one_core_gbs == 10.0
