"""The fleet's bounded history: one point per 10 s slot, gaps and unread figures as null
(never 0), the minutes window, the ring wrapping after an hour, forget, and what a node
with 8 cards costs in memory."""

from __future__ import annotations

import json
import math
import tracemalloc
from typing import Any

import pytest

from llmgw.server.fleet.history import MAX_CARDS, FleetHistory
from llmgw.wire.hardware import GPU

GiB = 2**30
MiB = 2**20
# A slot boundary, so that T0 + k * 10 is the start of slot k.
T0 = 1_700_000_000.0


def gpu(i: int, **over: Any) -> GPU:
    card: dict[str, Any] = {
        "uuid": f"GPU-{i}",
        "index": i,
        "name": "NVIDIA H100 80GB HBM3",
        "utilization": 40 + i,
        "sm_active": 0.25,
        "memory_used": 30 * GiB,
        "memory_total": 80 * GiB,
        "power": 350.5,
        "temperature": 60,
    }
    card.update(over)
    return GPU(**card)


def beat(h: FleetHistory, at: float, node: str = "n1", cards: int = 2, **over: Any) -> None:
    h.record(
        node,
        at,
        over.pop("cpu", 12.5),
        over.pop("memory_total", 512 * GiB),
        over.pop("memory_available", 500 * GiB),
        [gpu(i, **over) for i in range(cards)],
    )


def test_one_point_per_slot_the_latest_wins() -> None:
    h = FleetHistory()
    beat(h, T0 + 1, cpu=10.0, utilization=5)
    beat(h, T0 + 6, cpu=20.0, utilization=7)  # same slot: overwrites
    beat(h, T0 + 12, cpu=30.0, utilization=9)  # the next slot
    s = h.series("n1", minutes=1, now=T0 + 15)
    assert s is not None
    assert s["node"] == "n1" and s["step_seconds"] == 10
    assert len(s["t"]) == 6
    assert s["t"][-2:] == [int(T0), int(T0) + 10]
    assert s["t"] == sorted(s["t"])
    assert s["cpu_percent"] == [None] * 4 + [20.0, 30.0]
    assert s["memory_used"][-1] == 12 * GiB and s["memory_total"][-1] == 512 * GiB
    first, second = s["gpus"]
    assert (first["uuid"], first["index"], first["name"]) == (
        "GPU-0",
        0,
        "NVIDIA H100 80GB HBM3",
    )
    assert second["index"] == 1
    assert first["utilization"][-2:] == [7, 9]
    assert first["sm_active"][-1] == 0.25
    assert first["memory_used"][-1] == 30 * GiB and first["memory_total"][-1] == 80 * GiB
    assert first["power"][-1] == 350.5 and first["temperature"][-1] == 60
    assert all(isinstance(v, int) for v in first["memory_used"][-2:])


def test_a_figure_not_read_later_in_a_slot_keeps_the_earlier_reading() -> None:
    h = FleetHistory()
    beat(h, T0 + 1, power=300.0)
    beat(h, T0 + 6, power=None)
    s = h.series("n1", minutes=1, now=T0 + 9)
    assert s is not None
    assert s["gpus"][0]["power"][-1] == 300.0


def test_silent_slots_stay_null() -> None:
    h = FleetHistory()
    beat(h, T0)
    beat(h, T0 + 40)  # silent for slots 1..3
    s = h.series("n1", minutes=1, now=T0 + 60)  # and 5, 6
    assert s is not None
    assert s["t"][0] == int(T0) + 10
    # slots 1..6
    assert s["cpu_percent"] == [None, None, None, 12.5, None, None]
    card = s["gpus"][0]
    for key in ("utilization", "sm_active", "memory_used", "memory_total", "power"):
        assert card[key] == [None, None, None, card[key][3], None, None]
        assert card[key][3] is not None


def test_figures_not_read_are_null_never_zero() -> None:
    h = FleetHistory()
    h.record(
        "n1",
        T0,
        None,
        None,
        None,
        [
            GPU(index=0, uuid="GPU-x", name="H100"),
            GPU(index=1, uuid="GPU-y", name="H100", utilization=None, power=0.0),
        ],
    )
    h.record("n1", T0 + 10, 5.0, 64 * GiB, None, [])
    s = h.series("n1", minutes=1, now=T0 + 10)
    assert s is not None
    assert s["cpu_percent"][-2:] == [None, 5.0]
    # Total read, available not: used is not known.
    assert s["memory_total"][-2:] == [None, 64 * GiB]
    assert s["memory_used"][-2:] == [None, None]
    x, y = s["gpus"]
    assert x["uuid"] == "GPU-x" and (y["index"], y["name"]) == (1, "H100")
    for key in ("utilization", "sm_active", "memory_used", "memory_total", "power", "temperature"):
        assert x[key][-2:] == [None, None]
    # A reading of 0 is a reading, kept as 0.
    assert y["power"][-2] == 0.0 and y["utilization"][-2] is None


def test_the_minutes_window_is_clamped() -> None:
    h = FleetHistory()
    beat(h, T0)
    now = T0 + 3000
    assert len(h.series("n1", minutes=5, now=now)["t"]) == 30  # type: ignore[index]
    assert len(h.series("n1", minutes=0, now=now)["t"]) == 6  # type: ignore[index]
    assert len(h.series("n1", minutes=600, now=now)["t"]) == 360  # type: ignore[index]
    # Only the last hour is wanted and the point at T0 is within it.
    full = h.series("n1", now=now)
    assert full is not None and full["cpu_percent"][-301] == 12.5
    assert sum(v is not None for v in full["cpu_percent"]) == 1
    # The card last seen 50 minutes ago is left out of a 5 minute window.
    assert h.series("n1", minutes=5, now=now)["gpus"] == []  # type: ignore[index]
    assert len(full["gpus"]) == 2


def test_the_ring_wraps_after_an_hour() -> None:
    h = FleetHistory()
    for k in range(500):  # 83 minutes, every 10 s
        beat(h, T0 + k * 10 + 3, cpu=float(k % 100), utilization=k % 100)
    now = T0 + 499 * 10 + 5
    s = h.series("n1", now=now)
    assert s is not None
    assert len(s["t"]) == 360
    assert s["t"][0] == int(T0) + 140 * 10 and s["t"][-1] == int(T0) + 4990
    assert s["cpu_percent"] == [float(k % 100) for k in range(140, 500)]
    assert s["gpus"][0]["utilization"] == [k % 100 for k in range(140, 500)]
    # After 20 silent minutes, those slots are null and the older ones still there.
    later = h.series("n1", now=now + 1200)
    assert later is not None
    assert later["cpu_percent"][-120:] == [None] * 120
    assert later["cpu_percent"][:240] == [float(k % 100) for k in range(260, 500)]
    # A heartbeat after more than an hour of silence: only it is left.
    beat(h, now + 4000, cpu=1.0)
    last = h.series("n1", now=now + 4000)
    assert last is not None
    assert [v for v in last["cpu_percent"] if v is not None] == [1.0]


def test_a_card_that_goes_keeps_its_points_until_they_age_out() -> None:
    h = FleetHistory()
    beat(h, T0, cards=2)
    beat(h, T0 + 10, cards=1)
    s = h.series("n1", minutes=1, now=T0 + 10)
    assert s is not None
    gone = s["gpus"][1]
    assert gone["uuid"] == "GPU-1" and gone["utilization"][-2:] == [41, None]
    beat(h, T0 + 3700, cards=1)
    s = h.series("n1", now=T0 + 3700)
    assert s is not None and [c["uuid"] for c in s["gpus"]] == ["GPU-0"]


def test_cards_per_node_are_capped() -> None:
    h = FleetHistory()
    beat(h, T0, cards=MAX_CARDS + 10)
    s = h.series("n1", minutes=1, now=T0)
    assert s is not None and len(s["gpus"]) == MAX_CARDS


def test_forget_and_unknown_nodes() -> None:
    h = FleetHistory()
    assert h.series("n1") is None
    beat(h, T0)
    beat(h, T0, node="n2")
    assert "n1" in h and len(h) == 2
    h.forget("n1")
    h.forget("never")
    assert h.series("n1", now=T0) is None
    assert h.series("n2", now=T0) is not None


def test_a_series_is_json_and_nulls_not_nans() -> None:
    h = FleetHistory()
    beat(h, T0, sm_active=None, memory_used=None)
    beat(h, T0 + 30)
    s = h.series("n1", now=T0 + 30)
    assert s is not None
    text = json.dumps(s, allow_nan=False)
    assert json.loads(text) == s
    assert "NaN" not in text


def test_a_custom_step_and_span() -> None:
    h = FleetHistory(step=5.0, span=600.0)
    h.record("n1", T0 + 2.5, 1.0, None, None, [])
    h.record("n1", T0 + 7.5, 2.0, None, None, [])
    s = h.series("n1", minutes=60, now=T0 + 7.5)
    assert s is not None and s["step_seconds"] == 5 and len(s["t"]) == 120
    assert s["cpu_percent"][-2:] == [1.0, 2.0]
    with pytest.raises(ValueError):
        FleetHistory(step=0)


def test_memory_per_node_with_8_cards() -> None:
    nodes = 100
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        h = FleetHistory()
        for i in range(nodes):
            h.record(
                f"node-{i:04d}",
                T0,
                50.0,
                1024 * GiB,
                512 * GiB,
                [gpu(c, uuid=f"GPU-{i:04d}-{c}-1234-5678-9abc") for c in range(8)],
            )
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    used = sum(s.size_diff for s in after.compare_to(before, "filename"))
    per_node = used / nodes
    # 8 x 3,600 + 3,240 bytes of ring; the rest is the objects holding them.
    assert 8 * 3600 + 3240 <= per_node < 38_000, per_node
    # So 5,000 nodes of 8 cards stay under 190 MB.
    assert per_node * 5000 < 190e6
    assert not math.isnan(per_node)
