"""``GET /api/v1/usage``: ``days`` back as before, or any range of days with ``since``
and ``until`` (both included); a bad date, or a range backwards, is a 400 naming the
field. Called on the real admin app, in process, over the SQLite store."""

from __future__ import annotations

import time

import httpx
import pytest

from llmgw.server.app import ControlPlane


@pytest.fixture
async def api(plane: tuple[ControlPlane, httpx.AsyncClient]) -> httpx.AsyncClient:
    cp, client = plane
    today = time.strftime("%Y-%m-%d", time.gmtime())
    await cp.store.add_usage(
        [
            ("2025-03-01", "k1", "llama", "r1", 1, 10, 20),
            ("2025-03-02", "k1", "llama", "r1", 2, 5, 6),
            ("2025-03-03", "k2", "qwen", "r9", 3, 1, 1),
            (today, "k1", "llama", "r1", 4, 7, 7),
        ]
    )
    return client


async def days_of(api: httpx.AsyncClient, query: str) -> list[str]:
    answer = await api.get(f"/api/v1/usage?{query}")
    assert answer.status_code == 200, answer.text
    return [r["day"] for r in answer.json()]


async def test_since_and_until_pick_any_range_of_days(api: httpx.AsyncClient) -> None:
    today = time.strftime("%Y-%m-%d", time.gmtime())
    # `days` as before: today only, or the default 30 days.
    assert await days_of(api, "days=1") == [today]
    assert await days_of(api, "") == [today]
    # Both ends included.
    assert await days_of(api, "since=2025-03-01&until=2025-03-02") == ["2025-03-01", "2025-03-02"]
    assert await days_of(api, "since=2025-03-02&until=2025-03-02") == ["2025-03-02"]
    # `since` alone runs to today; `days` then counts for nothing.
    assert await days_of(api, "since=2025-03-02&days=1") == ["2025-03-02", "2025-03-03", today]
    # `until` alone: the `days` up to it.
    assert await days_of(api, "until=2025-03-03&days=2") == ["2025-03-02", "2025-03-03"]
    assert await days_of(api, "until=2025-03-02") == ["2025-03-01", "2025-03-02"]
    rows = (await api.get("/api/v1/usage?since=2025-03-03&until=2025-03-03")).json()
    assert rows == [
        {
            "day": "2025-03-03",
            "key_id": "k2",
            "key_name": None,
            "model": "qwen",
            "replica": "r9",
            "requests": 3,
            "prompt_tokens": 1,
            "completion_tokens": 1,
            "org_id": None,
            "project_id": None,
            "person_id": None,
        }
    ]


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ("since=yesterday", "since", "since: 'yesterday' is not a date (like 2026-12-01)"),
        ("until=2025-02-30", "until", "until: '2025-02-30' is not a date"),
        ("since=20250301", "since", "is not a date"),
        ("since=2025-03-03&until=2025-03-01", "since", "since: 2025-03-03 is after until"),
        ("days=0", "days", "days"),
    ],
)
async def test_a_bad_day_is_a_400_naming_the_field(
    api: httpx.AsyncClient, query: str, field: str, words: str
) -> None:
    answer = await api.get(f"/api/v1/usage?{query}")
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == field and words in error["message"]
