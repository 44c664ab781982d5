"""Gateway keys, their limits and what they used.

``KeyBook`` holds every key in memory by the SHA-256 of what a client sends, answers
who is calling, and whether a key is over its requests or tokens a minute (sliding
windows of one-second buckets) or its monthly budget, or any of those of a level it is
under (its project, team, organisation: ``levels.py``); the tightest wins, and the 429
names the level and the limit. ``Usage`` counts requests and
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from llmgw.jsonvalue import JSON, as_int
from llmgw.server.gateway.errors import fail
from llmgw.server.gateway.levels import Level, LevelId, Window, away_of, build_levels
from llmgw.server.gateway.toolgrants import ToolGrant
from llmgw.server.people.directory import Snapshot
from llmgw.server.store import ApiKeyRecord, Store

log = logging.getLogger("llmgw.gateway")

KEY_PREFIX = "sk-llmgw-"
Clock = Callable[[], float]


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass
class Key:
    record: ApiKeyRecord
    requests: Window = field(default_factory=Window)
    tokens: Window = field(default_factory=Window)
    # The levels it is under that limit something, narrowest first (``KeyBook.relevel``).
    chain: tuple[Level, ...] = ()
    # Model name patterns of the key and of each level that names some: a model must
    # match one of each.
    patterns: tuple[tuple[str, ...], ...] = ()
    # Whether its minute's counts are the cluster's: a rate limit on it or a level above.
    shared: bool = False
    # Whether it has a limit of its own (requests, tokens, budget).
    limited: bool = False
    # What ``may_use`` said of each model asked (the catalog's names: bounded).
    allowed: dict[str, bool] = field(default_factory=dict)
    # The MCP tools it may see and call (``toolgrants.py``), and the guard policies that
    # read what it sends and gets: its own first, then its levels', each once.
    tools: ToolGrant = field(default_factory=ToolGrant)
    policies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.leveled(())

    def leveled(self, chain: tuple[Level, ...]) -> None:
        record = self.record
        self.chain = chain
        own = (record.models,) if record.models else ()
        self.patterns = own + tuple(level.models for level in chain if level.models)
        self.allowed = {}
        named = [(f"key {record.name}", record.tools)]
        self.tools = ToolGrant.of(named + [(level.label, level.tools) for level in chain])
        guard = record.guard + tuple(name for level in chain for name in level.guard)
        self.policies = tuple(dict.fromkeys(guard))
        self.limited = record.rpm is not None or record.tpm is not None or record.budget is not None
        self.shared = (
            record.rpm is not None or record.tpm is not None or any(level.rated for level in chain)
        )

    def may_use(self, model: str) -> bool:
        allowed = self.allowed.get(model)
        if allowed is None:
            allowed = self.allowed[model] = all(
                any(fnmatch.fnmatchcase(model, p) for p in patterns) for patterns in self.patterns
            )
        return allowed


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


def usage_rows(rows: list[list[JSON]]) -> UsageRows:
    """Usage rows as a standby sends them (``/peer/usage``), typed; ValueError or
    TypeError for a row that is not (day, key, model, replica, requests, prompt,
    completion)."""
    out: UsageRows = []
    for row in rows:
        day, key, model, replica, n, prompt, completion = row
        counts = as_int(n), as_int(prompt), as_int(completion)
        out.append((str(day), str(key), str(model), str(replica), *counts))
    return out


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
        # Told when ``month`` is read again (the key book sums it per level).
        self.loaded: Callable[[], None] = lambda: None

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
        self.loaded()

    def add(self, key: Key, model: str, replica: str, prompt: int, completion: int) -> None:
        entry = self.pending.get((key.record.id, model, replica))
        if entry is None:
            entry = self.pending[(key.record.id, model, replica)] = [0, 0, 0]
        entry[0] += 1
        entry[1] += prompt
        entry[2] += completion
        used = prompt + completion
        now = self.clock()
        key.tokens.add(now, used)
        self.month[key.record.id] = self.month.get(key.record.id, 0) + used
        for level in key.chain:
            level.tokens.add(now, used)
            level.month += used

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
    """Every gateway key, by the hash of the key itself, and the levels they are under."""

    def __init__(
        self, usage: Usage, clock: Clock = time.time, tree: Callable[[], Snapshot] = Snapshot
    ) -> None:
        """``tree``: the organisations, teams and projects as they are now (the
        directory's); ``relevel`` reads it again when they change."""
        self.keys: dict[str, Key] = {}
        self.usage = usage
        self.clock = clock
        self.tree = tree
        # Requests and tokens each key had in the last minute on the other control
        # planes, as they said last (limits are the cluster's, not each one's).
        self.elsewhere: dict[str, tuple[int, int]] = {}
        self.levels: dict[LevelId, Level] = {}
        # Each key's levels by key id, for what is heard of keys by id.
        self.chains: dict[str, list[LevelId]] = {}
        usage.loaded = self.months

    def heard(self, elsewhere: dict[str, tuple[int, int]]) -> None:
        """The other control planes' last minute of each limited key (requests, tokens),
        summed: a key's limits are the cluster's, not each control plane's; its levels'
        are the sums of their keys'."""
        self.elsewhere = elsewhere
        away_of(self.levels, self.chains, elsewhere)

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
        self.relevel()

    def relevel(self) -> None:
        """Work out each key's chain of levels again: the keys, or the organisations,
        teams and projects (or their limits) changed. Each level's windows are its keys'
        summed, and its month its keys' tokens this month."""
        levels, chains = build_levels((k.record for k in self.keys.values()), self.tree())
        members: dict[LevelId, list[Key]] = {level_id: [] for level_id in levels}
        for key in self.keys.values():
            ids = chains[key.record.id]
            key.leveled(tuple(levels[i] for i in ids))
            for i in ids:
                members[i].append(key)
        for level_id, level in levels.items():
            keys = members[level_id]
            level.requests = Window.summed(k.requests for k in keys)
            level.tokens = Window.summed(k.tokens for k in keys)
        self.levels, self.chains = levels, chains
        self.months()
        away_of(levels, chains, self.elsewhere)

    def months(self) -> None:
        """Each level's tokens this month: its keys' (the usage's month was read again)."""
        month = self.usage.month
        for level in self.levels.values():
            level.month = 0
        for key_id, ids in self.chains.items():
            used = month.get(key_id, 0)
            for i in ids:
                self.levels[i].month += used

    def used(self, key_id: str, tokens: int) -> None:
        """Tokens a key used on another control plane (a standby's usage, on the
        leader): its month and its levels'."""
        month = self.usage.month
        month[key_id] = month.get(key_id, 0) + tokens
        for i in self.chains.get(key_id, ()):
            self.levels[i].month += tokens

    def counts(self) -> dict[str, list[int]]:
        """This control plane's own last minute of each key with a rate limit on it or
        a level above it: [requests, tokens]."""
        now = self.clock()
        out = {}
        for key in self.keys.values():
            if not key.shared:
                continue
            requests, tokens = key.requests.count(now), key.tokens.count(now)
            if requests or tokens:
                out[key.record.id] = [requests, tokens]
        return out

    def changed(self, *records: ApiKeyRecord) -> None:
        """Keys made or changed here (their levels worked out again once for all)."""
        for record in records:
            old = self.keys.get(record.key_hash)
            if old is None:
                self.keys[record.key_hash] = Key(record)
            else:
                old.record = record
        self.relevel()

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
        """The 429 of a key at one of its limits or of a level above it, or None. Where
        several are, the one to wait longest for is named (waiting less would not do)."""
        record = key.record
        now = self.clock()
        worst: Over | None = None
        if key.limited:
            requests, tokens = self.elsewhere.get(record.id, (0, 0))
            worst = over(
                "this key",
                now,
                record.rpm,
                key.requests,
                requests,
                record.tpm,
                key.tokens,
                tokens,
                record.budget,
                self.usage.month.get(record.id, 0),
            )
        for level in key.chain:
            if not level.reached(now):
                continue
            found = over(
                level.label,
                now,
                level.rpm,
                level.requests,
                level.away_requests,
                level.tpm,
                level.tokens,
                level.away_tokens,
                level.budget,
                level.month,
            )
            if found is not None and (worst is None or found[3] > worst[3]):
                worst = found
        return None if worst is None else limited(*worst)

    def admitted(self, key: Key) -> None:
        now = self.clock()
        key.requests.add(now, 1)
        for level in key.chain:
            level.requests.add(now, 1)


# Whose limit, of what, the limit, seconds to wait.
Over = tuple[str, str, int, int]


def over(
    who: str,
    now: float,
    rpm: int | None,
    requests: Window,
    away_requests: int,
    tpm: int | None,
    tokens: Window,
    away_tokens: int,
    budget: int | None,
    month: int,
) -> Over | None:
    """The first limit of one level that is reached, or None: its requests or tokens in
    the last minute here and on the other control planes (``away_``), or this month's."""
    if rpm is not None and requests.count(now) + away_requests >= rpm:
        return who, "requests per minute", rpm, requests.retry_after(now, rpm - away_requests)
    if tpm is not None and tokens.count(now) + away_tokens >= tpm:
        return who, "tokens per minute", tpm, tokens.retry_after(now, tpm - away_tokens)
    if budget is not None and month >= budget:
        return who, "tokens a month (its budget)", budget, seconds_to_next_month(now)
    return None


def limited(who: str, what: str, limit: int, retry: int) -> web.Response:
    answer = fail(
        429,
        f"over {who}'s limit of {limit} {what}; try again in {retry} s",
        "rate_limit_error",
        "rate_limit_exceeded",
    )
    answer.headers["Retry-After"] = str(retry)
    return answer
