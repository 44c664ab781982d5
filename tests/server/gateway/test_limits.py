"""Keys, their limits and their usage on a clock the test turns: expiry at its second,
windows and budgets, and the month's rollover, without waiting."""

from __future__ import annotations

import calendar
from pathlib import Path

from aiohttp import web

from llmgw.server.gateway.limits import Key, KeyBook, Usage, key_hash
from llmgw.server.store import ApiKeyRecord, SQLiteStore

KEY = "sk-llmgw-clock"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


def book(clock: Clock, store: SQLiteStore, **limits: int | float | None) -> tuple[KeyBook, Key]:
    usage = Usage(store, clock)
    keys = KeyBook(usage, clock)
    keys.changed(ApiKeyRecord("k1", "tester", key_hash(KEY), **limits))  # type: ignore[arg-type]
    found = keys.authorise(f"Bearer {KEY}")
    assert isinstance(found, Key)
    return keys, found


async def test_a_key_expires_at_its_second(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    clock = Clock(at(2027, 1, 30, 23, 59, 59))
    keys, _ = book(clock, store, expires_at=at(2027, 1, 31))
    assert isinstance(keys.authorise(f"Bearer {KEY}"), Key)
    clock.now = at(2027, 1, 31)
    refused = keys.authorise(f"Bearer {KEY}")
    assert isinstance(refused, web.Response) and refused.status == 401
    assert b"expired_api_key" in (refused.body or b"")
    await store.close()


async def test_requests_a_minute_leave_the_window_on_the_clock(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    clock = Clock(at(2027, 3, 1, 12))
    keys, key = book(clock, store, rpm=2)
    keys.admitted(key)
    clock.now += 30
    keys.admitted(key)
    over = keys.over_limit(key)
    assert over is not None and over.status == 429 and over.headers["Retry-After"] == "30"
    clock.now += 30  # the first leaves the window
    assert keys.over_limit(key) is None
    await store.close()


async def test_a_budget_starts_afresh_with_the_month(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    clock = Clock(at(2026, 12, 31, 23, 59))
    keys, key = book(clock, store, budget=100)
    await keys.usage.load_month()
    keys.usage.add(key, "m", "m.default.1", 60, 50)
    over = keys.over_limit(key)
    assert over is not None and over.headers["Retry-After"] == "60"  # to January
    await keys.usage.tick()  # written, still December
    assert keys.over_limit(key) is not None
    clock.now = at(2027, 1, 1, 0, 0, 1)
    await keys.usage.tick()  # a new month: every budget afresh
    assert keys.usage.month_of == "2027-01" and keys.over_limit(key) is None
    rows = await store.usage("2026-12-01")
    assert [(r["day"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        ("2026-12-31", 60, 50)
    ]
    await store.close()


async def test_usage_that_could_not_be_written_is_kept_for_the_next_write(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    clock = Clock(at(2027, 2, 2))
    keys, key = book(clock, store)
    keys.usage.add(key, "m", "r", 3, 4)
    await store.close()  # a store that fails every write
    try:
        await keys.usage.flush()
    except Exception:
        pass
    else:
        raise AssertionError("a write to a closed store went through")
    keys.usage.add(key, "m", "r", 1, 1)
    assert keys.usage.pending == {("k1", "m", "r"): [2, 4, 5]}
    await store.open()
    await keys.usage.flush()
    rows = await store.usage("2027-02-01")
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        (2, 4, 5)
    ]
    await store.close()
