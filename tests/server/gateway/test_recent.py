"""The gateway's last hour for the admin overview: requests, errors and time to first
token per 10 s slot, a slot with no request reading 0 requests and no time."""

from __future__ import annotations

import time

from llmgw.server.gateway.metrics import Metrics, Recent


def test_each_slot_counts_its_requests_errors_and_mean_time_to_first_token() -> None:
    recent = Recent(step=10, span=60)
    recent.add(False, 0.2, now=1000.0)
    recent.add(False, 0.4, now=1009.9)
    recent.add(True, None, now=1010.0)
    series = recent.series(now=1025.0)
    assert series["t"] == [970, 980, 990, 1000, 1010, 1020]
    assert series["requests"] == [0, 0, 0, 2, 1, 0]
    assert series["errors"] == [0, 0, 0, 0, 1, 0]
    assert series["ttft_ms"] == [None, None, None, 300.0, None, None]


def test_slots_older_than_the_span_are_cleared_as_time_moves_on() -> None:
    recent = Recent(step=10, span=30)
    recent.add(False, 0.1, now=100.0)
    recent.add(False, 0.1, now=200.0)  # long after: the ring went round
    series = recent.series(now=205.0)
    assert series["requests"] == [0, 0, 1]
    assert recent.series(now=1000.0)["requests"] == [0, 0, 0]


def test_the_gateways_requests_feed_it() -> None:
    metrics = Metrics()
    metrics.request("tiny", 200, 0.5, 0.05)
    metrics.request("tiny", 429, 0.01, None)
    series = metrics.recent.series(time.time())
    assert sum(series["requests"]) == 2 and sum(series["errors"]) == 1
    assert [v for v in series["ttft_ms"] if v is not None] == [50.0]
