"""The gateway's queue: alone over a fake pool of slots (priority, round robin across
keys, deadline, depth, waiters that leave, a turn kept when the room was taken), then in
the gateway in one process, in front of a fake engine whose answers the test holds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.config import GatewayConfig
from llmgw.server.gateway import key_hash
from llmgw.server.gateway.metrics import Metrics
from llmgw.server.gateway.queue import FairQueue
from llmgw.server.refusal import Refusal
from llmgw.server.store import ApiKeyRecord
from tests.server.gateway.test_proxy import CHAT, KEY, Harness, harness


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Wait for a condition the test is about to build on (never a fixed sleep)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.002)
    assert condition(), what


class Pool:
    """A model's replicas as the queue sees them: ``slots`` requests at once."""

    def __init__(self, slots: int = 1, busy: int = 0) -> None:
        self.slots = slots
        self.busy = busy
        self.bounded = True

    def room(self, model: str) -> int | None:
        return self.slots - self.busy if self.bounded else None

    def pick(self) -> str | None:
        if not self.bounded:
            return None
        if self.busy >= self.slots:
            return None
        self.busy += 1
        return "replica"


class Scene:
    """A queue over a pool, and the order in which its requests got their replica."""

    def __init__(self, pool: Pool, queue: FairQueue) -> None:
        self.pool = pool
        self.queue = queue
        self.served: list[str] = []
        self.tasks: dict[str, asyncio.Task[str | None]] = {}

    def enter(self, name: str, key: str, priority: int = 0) -> None:
        async def go() -> str | None:
            got = await self.queue.admit("m", key, priority, self.pool.pick)
            self.served.append(name)
            return got

        self.tasks[name] = asyncio.create_task(go())

    async def arrive(self, name: str, key: str, priority: int = 0) -> None:
        """A request enters, and is seen waiting before the next arrives."""
        depth = self.queue.depth("m")
        self.enter(name, key, priority)
        await until(lambda: self.queue.depth("m") == depth + 1, f"{name} waits")

    async def finish_one(self) -> None:
        """One request in flight ends; the next in line gets its replica."""
        served = len(self.served)
        self.pool.busy -= 1
        self.queue.released("m")
        await until(lambda: len(self.served) == served + 1, "the next is served")


def scene(slots: int = 1, busy: int = 1, **options: Any) -> Scene:
    pool = Pool(slots, busy)
    options.setdefault("wait", 30.0)
    options.setdefault("depth", 100)
    return Scene(pool, FairQueue(pool.room, **options))


async def test_higher_priority_goes_first_whatever_came_before() -> None:
    s = scene()
    await s.arrive("low-a", "a")
    await s.arrive("low-b", "b")
    await s.arrive("high", "c", priority=5)
    await s.arrive("higher-late", "a", priority=9)
    for _ in range(4):
        await s.finish_one()
    assert s.served == ["higher-late", "high", "low-a", "low-b"]


async def test_keys_of_one_priority_take_turns() -> None:
    s = scene()
    for i in range(5):
        await s.arrive(f"a{i}", "noisy")
    await s.arrive("b0", "quiet")
    await s.arrive("c0", "other")
    await s.arrive("c1", "other")
    for _ in range(8):
        await s.finish_one()
    # Each key one turn in turn; each key's own requests in the order they came.
    assert s.served == ["a0", "b0", "c0", "a1", "c1", "a2", "a3", "a4"]


async def test_a_request_goes_at_once_with_room_and_no_one_waiting() -> None:
    s = scene(slots=2, busy=1)
    assert await s.queue.admit("m", "a", 0, s.pool.pick) == "replica"
    assert s.pool.busy == 2 and s.queue.depth("m") == 0


async def test_a_newcomer_does_not_overtake_those_waiting() -> None:
    s = scene()
    await s.arrive("first", "a")
    # Room appears with no request ending (a new replica); a newcomer finds someone
    # waiting, so it waits too, and the one who came first is served first.
    s.pool.slots = 2
    s.enter("late", "b")
    await until(lambda: s.served == ["first"], "the first is served")
    assert s.queue.depth("m") == 1  # the newcomer waits for the next slot
    await s.finish_one()
    assert s.served == ["first", "late"]


async def test_past_its_deadline_a_waiter_is_refused_with_a_retry_after() -> None:
    now = [1000.0]
    waits: list[float] = []
    s = scene(
        wait=30.0,
        clock=lambda: now[0],
        recheck=0.005,
        waited=lambda model, seconds: waits.append(seconds),
    )
    await s.arrive("late", "a")
    now[0] += 31
    with pytest.raises(Refusal) as refused:
        await s.tasks["late"]
    assert refused.value.status == 429 and refused.value.code == "queue_timeout"
    assert "gateway.queue_wait" in refused.value.message
    assert 1 <= refused.value.details["retry_after"] <= 30
    assert s.queue.depth("m") == 0 and waits == [31.0]
    # Its place is gone: the slot, when free, goes to no one.
    s.pool.busy -= 1
    s.queue.released("m")
    assert s.pool.busy == 0


async def test_past_its_depth_a_request_is_refused_at_once() -> None:
    s = scene(depth=2)
    await s.arrive("w1", "a")
    await s.arrive("w2", "b")
    with pytest.raises(Refusal) as refused:
        await s.queue.admit("m", "c", 9, s.pool.pick)  # priority does not jump a full line
    assert refused.value.status == 429 and refused.value.code == "queue_full"
    assert "gateway.queue_depth" in refused.value.message
    assert refused.value.details["retry_after"] >= 1
    assert s.queue.depth("m") == 2


async def test_a_waiter_that_goes_away_leaves_the_line() -> None:
    s = scene()
    await s.arrive("gone", "a")
    await s.arrive("stays", "b")
    s.tasks["gone"].cancel()
    with pytest.raises(asyncio.CancelledError):
        await s.tasks["gone"]
    assert s.queue.depth("m") == 1
    await s.finish_one()
    assert s.served == ["stays"]


async def test_a_waiter_woken_and_gone_passes_its_turn_on() -> None:
    s = scene()
    await s.arrive("woken", "a")
    await s.arrive("next", "b")
    s.pool.busy -= 1
    s.queue.released("m")  # wakes "woken", which goes away before it can pick
    s.tasks["woken"].cancel()
    with pytest.raises(asyncio.CancelledError):
        await s.tasks["woken"]
    assert await s.tasks["next"] == "replica"
    assert s.served == ["next"] and s.pool.busy == 1


async def test_a_waiter_whose_room_was_taken_keeps_its_turn() -> None:
    s = scene()
    await s.arrive("first", "a")
    await s.arrive("second", "b")
    s.pool.busy -= 1
    s.queue.released("m")  # wakes "first"...
    s.pool.busy += 1  # ...but a retry elsewhere takes the slot before it picks
    await until(lambda: s.queue.depth("m") == 2, "first is back in line")
    assert s.served == []
    await s.finish_one()
    await s.finish_one()
    assert s.served == ["first", "second"]


async def test_waiters_of_a_model_that_lost_its_replicas_go_on_without_one() -> None:
    s = scene(recheck=0.005)
    await s.arrive("w", "a")
    s.pool.bounded = False  # no usable replica any more: the gateway's 503 is theirs
    assert await s.tasks["w"] is None
    # And nothing unbounded (a provider's keys) ever waits.
    assert await s.queue.admit("m", "a", 0, lambda: "provider") == "provider"
    assert s.queue.depth("m") == 0


async def test_a_backlog_lasts_while_waiters_follow_one_another_past_queue_wait() -> None:
    """Lending by policy asks how long a model's requests have queued: waiters are
    refused at ``queue_wait`` (30 s), yet a line that never empties is one backlog."""
    now = [1000.0]
    s = scene(wait=30.0, clock=lambda: now[0], recheck=0.005)
    assert s.queue.backlogs() == {}
    await s.arrive("w1", "a")
    now[0] += 20
    await s.arrive("w2", "b")
    assert s.queue.backlogs() == {"m": 20.0}
    now[0] += 11  # w1 is refused at 31 s; w2 still waits
    with pytest.raises(Refusal):
        await s.tasks["w1"]
    assert s.queue.depth("m") == 1
    assert s.queue.backlogs() == {"m": 31.0}
    await s.arrive("w3", "a")
    now[0] += 29
    assert s.queue.backlogs() == {"m": 60.0}
    await s.finish_one()  # w2 served; w3 waits on
    assert s.queue.backlogs() == {"m": 60.0}
    await s.finish_one()  # w3 served: the line is empty, the backlog ended
    assert s.served == ["w2", "w3"]
    assert s.queue.backlogs() == {}
    await s.arrive("w4", "b")
    now[0] += 5
    assert s.queue.backlogs() == {"m": 5.0}
    s.tasks["w4"].cancel()  # gone: nothing waits
    with pytest.raises(asyncio.CancelledError):
        await s.tasks["w4"]
    assert s.queue.backlogs() == {}


async def test_a_woken_waiter_put_back_keeps_its_backlog() -> None:
    now = [50.0]
    s = scene(clock=lambda: now[0])
    await s.arrive("first", "a")
    now[0] += 10
    s.pool.busy -= 1
    s.queue.released("m")  # wakes "first": the line is empty while it picks...
    s.pool.busy += 1  # ...and a retry elsewhere took the slot
    await until(lambda: s.queue.depth("m") == 1, "first is back in line")
    assert s.queue.backlogs() == {"m": 10.0}


def test_the_queue_is_on_metrics() -> None:
    m = Metrics()
    m.queued("m", 0.3)
    text = m.render({}, {}, queue_depth={"m": 4, "idle": 0})
    assert "# TYPE llmgw_gateway_queue_depth gauge" in text
    assert 'llmgw_gateway_queue_depth{model="m"} 4' in text
    assert 'llmgw_gateway_queue_depth{model="idle"} 0' in text
    assert "# TYPE llmgw_gateway_queue_seconds histogram" in text
    assert 'llmgw_gateway_queue_seconds_bucket{model="m",le="0.25"} 0' in text
    assert 'llmgw_gateway_queue_seconds_bucket{model="m",le="0.5"} 1' in text
    assert 'llmgw_gateway_queue_seconds_count{model="m"} 1' in text


# ------------------------------------------------------------------ in the gateway

OTHER = "sk-llmgw-other"


@contextlib.asynccontextmanager
async def one_slot(tmp_path: Path, **config: Any) -> AsyncIterator[Harness]:
    """One replica of a model with one slot; a second key, OTHER."""
    async with harness(tmp_path, replicas=1, config=GatewayConfig(**config)) as h:
        h.gateway.keys.changed(ApiKeyRecord("k2", "other", key_hash(OTHER)))
        h.gateway.queue.recheck = 60  # every turn here comes from a request ending
        try:
            yield h
        finally:  # a test that failed half way leaves no answer held
            for _ in range(64):
                h.engines[0].hold.release()


async def send(h: Harness, key: str, tag: str) -> tuple[int, Any, str | None]:
    body = {**CHAT, "x_mode": "held", "x_tag": tag}
    async with h.http.post(
        h.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as resp:
        return resp.status, await resp.json(), resp.headers.get("Retry-After")


async def run_in_order(h: Harness, arrivals: list[tuple[str, str]]) -> list[str]:
    """Each (key, tag) sent once the one before it is seen (at the engine, the first;
    in the queue, the rest); then every answer let go one at a time. The tags in the
    order the engine got them."""
    engine, queue = h.engines[0], h.gateway.queue
    tasks = []
    for i, (key, tag) in enumerate(arrivals):
        tasks.append(asyncio.create_task(send(h, key, tag)))
        if i == 0:
            await until(lambda: len(engine.requests) == 1, "the first is at the engine")
        else:
            await until(lambda n=i: queue.depth("m") == n, f"{tag} waits")
    for n in range(1, len(arrivals)):
        engine.hold.release()
        await until(lambda n=n: len(engine.requests) == n + 1, "the next reaches the engine")
    engine.hold.release()
    answers = await asyncio.gather(*tasks)
    assert [status for status, _, _ in answers] == [200] * len(arrivals)
    return [r["x_tag"] for r in engine.requests]


async def test_a_noisy_key_cannot_starve_another(tmp_path: Path) -> None:
    async with one_slot(tmp_path) as h:
        noisy = [(KEY, f"a{i}") for i in range(12)]
        order = await run_in_order(h, [*noisy, (OTHER, "b")])
        # a0 was at the engine when b came; of the 11 of A waiting, one went before b.
        assert order[:3] == ["a0", "a1", "b"]
        assert order[3:] == [f"a{i}" for i in range(2, 12)]
        assert h.gateway.queue.depth("m") == 0
        assert h.gateway.metrics.queue_seconds["m"].n == 12


async def test_a_higher_priority_key_goes_before_those_who_came_first(tmp_path: Path) -> None:
    async with one_slot(tmp_path) as h:
        h.gateway.keys.changed(ApiKeyRecord("k2", "other", key_hash(OTHER), priority=5))
        order = await run_in_order(
            h, [(KEY, "a0"), (KEY, "a1"), (KEY, "a2"), (OTHER, "p1"), (OTHER, "p2")]
        )
        assert order == ["a0", "p1", "p2", "a1", "a2"]


async def test_a_waiter_past_queue_wait_gets_a_429_and_one_gone_leaves(tmp_path: Path) -> None:
    async with one_slot(tmp_path, queue_wait=0.2) as h:
        engine, queue = h.engines[0], h.gateway.queue
        busy = asyncio.create_task(send(h, KEY, "busy"))
        await until(lambda: len(engine.requests) == 1, "the slot is taken")
        status, body, retry = await send(h, OTHER, "late")
        assert status == 429 and body["error"]["code"] == "queue_timeout"
        assert body["error"]["type"] == "rate_limit_error"
        assert "gateway.queue_wait" in body["error"]["message"]
        assert retry is not None and int(retry) >= 1
        # A client that goes away while waiting leaves the queue.
        gone = asyncio.create_task(send(h, OTHER, "gone"))
        await until(lambda: queue.depth("m") == 1, "it waits")
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await gone
        await until(lambda: queue.depth("m") == 0, "it left")
        engine.hold.release()
        assert (await busy)[0] == 200
        assert [r["x_tag"] for r in engine.requests] == ["busy"]


async def test_a_full_queue_is_a_429_at_once(tmp_path: Path) -> None:
    async with one_slot(tmp_path, queue_depth=0) as h:
        engine = h.engines[0]
        busy = asyncio.create_task(send(h, KEY, "busy"))
        await until(lambda: len(engine.requests) == 1, "the slot is taken")
        status, body, retry = await send(h, OTHER, "more")
        assert status == 429 and body["error"]["code"] == "queue_full"
        assert "gateway.queue_depth" in body["error"]["message"] and retry is not None
        engine.hold.release()
        assert (await busy)[0] == 200
