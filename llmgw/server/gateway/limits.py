"""Gateway keys, their limits and what they used.

``KeyBook`` holds every key in memory by the SHA-256 of what a client sends, answers
who is calling, and whether a key is over its requests or tokens a minute (sliding
windows of one-second buckets) or its monthly budget. ``Usage`` counts requests and
tokens per key, model and replica off the request path and writes them in batches;
what could not be written stays counted and is written with the next batch. Both take
a clock, so expiry and a month's rollover are tested without waiting.
"""

from __future__ import annotations

import calendar
import fnmatch
import hashlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from llmgw.server.gateway.errors import fail
from llmgw.server.store import ApiKeyRecord, Store

log = logging.getLogger("llmgw.gateway")

KEY_PREFIX = "sk-llmgw-"
Clock = Callable[[], float]


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class Window:
    """Counts over the last 60 seconds in one-second buckets: exact to the second."""

    __slots__ = ("buckets", "total")

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()
        self.total = 0

    def _trim(self, now: int) -> None:
        while self.buckets and self.buckets[0][0] <= now - 60:
            self.total -= self.buckets.popleft()[1]

    def count(self, now: float) -> int:
        self._trim(int(now))
        return self.total

    def add(self, now: float, n: int) -> None:
        second = int(now)
        self._trim(second)
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1][1] += n
        else:
            self.buckets.append([second, n])
        self.total += n

    def retry_after(self, now: float, limit: int) -> int:
        """Seconds until the window holds less than ``limit``."""
        total = self.total
        for second, n in self.buckets:
            total -= n
            if total < limit:
                return max(1, second + 60 - int(now))
        return 60


@dataclass
class Key:
    record: ApiKeyRecord
    requests: Window = field(default_factory=Window)
    tokens: Window = field(default_factory=Window)

    def may_use(self, model: str) -> bool:
        patterns = self.record.models
        return not patterns or any(fnmatch.fnmatchcase(model, p) for p in patterns)


def month_of(now: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(now))


def seconds_to_next_month(now: float) -> int:
    t = time.gmtime(now)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    start = calendar.timegm((year, month, 1, 0, 0, 0, 0, 0, 0))
    return max(1, int(start - now))


# Usage rows (day, key id, key name, model, replica, requests, prompt, completion...)
# written somewhere.
UsageRows = list[tuple[str, str, str, str, int, int, int]]
UsageWriter = Callable[[UsageRows], Awaitable[None]]


class Usage:
    """Requests and tokens not yet written, and each key's tokens this month."""

    def __init__(
        self, store: Store, clock: Clock = time.time, write: UsageWriter | None = None
    ) -> None:
        """``write``: where counted rows go, the store on the leader, the leader on a
        standby (the control plane decides at each write); the store when not given."""
        self.store = store
        self.clock = clock
        # (key id, model, replica) -> [requests, prompt, completion], not yet written.
        self.pending: dict[tuple[str, str, str], list[int]] = {}
        # Tokens each key has used this month (the store's and what is pending).
        self.month: dict[str, int] = {}
        self.month_of = month_of(clock())
        self.write: UsageWriter = write or store.add_usage

    async def load_month(self) -> None:
        now = self.clock()
        self.month_of = month_of(now)
        totals: dict[str, int] = {}
        for row in await self.store.usage(self.month_of + "-01"):
            used = row["prompt_tokens"] + row["completion_tokens"]
            totals[row["key_id"]] = totals.get(row["key_id"], 0) + used
        for (key_id, _, _), (_, prompt, completion) in self.pending.items():
            totals[key_id] = totals.get(key_id, 0) + prompt + completion
        self.month = totals

    def add(self, key: Key, model: str, replica: str, prompt: int, completion: int) -> None:
        entry = self.pending.get((key.record.id, model, replica))
        if entry is None:
            entry = self.pending[(key.record.id, model, replica)] = [0, 0, 0]
        entry[0] += 1
        entry[1] += prompt
        entry[2] += completion
        used = prompt + completion
        key.tokens.add(self.clock(), used)
        self.month[key.record.id] = self.month.get(key.record.id, 0) + used

    async def flush(self) -> None:
        """Write what is pending; on failure keep it for the next flush and raise."""
        pending, self.pending = self.pending, {}
        if not pending:
            return
        day = time.strftime("%Y-%m-%d", time.gmtime(self.clock()))
        rows = [(day, k, m, r, n, p, c) for (k, m, r), (n, p, c) in pending.items()]
        try:
            await self.write(rows)
        except BaseException:
            for key, counts in pending.items():
                entry = self.pending.setdefault(key, [0, 0, 0])
                for i in range(3):
                    entry[i] += counts[i]
            raise

    async def tick(self) -> None:
        """Write usage; a new month starts every budget afresh."""
        await self.flush()
        if month_of(self.clock()) != self.month_of:
            await self.load_month()


class KeyBook:
    """Every gateway key, by the hash of the key itself."""

    def __init__(self, usage: Usage, clock: Clock = time.time) -> None:
        self.keys: dict[str, Key] = {}
        self.usage = usage
        self.clock = clock
        # Requests and tokens each key had in the last minute on the other control
        # planes, as they said last (limits are the cluster's, not each one's).
        self.elsewhere: dict[str, tuple[int, int]] = {}

    def heard(self, elsewhere: dict[str, tuple[int, int]]) -> None:
        """The other control planes' last minute of each limited key (requests, tokens),
        summed: a key's limits are the cluster's, not each control plane's."""
        self.elsewhere = elsewhere

    def load(self, records: list[ApiKeyRecord]) -> None:
        """The keys as the store has them; a key already known keeps its windows."""
        old = self.keys
        self.keys = {}
        for r in records:
            key = old.get(r.key_hash)
            if key is None:
                key = Key(r)
            else:
                key.record = r
            self.keys[r.key_hash] = key

    def counts(self) -> dict[str, list[int]]:
        """This control plane's own last minute of each limited key: [requests, tokens]."""
        now = self.clock()
        out = {}
        for key in self.keys.values():
            record = key.record
            if record.rpm is None and record.tpm is None:
                continue
            requests, tokens = key.requests.count(now), key.tokens.count(now)
            if requests or tokens:
                out[record.id] = [requests, tokens]
        return out

    def changed(self, record: ApiKeyRecord) -> None:
        old = self.keys.get(record.key_hash)
        if old is None:
            self.keys[record.key_hash] = Key(record)
        else:
            old.record = record

    def records(self) -> list[ApiKeyRecord]:
        return [k.record for k in self.keys.values()]

    def find(self, key_id: str) -> ApiKeyRecord | None:
        return next((k.record for k in self.keys.values() if k.record.id == key_id), None)

    def authorise(self, header: str) -> Key | web.Response:
        """The key an ``Authorization`` header carries, or the 401 that says why not."""
        if not header.startswith(("Bearer ", "bearer ")):
            return fail(
                401,
                "no API key: send 'Authorization: Bearer <key>' with a key from "
                "`llmgw ctl keys create`",
                "authentication_error",
                "invalid_api_key",
            )
        key = self.keys.get(key_hash(header[7:].strip()))
        if key is None or key.record.revoked_at is not None:
            return fail(401, "the API key is not valid", "authentication_error", "invalid_api_key")
        expires = key.record.expires_at
        if expires is not None and self.clock() >= expires:
            return fail(401, "the API key has expired", "authentication_error", "expired_api_key")
        return key

    def over_limit(self, key: Key) -> web.Response | None:
        """The 429 of a key over one of its limits, or None."""
        record = key.record
        now = self.clock()
        requests, tokens = self.elsewhere.get(record.id, (0, 0))
        if record.rpm is not None and key.requests.count(now) + requests >= record.rpm:
            return limited(
                "requests per minute", record.rpm, key.requests.retry_after(now, record.rpm)
            )
        if record.tpm is not None and key.tokens.count(now) + tokens >= record.tpm:
            return limited("tokens per minute", record.tpm, key.tokens.retry_after(now, record.tpm))
        if record.budget is not None and self.usage.month.get(record.id, 0) >= record.budget:
            return limited("tokens a month (its budget)", record.budget, seconds_to_next_month(now))
        return None

    def admitted(self, key: Key) -> None:
        key.requests.add(self.clock(), 1)


def limited(what: str, limit: int, retry: int) -> web.Response:
    answer = fail(
        429,
        f"over this key's limit of {limit} {what}; try again in {retry} s",
        "rate_limit_error",
        "rate_limit_exceeded",
    )
    answer.headers["Retry-After"] = str(retry)
    return answer
