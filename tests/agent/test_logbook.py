"""The in-memory log tails: bounded rings with listeners, the agent's log handler, the
last lines of a file, and an engine's log file followed as it grows (each test waits for
the lines it expects to reach the ring, never a fixed time)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from llmgw.agent.logbook import LogRing, RingHandler, follow_file, last_lines_of


def test_the_ring_keeps_the_last_lines_and_tells_its_listeners() -> None:
    ring = LogRing(3)
    heard: list[str] = []
    stop = ring.listen(heard.append)
    for n in range(5):
        ring.add(f"line {n}")
    assert list(ring.lines) == ["line 2", "line 3", "line 4"]
    assert ring.tail(2) == ["line 3", "line 4"]
    assert ring.tail(10) == ["line 2", "line 3", "line 4"]
    assert ring.tail(0) == [] and ring.tail(-1) == []
    assert heard == [f"line {n}" for n in range(5)]
    stop()
    ring.add("unheard")
    assert heard[-1] == "line 4"


def test_a_listener_may_stop_listening_while_it_is_told() -> None:
    ring = LogRing(10)
    heard: list[str] = []

    def once(line: str) -> None:
        heard.append(line)
        stop()

    stop = ring.listen(once)
    ring.add("a")
    ring.add("b")
    assert heard == ["a"]


def test_the_agents_log_records_reach_the_ring() -> None:
    ring = LogRing(10)
    logger = logging.getLogger("tests.logbook")
    handler = RingHandler(ring)
    logger.addHandler(handler)
    try:
        logger.warning("disk %s is full", "/var")
    finally:
        logger.removeHandler(handler)
    assert ring.lines[-1].endswith("WARNING tests.logbook: disk /var is full")


def test_last_lines_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "engine.log"
    assert last_lines_of(path, 5) == []  # not there (yet)
    path.write_text("".join(f"line {n}\n" for n in range(100)))
    assert last_lines_of(path, 2) == ["line 98", "line 99"]
    # Reading only the end: the first line there, likely cut in half, is left out.
    tail = last_lines_of(path, 100, max_bytes=30)
    assert tail == ["line 97", "line 98", "line 99"]
    assert all(line.startswith("line ") for line in tail)


class Following:
    """A file followed into a ring, and a way to wait for what reaches it."""

    def __init__(self, path: Path, ring: LogRing) -> None:
        self.path = path
        self.ring = ring
        self.grew = asyncio.Event()
        ring.listen(lambda line: self.grew.set())

    def write(self, data: str) -> None:
        with self.path.open("a") as fh:
            fh.write(data)

    async def until(self, check: Callable[[list[str]], bool]) -> None:
        async with asyncio.timeout(10):
            while not check(list(self.ring.lines)):
                self.grew.clear()
                await self.grew.wait()


@pytest.fixture
async def followed(tmp_path: Path) -> AsyncIterator[tuple[Following, asyncio.Event]]:
    path = tmp_path / "engine.log"
    path.write_text("from before 1\nfrom before 2\n")
    ring = LogRing(50)
    follow = Following(path, ring)
    stop = asyncio.Event()
    task = asyncio.create_task(follow_file(path, ring, stop, poll=0.01))
    try:
        yield follow, stop
    finally:
        stop.set()
        await task


async def test_following_starts_with_the_files_tail_and_adds_whole_lines(
    followed: tuple[Following, asyncio.Event],
) -> None:
    follow, _ = followed
    await follow.until(lambda lines: lines == ["from before 1", "from before 2"])
    follow.write("new one\nhalf")
    await follow.until(lambda lines: lines[-1] == "new one")
    follow.write(" and the rest\r\n")  # a CRLF engine's line ends as well
    await follow.until(lambda lines: lines[-1] == "half and the rest")
    assert "half" not in follow.ring.lines


async def test_following_starts_over_on_a_file_truncated_or_replaced(
    followed: tuple[Following, asyncio.Event],
) -> None:
    follow, _ = followed
    await follow.until(lambda lines: len(lines) == 2)
    follow.path.write_text("x\n")  # shorter than what was read: a new file
    await follow.until(lambda lines: lines[-1] == "x")


async def test_a_last_line_without_its_newline_is_kept_when_following_stops(
    tmp_path: Path,
) -> None:
    path = tmp_path / "engine.log"
    path.write_text("started\n")
    ring = LogRing(10)
    follow = Following(path, ring)
    stop = asyncio.Event()
    task = asyncio.create_task(follow_file(path, ring, stop, poll=0.01))
    await follow.until(lambda lines: lines == ["started"])  # past its first read
    follow.write("complete\nthe last words")
    await follow.until(lambda lines: lines == ["started", "complete"])
    stop.set()
    await task
    assert list(ring.lines) == ["started", "complete", "the last words"]
