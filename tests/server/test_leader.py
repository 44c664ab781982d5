"""Leader-only work behind one switch: started together, stopped together, flushed last."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.server.leader import Duty, LeaderWork


async def test_lead_starts_every_duty_and_step_down_stops_then_flushes() -> None:
    events: list[str] = []
    running = asyncio.Event()

    def duty(name: str) -> Duty:
        async def loop(stop: asyncio.Event) -> None:
            events.append(f"{name} started")
            running.set()
            await stop.wait()
            events.append(f"{name} stopped")

        async def flush() -> None:
            events.append(f"{name} flushed")

        return Duty(name, loop, flush)

    work = LeaderWork([duty("reconciler"), duty("usage")])
    assert not work.leading
    work.lead()
    work.lead()  # a second call while leading starts nothing twice
    await running.wait()
    await asyncio.sleep(0)
    assert work.leading
    assert sorted(events) == ["reconciler started", "usage started"]
    await work.step_down()
    assert not work.leading
    # Every loop ends before anything is flushed: nothing counted after its last write.
    assert events[2:] == [
        "reconciler stopped",
        "usage stopped",
        "reconciler flushed",
        "usage flushed",
    ]
    await work.step_down()  # not leading: nothing to do
    assert len(events) == 6


async def test_a_failing_duty_or_flush_is_logged_and_the_rest_still_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flushed: list[str] = []

    async def broken(stop: asyncio.Event) -> None:
        raise RuntimeError("boom")

    async def fine(stop: asyncio.Event) -> None:
        await stop.wait()

    async def bad_flush() -> None:
        raise OSError("disk full")

    async def good_flush() -> None:
        flushed.append("fine")

    work = LeaderWork([Duty("broken", broken, bad_flush), Duty("fine", fine, good_flush)])
    work.lead()
    await asyncio.sleep(0)
    await work.step_down()
    assert flushed == ["fine"]
    assert "broken ended with an error" in caplog.text
    assert "disk full" in caplog.text
    # It can lead again after stepping down.
    work.lead()
    assert work.leading
    await work.step_down()
