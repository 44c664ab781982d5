"""The Usage page's pure parts: the range of days asked for, the rows grouped by key,
model, replica or day, the chart's series and the CSV file (formulas never pass)."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Any

import pytest

from llmgw.server.pages import usagepages as u
from llmgw.server.refusal import Refusal

TODAY = dt.date(2026, 3, 15)


def row(
    day: str, key: str, model: str, replica: str, n: int, p: int, c: int, **more: Any
) -> dict[str, Any]:
    return {
        "day": day,
        "key_id": key,
        "key_name": more.get("name"),
        "model": model,
        "replica": replica,
        "requests": n,
        "prompt_tokens": p,
        "completion_tokens": c,
    }


ROWS = [
    row("2026-03-01", "k1", "llama", "r1", 2, 10, 20, name="alice"),
    row("2026-03-01", "k2", "qwen", "r9", 1, 5, 5, name="bob"),
    row("2026-03-03", "k1", "llama", "r2", 1, 1, 2, name="alice"),
    row("2026-03-03", "k3", "llama", "r1", 4, 100, 0),  # a key since deleted: no name
]


def test_the_range_defaults_to_the_last_30_days_and_reads_iso_dates() -> None:
    assert u.day_range(None, None, TODAY) == (dt.date(2026, 2, 14), TODAY)
    assert u.day_range("", "  ", TODAY) == (dt.date(2026, 2, 14), TODAY)
    assert u.day_range("2026-03-01", "2026-03-03", TODAY) == (
        dt.date(2026, 3, 1),
        dt.date(2026, 3, 3),
    )
    # `to` alone: the 30 days up to it; one day is a range too.
    assert u.day_range(None, "2026-01-30", TODAY) == (dt.date(2026, 1, 1), dt.date(2026, 1, 30))
    assert u.day_range("2026-03-02", "2026-03-02", TODAY)[0] == dt.date(2026, 3, 2)


@pytest.mark.parametrize(
    ("start", "end", "field", "words"),
    [
        ("yesterday", None, "from", "'yesterday' is not a date (like 2026-12-01)"),
        (None, "2026-02-30", "to", "'2026-02-30' is not a date"),
        ("20260301", None, "from", "is not a date"),  # the basic form is not the store's
        ("2026-03-04", "2026-03-03", "from", "2026-03-04 is after to (2026-03-03)"),
        ("2000-01-01", "2026-03-03", "from", "over 3660 days"),
    ],
)
def test_a_bad_range_is_a_400_naming_the_field(
    start: str | None, end: str | None, field: str, words: str
) -> None:
    with pytest.raises(Refusal) as caught:
        u.day_range(start, end, TODAY)
    assert caught.value.status == 400 and caught.value.field == field
    assert caught.value.message.startswith(f"{field}: ") and words in caught.value.message


def test_rows_group_by_each_dimension() -> None:
    by_day = u.group(ROWS, "day")
    assert [(g["name"], g["requests"], g["total_tokens"]) for g in by_day] == [
        ("2026-03-01", 3, 40),
        ("2026-03-03", 5, 103),
    ]
    by_key = u.group(ROWS, "key")
    assert [(g["name"], g["key_name"], g["total_tokens"]) for g in by_key] == [
        ("k3", None, 100),  # most tokens first; no name: its id alone
        ("alice (k1)", "alice", 33),
        ("bob (k2)", "bob", 10),
    ]
    by_model = u.group(ROWS, "model")
    assert [(g["name"], g["prompt_tokens"], g["completion_tokens"]) for g in by_model] == [
        ("llama", 111, 22),
        ("qwen", 5, 5),
    ]
    assert [g["name"] for g in u.group(ROWS, "replica")] == ["r1", "r9", "r2"]
    assert u.totals(by_model) == {
        "requests": 8,
        "prompt_tokens": 116,
        "completion_tokens": 27,
        "total_tokens": 143,
    }
    assert u.group([], "key") == [] and u.totals([])["total_tokens"] == 0
    assert u.dimension("model") == "model" and u.dimension("nonsense") == u.dimension(None) == "day"


def test_the_chart_has_every_day_of_the_range_and_a_series_per_model() -> None:
    out = u.series(ROWS, dt.date(2026, 2, 28), dt.date(2026, 3, 3))
    midnight = int(dt.datetime(2026, 2, 28, tzinfo=dt.UTC).timestamp())
    assert out["t"] == [midnight + n * 86400 for n in range(4)]
    assert out["series"] == [
        {"label": "llama", "data": [0, 30, 0, 103]},
        {"label": "qwen", "data": [0, 10, 0, 0]},
    ]
    # Rows outside the range (the API's, asked for exactly, have none) are left out.
    assert u.series(ROWS, dt.date(2026, 3, 2), dt.date(2026, 3, 2))["series"] == []


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ('=HYPERLINK("http://x")', '\'=HYPERLINK("http://x")'),
        ("+1", "'+1"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("alice", "alice"),
        ("a=b", "a=b"),
        (None, ""),
        (12, "12"),
    ],
)
def test_a_csv_cell_is_never_a_formula(value: Any, written: str) -> None:
    assert u.cell(value) == written


def test_the_csv_has_a_header_and_a_line_per_row() -> None:
    evil = row("2026-03-02", "k4", "=cmd|' /C calc'!A0", "r1", 1, 2, 3, name="@evil")
    text = u.csv_text([*ROWS, evil], "key")
    lines = list(csv.reader(io.StringIO(text)))
    assert lines[0] == list(u.CSV_FIELDS)
    assert len(lines) == 1 + len(ROWS) + 1
    assert [line[1] for line in lines[1:]] == ["k1", "k1", "k2", "k3", "k4"]  # by key
    assert lines[1] == ["2026-03-01", "k1", "alice", "llama", "r1", "2", "10", "20", "30"]
    assert lines[4][2] == ""  # no name: an empty cell, not "None"
    assert lines[5][2] == "'@evil" and lines[5][3] == "'=cmd|' /C calc'!A0"
    assert text.endswith("\r\n")
    assert u.csv_text([]).splitlines() == [",".join(u.CSV_FIELDS)]
