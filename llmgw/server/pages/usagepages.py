"""The Usage page: requests and tokens by key, model, replica or day over any range of
days, as a table, a chart of tokens per day (``/admin/usage.json``, drawn by
``static/usage.js``) and a CSV file (``/admin/usage.csv``).

The rows are those ``GET /api/v1/usage?since=&until=`` answers, read from the same
service (``KeyService.usage``);
everything else here is a pure function of them, tested without a server.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response

from llmgw.server.pages.frame import Frame, Page, PageCall, Services
from llmgw.server.refusal import Refusal
from llmgw.server.requests import UsageQuery

DIMENSIONS = ("day", "key", "model", "replica")
DEFAULT_DAYS = 30
MAX_DAYS = 3660  # as the API's ``days``
CSV_FIELDS = (
    "day",
    "key_id",
    "key_name",
    "model",
    "replica",
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def day_range(start: str | None, end: str | None, today: dt.date) -> tuple[dt.date, dt.date]:
    """The days asked for, both included: ``from`` and ``to`` as ISO dates, by default the
    last ``DEFAULT_DAYS`` to ``today``; a bad date, or a range backwards or too long, is
    a 400 naming the field."""

    def read(text: str | None, name: str) -> dt.date | None:
        text = (text or "").strip()
        if not text:
            return None
        try:
            if len(text) == 10:
                return dt.date.fromisoformat(text)
        except ValueError:
            pass
        raise Refusal(
            400, "bad_request", f"{name}: {text[:40]!r} is not a date (like 2026-12-01)", name
        )

    last = read(end, "to") or today
    first = read(start, "from") or last - dt.timedelta(days=DEFAULT_DAYS - 1)
    if first > last:
        raise Refusal(400, "bad_request", f"from: {first} is after to ({last})", "from")
    if (last - first).days + 1 > MAX_DAYS:
        raise Refusal(400, "bad_request", f"from: the range is over {MAX_DAYS} days", "from")
    return first, last


def dimension(by: str | None) -> str:
    return by if by in DIMENSIONS else "day"


def tokens(row: Mapping[str, Any]) -> int:
    return int(row["prompt_tokens"]) + int(row["completion_tokens"])


def key_label(key_id: str, name: str | None) -> str:
    return f"{name} ({key_id})" if name else key_id


def group(rows: Iterable[Mapping[str, Any]], by: str) -> list[dict[str, Any]]:
    """The rows summed by one dimension: each group's ``name`` (a key by its name and
    id), requests, prompt, completion and total tokens. Days in order; the rest most
    tokens first."""
    field = {"day": "day", "key": "key_id", "model": "model", "replica": "replica"}[by]
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        value = str(row[field])
        entry = groups.setdefault(
            value,
            {
                "value": value,
                "name": key_label(value, row.get("key_name")) if by == "key" else value,
                "key_name": row.get("key_name") if by == "key" else None,
                "requests": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "total_tokens": 0,
            },
        )
        entry["requests"] += int(row["requests"])
        entry["prompt_tokens"] += int(row["prompt_tokens"])
        entry["completion_tokens"] += int(row["completion_tokens"])
        entry["total_tokens"] += tokens(row)
    out = list(groups.values())
    if by == "day":
        return sorted(out, key=lambda g: g["value"])
    return sorted(out, key=lambda g: (-g["total_tokens"], g["value"]))


def totals(groups: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    fields = ("requests", "prompt_tokens", "completion_tokens", "total_tokens")
    out = dict.fromkeys(fields, 0)
    for g in groups:
        for f in fields:
            out[f] += int(g[f])
    return out


def days(first: dt.date, last: dt.date) -> list[dt.date]:
    return [first + dt.timedelta(days=n) for n in range((last - first).days + 1)]


def series(rows: Iterable[Mapping[str, Any]], first: dt.date, last: dt.date) -> dict[str, Any]:
    """Tokens per day from ``first`` to ``last``, one series per model: ``t`` is each
    day's midnight UTC in seconds (uPlot's time axis). A day without a row had no
    traffic: 0, which is what the store counted, not a figure missing."""
    span = days(first, last)
    index = {d.isoformat(): i for i, d in enumerate(span)}
    per_model: dict[str, list[int]] = {}
    for row in rows:
        i = index.get(str(row["day"]))
        if i is None:
            continue
        data = per_model.setdefault(str(row["model"]), [0] * len(span))
        data[i] += tokens(row)
    midnight = [int(dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC).timestamp()) for d in span]
    return {
        "from": first.isoformat(),
        "to": last.isoformat(),
        "t": midnight,
        "series": [{"label": m, "data": data} for m, data in sorted(per_model.items())],
    }


def cell(value: Any) -> str:
    """A CSV cell no spreadsheet reads as a formula: text starting with ``=``, ``+``,
    ``-``, ``@``, a tab or a carriage return gets a leading ``'``."""
    text = "" if value is None else str(value)
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text


def csv_text(rows: Iterable[Mapping[str, Any]], by: str = "day") -> str:
    """One line per day, key, model and replica, with a header line; ordered by the
    dimension asked for first."""
    field = {"day": "day", "key": "key_id", "model": "model", "replica": "replica"}[by]
    ordered = sorted(
        rows,
        key=lambda r: (str(r[field]), r["day"], r["key_id"], r["model"], r["replica"]),
    )
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_FIELDS)
    for r in ordered:
        writer.writerow(
            [cell(r.get(f)) if f != "total_tokens" else str(tokens(r)) for f in CSV_FIELDS]
        )
    return out.getvalue()


def pages(frame: Frame, services: Services) -> list[Page]:
    async def read(call: PageCall) -> tuple[dt.date, dt.date, list[dict[str, Any]]]:
        asked = call.request.query_params
        today = dt.datetime.now(dt.UTC).date()
        first, last = day_range(asked.get("from"), asked.get("to"), today)
        ask = UsageQuery(since=first.isoformat(), until=last.isoformat())
        rows = await services.keys.usage(ask)
        return first, last, list(rows)

    async def usage(call: PageCall) -> Response:
        first, last, rows = await read(call)
        by = dimension(call.request.query_params.get("by"))
        groups = group(rows, by)
        context: dict[str, Any] = {
            "first": first.isoformat(),
            "last": last.isoformat(),
            "by": by,
            "dimensions": DIMENSIONS,
            "groups": groups,
            "totals": totals(groups),
            "row_count": len(rows),
        }
        return frame.render(call.request, "usage.html", call.session, **context)

    async def usage_json(call: PageCall) -> Response:
        first, last, rows = await read(call)
        return JSONResponse(series(rows, first, last))

    async def usage_csv(call: PageCall) -> Response:
        first, last, rows = await read(call)
        by = dimension(call.request.query_params.get("by"))
        name = f"llmgw-usage-{first.isoformat()}-{last.isoformat()}.csv"
        return Response(
            csv_text(rows, by),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    return [
        Page("GET", "/admin/usage", usage),
        Page("GET", "/admin/usage.json", usage_json),
        Page("GET", "/admin/usage.csv", usage_csv),
    ]
