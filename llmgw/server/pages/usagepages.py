"""The Usage page: requests and tokens by key, model, replica or day, or summed per
organisation, team, project or person, over any range of days and of one organisation
or all, as a table, a chart of tokens per day (``/admin/usage.json``, drawn by
``static/usage.js``) and a CSV file (``/admin/usage.csv``).

The rows are those ``GET /api/v1/usage?since=&until=&by=&org=`` answers, read from the
same service (``KeyService.usage``), which shows each caller only the keys they may see
(so the page is open to anyone signed in); everything else here is a pure function of
them, tested without a server.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypedDict, cast

from starlette.responses import JSONResponse, Response

from llmgw.server.pages.frame import Frame, Page, PageCall, Services
from llmgw.server.refusal import Refusal
from llmgw.server.requests import UsageQuery

Dimension = Literal["day", "key", "model", "replica"]
# Summed by the service itself (``UsageQuery.by``), with each one's name.
Summed = Literal["org", "team", "project", "person"]
SUMMED: tuple[Summed, ...] = ("org", "team", "project", "person")
DIMENSIONS: tuple[Dimension | Summed, ...] = ("day", "key", "model", "replica", *SUMMED)
# The usage row's field each dimension groups by.
FIELD: dict[Dimension, str] = {
    "day": "day",
    "key": "key_id",
    "model": "model",
    "replica": "replica",
}
# A row as ``KeyService.usage`` answers it: day, key_id, key_name, model, replica,
# requests, prompt_tokens, completion_tokens.
UsageRow = Mapping[str, Any]


class UsageTotals(TypedDict):
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class UsageGroup(UsageTotals):
    """The rows of one day, key, model or replica, summed."""

    value: str
    # A key by its name and id; the value itself otherwise.
    name: str
    key_name: str | None


class ModelSeries(TypedDict):
    label: str
    data: list[int]


# ``/admin/usage.json``: tokens per day from the first day to the last (ISO dates), a
# series per model.
UsageSeries = TypedDict(
    "UsageSeries", {"from": str, "to": str, "t": list[int], "series": list[ModelSeries]}
)
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


def dimension(by: str | None) -> Dimension | Summed:
    return next((d for d in DIMENSIONS if d == by), "day")


def summed_groups(rows: Iterable[UsageRow]) -> list[UsageGroup]:
    """The service's rows summed per organisation, team, project or person as groups,
    most tokens first; a row of none (a key of no project, a person's key) by an em
    dash."""
    out: list[UsageGroup] = []
    for row in rows:
        ident = row.get("id")
        out.append(
            {
                "value": "" if ident is None else str(ident),
                "name": str(row.get("name") or ident or "—"),
                "key_name": None,
                "requests": int(row["requests"]),
                "prompt_tokens": int(row["prompt_tokens"]),
                "completion_tokens": int(row["completion_tokens"]),
                "total_tokens": tokens(row),
            }
        )
    return sorted(out, key=lambda g: (-g["total_tokens"], g["name"]))


def tokens(row: UsageRow) -> int:
    return int(row["prompt_tokens"]) + int(row["completion_tokens"])


def key_label(key_id: str, name: str | None) -> str:
    return f"{name} ({key_id})" if name else key_id


def group(rows: Iterable[UsageRow], by: Dimension) -> list[UsageGroup]:
    """The rows summed by one dimension: each group's ``name`` (a key by its name and
    id), requests, prompt, completion and total tokens. Days in order; the rest most
    tokens first."""
    field = FIELD[by]
    groups: dict[str, UsageGroup] = {}
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


def totals(groups: Iterable[UsageTotals]) -> UsageTotals:
    out: UsageTotals = {
        "requests": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
    }
    for g in groups:
        out["requests"] += g["requests"]
        out["prompt_tokens"] += g["prompt_tokens"]
        out["completion_tokens"] += g["completion_tokens"]
        out["total_tokens"] += g["total_tokens"]
    return out


def days(first: dt.date, last: dt.date) -> list[dt.date]:
    return [first + dt.timedelta(days=n) for n in range((last - first).days + 1)]


def series(rows: Iterable[UsageRow], first: dt.date, last: dt.date) -> UsageSeries:
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


def cell(value: object) -> str:
    """A CSV cell no spreadsheet reads as a formula: text starting with ``=``, ``+``,
    ``-``, ``@``, a tab or a carriage return gets a leading ``'``."""
    text = "" if value is None else str(value)
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text


def csv_text(rows: Iterable[UsageRow], by: Dimension = "day") -> str:
    """One line per day, key, model and replica, with a header line; ordered by the
    dimension asked for first."""
    field = FIELD[by]
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
    async def read(
        call: PageCall, summed: Summed | None = None
    ) -> tuple[dt.date, dt.date, list[UsageRow]]:
        asked = call.request.query_params
        today = dt.datetime.now(dt.UTC).date()
        first, last = day_range(asked.get("from"), asked.get("to"), today)
        org = asked.get("org", "").strip() or None
        ask = UsageQuery(since=first.isoformat(), until=last.isoformat(), by=summed, org=org)
        rows = await services.keys.usage(ask, call.principal)
        return first, last, list(rows)

    async def usage(call: PageCall) -> Response:
        by = dimension(call.request.query_params.get("by"))
        if by in SUMMED:
            first, last, rows = await read(call, by)
            groups = summed_groups(rows)
        else:
            first, last, rows = await read(call)
            groups = group(rows, cast(Dimension, by))
        org = call.request.query_params.get("org", "").strip()
        return frame.render(
            call.request,
            "usage.html",
            call.session,
            first=first.isoformat(),
            last=last.isoformat(),
            by=by,
            org=org,
            orgs=[{"id": o.id, "name": o.name} for o in services.orgs.listing(call.principal)],
            dimensions=DIMENSIONS,
            groups=groups,
            totals=totals(groups),
            row_count=len(rows),
        )

    async def usage_json(call: PageCall) -> Response:
        first, last, rows = await read(call)
        return JSONResponse(series(rows, first, last))

    async def usage_csv(call: PageCall) -> Response:
        first, last, rows = await read(call)
        asked = dimension(call.request.query_params.get("by"))
        # Rows summed per organisation and the rest have no line of their own: by day.
        by: Dimension = "day" if asked in SUMMED else cast(Dimension, asked)
        name = f"llmgw-usage-{first.isoformat()}-{last.isoformat()}.csv"
        return Response(
            csv_text(rows, by),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    return [
        Page("GET", "/admin/usage", usage, role="member"),
        Page("GET", "/admin/usage.json", usage_json, role="member"),
        Page("GET", "/admin/usage.csv", usage_csv, role="member"),
    ]
