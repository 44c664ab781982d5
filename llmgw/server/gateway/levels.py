"""The levels a key's limits come from: its organisation, team and project.

A key under a project is under the project, its team and its organisation; a personal
key is under its organisation only. Each level may limit requests and tokens a minute,
tokens a month and the models used (``people.records.Limits``); with the key's own, the
tightest wins: a request is refused when any level it is under is at one of its limits,
and a model is used only when it matches the patterns of every level that names some.

What a level counted is the sum of what its keys counted, so nothing about levels is
said between control planes: each adds up the other control planes' per-key counts it
hears (``KeyBook.heard``) per level, and a level's tokens this month are its keys'.

The chain of each key (only the levels that limit something) is worked out when the
keys or the directory change, never per request: the request path adds one count to
each window of a chain of at most three. A level's windows are built again from its
keys' windows each time, so a limit set now holds for the minute already counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from llmgw.server.people.directory import Snapshot
from llmgw.server.people.records import Limits
from llmgw.server.store import ApiKeyRecord


class Window:
    """Counts over the last 60 seconds in one-second buckets: exact to the second.

    Trimmed once a second at most: within the second it was trimmed in, no bucket can
    have left, and the request path counts and adds to up to eight windows a request."""

    __slots__ = ("buckets", "total", "trimmed")

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()
        self.total = 0
        self.trimmed = 0

    @classmethod
    def summed(cls, windows: Iterable[Window]) -> Window:
        """One window holding what every one of ``windows`` holds, second by second."""
        seconds: dict[int, int] = {}
        for w in windows:
            for second, n in w.buckets:
                seconds[second] = seconds.get(second, 0) + n
        out = cls()
        for second in sorted(seconds):
            out.buckets.append([second, seconds[second]])
            out.total += seconds[second]
        return out

    def _trim(self, now: int) -> None:
        self.trimmed = now
        buckets = self.buckets
        while buckets and buckets[0][0] <= now - 60:
            self.total -= buckets.popleft()[1]

    def count(self, now: float) -> int:
        second = int(now)
        if second != self.trimmed:
            self._trim(second)
        return self.total

    def add(self, now: float, n: int) -> None:
        second = int(now)
        buckets = self.buckets
        if second != self.trimmed:
            self._trim(second)
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += n
        else:
            buckets.append([second, n])
        self.total += n

    def retry_after(self, now: float, limit: int) -> int:
        """Seconds until the window holds less than ``limit``."""
        total = self.total
        for second, n in self.buckets:
            total -= n
            if total < limit:
                return max(1, second + 60 - int(now))
        return 60


class Level:
    """An organisation, team or project that limits something: its limits, its keys'
    last minute here and on the other control planes, and its keys' tokens this month."""

    __slots__ = (
        "away_requests",
        "away_tokens",
        "budget",
        "guard",
        "label",
        "models",
        "month",
        "requests",
        "rpm",
        "tokens",
        "tools",
        "tpm",
    )

    def __init__(self, label: str, limits: Limits) -> None:
        # How a refusal names it: "project vision/demo", "team vision", "organisation acme".
        self.label = label
        self.rpm = limits.rpm
        self.tpm = limits.tpm
        self.budget = limits.budget
        self.models = limits.models
        self.tools = limits.tools
        self.guard = limits.guard
        self.requests = Window()
        self.tokens = Window()
        self.month = 0
        self.away_requests = 0
        self.away_tokens = 0

    def reached(self, now: float) -> bool:
        """Whether one of its limits is reached (``KeyBook.over_limit`` then says which)."""
        rpm = self.rpm
        if rpm is not None and self.requests.count(now) + self.away_requests >= rpm:
            return True
        tpm = self.tpm
        if tpm is not None and self.tokens.count(now) + self.away_tokens >= tpm:
            return True
        budget = self.budget
        return budget is not None and self.month >= budget

    @property
    def rated(self) -> bool:
        """Whether it limits a minute's requests or tokens (its counts are exchanged)."""
        return self.rpm is not None or self.tpm is not None


# A level's id in the chain: its kind and the record's id.
LevelId = tuple[str, str]


def chain_of(record: ApiKeyRecord, tree: Snapshot) -> list[tuple[LevelId, str, Limits]]:
    """The levels a key is under, narrowest first, each with its label and limits: its
    project, the project's team and the organisation; a personal key's organisation."""
    out: list[tuple[LevelId, str, Limits]] = []
    org_id = record.org_id
    project = tree.projects.get(record.project_id or "") if record.person_id is None else None
    if project is not None:
        team = tree.teams.get(project.team_id)
        where = f"{team.name}/{project.name}" if team is not None else project.name
        out.append((("project", project.id), f"project {where}", project.limits))
        if team is not None:
            out.append((("team", team.id), f"team {team.name}", team.limits))
        org_id = project.org_id
    org = tree.orgs.get(org_id or "")
    if org is not None:
        out.append((("org", org.id), f"organisation {org.name}", org.limits))
    return out


def limiting(limits: Limits) -> bool:
    """Whether a level bears on its keys: a limit, models, tools or guard policies."""
    return limits.any or bool(limits.models) or limits.tools is not None or bool(limits.guard)


def build_levels(
    records: Iterable[ApiKeyRecord], tree: Snapshot
) -> tuple[dict[LevelId, Level], dict[str, list[LevelId]]]:
    """Every level that limits something, and each key's chain of them (by key id)."""
    levels: dict[LevelId, Level] = {}
    chains: dict[str, list[LevelId]] = {}
    for record in records:
        ids: list[LevelId] = []
        for level_id, label, limits in chain_of(record, tree):
            if not limiting(limits):
                continue
            if level_id not in levels:
                levels[level_id] = Level(label, limits)
            ids.append(level_id)
        chains[record.id] = ids
    return levels, chains


def away_of(
    levels: Mapping[LevelId, Level],
    chains: Mapping[str, list[LevelId]],
    elsewhere: Mapping[str, tuple[int, int]],
) -> None:
    """Each level's last minute on the other control planes: its keys' summed."""
    for level in levels.values():
        level.away_requests = level.away_tokens = 0
    for key_id, (requests, tokens) in elsewhere.items():
        for level_id in chains.get(key_id, ()):
            level = levels[level_id]
            level.away_requests += requests
            level.away_tokens += tokens
