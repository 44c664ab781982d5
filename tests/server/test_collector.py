"""The cycle collector on the control plane's schedule: the interpreter's own turned off
while it runs, cyclic garbage still collected (young at once, frozen at the hourly
walk), and everything as it was once it stops."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from llmgw.server.collector import Collector


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


@pytest.fixture
def collector() -> Iterator[Collector]:
    was = gc.isenabled()
    c = Collector(young=0.01, settle=0.05, hour=0.2)
    try:
        yield c
    finally:
        gc.unfreeze()
        if was:
            gc.enable()


def test_start_hands_the_schedule_over_and_stop_gives_it_back(collector: Collector) -> None:
    assert gc.isenabled()
    collector.start()
    assert not gc.isenabled()
    assert gc.get_freeze_count() > 0
    collector.stop()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_young_cycles_go_at_the_next_young_walk(collector: Collector) -> None:
    collector.start()
    held, ref = cycle()
    del held
    assert ref() is not None  # a cycle: reference counting alone keeps it
    collector.collect_young()
    assert ref() is None
    assert collector.walks.young.count == 1


def test_a_frozen_cycle_waits_for_the_whole_walk(collector: Collector) -> None:
    collector.start()
    held, ref = cycle()
    collector.collect_settled()  # alive: frozen now
    del held
    collector.collect_young()
    collector.collect_settled()
    assert ref() is not None
    collector.collect_whole()
    assert ref() is None
    assert (collector.walks.settled.count, collector.walks.whole.count) == (2, 1)


def test_the_schedule_runs_each_walk_and_ends_with_the_stop(collector: Collector) -> None:
    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(collector.run(stop))
        while collector.walks.whole.count == 0:
            await asyncio.sleep(0.01)
        assert not gc.isenabled()
        stop.set()
        await task

    asyncio.run(go())
    walks = collector.walks
    assert walks.young.count > walks.settled.count >= 1
    assert walks.whole.count >= 1
    assert walks.whole.longest > 0
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_intervals_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="young <= settle <= hour"):
        Collector(young=10, settle=1)


def test_half_as_many_objects_again_settle_before_their_time() -> None:
    """Thousands of agents connecting at once multiply the control plane's objects: each
    time half as many again live as at the last settled walk, they are walked and frozen
    then, not all in the minute's one walk. Growth under that (a scrape's snapshots, a
    fifth) waits for the minute, and the share is counted from the lowest since."""
    alive = [1000]
    was = gc.isenabled()
    c = Collector(young=0.01, settle=3600, hour=7200, settle_growth=0.5, alive=lambda: alive[0])

    async def ticks(n: int) -> None:
        young = c.walks.young.count
        while c.walks.young.count < young + n:
            await asyncio.sleep(0.01)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(c.run(stop))
        try:
            await ticks(1)  # started: 1,000 alive
            alive[0] = 1400  # under half again: young walks only
            await ticks(5)
            assert c.walks.settled.count == 0
            alive[0] = 1500
            await ticks(2)
            assert c.walks.settled.count == 1  # and counted from 1,500 on
            alive[0] = 2000
            await ticks(5)
            assert c.walks.settled.count == 1
            alive[0] = 1000  # a thousand gone: counted from here
            await ticks(2)
            alive[0] = 1500
            await ticks(2)
        finally:
            stop.set()
            await task

    try:
        asyncio.run(asyncio.wait_for(go(), 30))
    finally:
        gc.unfreeze()
        if was:
            gc.enable()
    assert c.walks.settled.count == 2 and c.walks.whole.count == 0
