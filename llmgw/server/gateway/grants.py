"""Tool grants and guard policies as they are set, revoked and listed.

What a level (organisation, team, project) or a key asks to change of its limits is
checked here once, for ``OrgService`` and ``KeyService`` alike (``asked``): each tool
pattern must be one (``toolgrants.bad_pattern``), each guard policy must exist, and
``clear`` lifts what it names (``tools``: the level says nothing of tools again, None;
``guard``: no policy).

A revoke (``revoke_tools: SERVER``) takes every pattern that ``reaches`` SERVER from the
level's list and from each list beneath it: an organisation's teams, projects and keys;
a team's projects and their keys; a project's keys. A list left empty stays empty: the
level is closed to every tool until ``clear: [tools]`` opens it, and the answer says so
(``revocations`` gives each record changed, ``grant_row`` how it reads now).

The guard policies are kept by the guard (the settings document ``"guard"``);
``policy_names`` reads their names from it with the guard's own reader.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from llmgw.server.gateway.toolgrants import bad_pattern, reaches
from llmgw.server.guard.policies import SETTING as GUARD_SETTING
from llmgw.server.guard.policies import read_document
from llmgw.server.people.asks import SetLimits
from llmgw.server.people.directory import Snapshot
from llmgw.server.people.records import Limits, Org, Project, Team
from llmgw.server.refusal import Refusal
from llmgw.server.store import ApiKeyRecord, Store
from llmgw.server.store.base import Limited
from llmgw.wire.admin import GrantLevel, LimitsSetJson, McpGrantJson

CLEARABLE = ("rpm", "tpm", "budget", "models", "tools", "guard")
OPEN_HINT = "closed: no tool until `--clear tools` opens it"


@dataclass(frozen=True)
class LimitsSet:
    """What setting a level's or key's limits made: its limits now, and each level and
    key beneath it whose tools a revoke changed (as they are now)."""

    limits: Limits
    revoked: tuple[Limited, ...] = ()


async def policy_names(store: Store) -> frozenset[str]:
    """The guard policies that exist, by name (none while the guard keeps none), read
    as the guard reads its document."""
    return frozenset(read_document(await store.get_setting(GUARD_SETTING)))


def asked(old: Limits, ask: SetLimits, policies: frozenset[str]) -> Limits:
    """The limits ``ask`` makes of ``old``: fields left out stay, ``clear`` lifts; a
    revoke is applied apart (``revoked``)."""
    bad = [c for c in ask.clear if c not in CLEARABLE]
    if bad:
        raise Refusal(
            400,
            "bad_request",
            f"clear: {bad[0]!r} is not one of {', '.join(CLEARABLE)}",
            "clear",
        )
    for pattern in ask.tools or ():
        why = bad_pattern(pattern)
        if why is not None:
            raise Refusal(400, "bad_request", f"tools: {why}", "tools")
    for name in ask.guard or ():
        if name not in policies:
            raise Refusal(
                400,
                "bad_request",
                f"guard: no guard policy {name!r}; `llmgw ctl guard policy list` lists them",
                "guard",
            )
    clear = set(ask.clear)

    def pick(name: str, new: int | None, was: int | None) -> int | None:
        if name in clear:
            return None
        return was if new is None else new

    return Limits(
        rpm=pick("rpm", ask.rpm, old.rpm),
        tpm=pick("tpm", ask.tpm, old.tpm),
        budget=pick("budget", ask.budget, old.budget),
        models=() if "models" in clear else (ask.models if ask.models is not None else old.models),
        tools=None if "tools" in clear else (ask.tools if ask.tools is not None else old.tools),
        guard=() if "guard" in clear else (ask.guard if ask.guard is not None else old.guard),
    )


def limits_detail(limits: Limits) -> str:
    """A level's or key's limits in its audit entry."""
    models = ", ".join(limits.models) or "all"
    tools = "none" if limits.tools is None else (", ".join(limits.tools) or "closed")
    guard = ", ".join(limits.guard) or "none"
    return (
        f"rpm {limits.rpm}, tpm {limits.tpm}, budget {limits.budget}, models {models}, "
        f"tools {tools}, guard {guard}"
    )


def limits_of(record: Limited) -> Limits:
    if isinstance(record, ApiKeyRecord):
        return Limits(
            record.rpm, record.tpm, record.budget, record.models, record.tools, record.guard
        )
    return record.limits


def with_limits(record: Limited, limits: Limits) -> Limited:
    if isinstance(record, ApiKeyRecord):
        return replace(
            record,
            rpm=limits.rpm,
            tpm=limits.tpm,
            budget=limits.budget,
            models=limits.models,
            tools=limits.tools,
            guard=limits.guard,
        )
    return replace(record, limits=limits)


def without(tools: tuple[str, ...] | None, server: str) -> tuple[str, ...] | None:
    """``tools`` less every pattern that reaches ``server`` (None stays None)."""
    if tools is None:
        return None
    return tuple(p for p in tools if not reaches(p, server))


def beneath(
    record: Limited, tree: Snapshot, keys: Iterable[ApiKeyRecord]
) -> list[Team | Project | ApiKeyRecord]:
    """Every level and key under ``record`` (teams, then projects, then keys)."""
    if isinstance(record, ApiKeyRecord):
        return []
    out: list[Team | Project | ApiKeyRecord] = []
    if isinstance(record, Org):
        out += [t for t in tree.teams.values() if t.org_id == record.id]
        projects = [p for p in tree.projects.values() if p.org_id == record.id]
    elif isinstance(record, Team):
        projects = [p for p in tree.projects.values() if p.team_id == record.id]
    else:
        projects = [record]
    out += [p for p in projects if p is not record]
    ids = {p.id for p in projects}
    for key in keys:
        if key.revoked_at is not None:
            continue
        if key.project_id in ids or (
            isinstance(record, Org) and key.project_id is None and key.org_id == record.id
        ):
            out.append(key)
    return out


def revocations(
    record: Limited, server: str, tree: Snapshot, keys: Iterable[ApiKeyRecord]
) -> list[Limited]:
    """Each record beneath ``record`` (not itself: its own change is the caller's)
    whose tools lose a pattern reaching ``server``, as it is after."""
    out: list[Limited] = []
    for below in beneath(record, tree, keys):
        limits = limits_of(below)
        left = without(limits.tools, server)
        if left != limits.tools:
            out.append(with_limits(below, replace(limits, tools=left)))
    return out


def level_of(record: Limited) -> GrantLevel:
    if isinstance(record, ApiKeyRecord):
        return "key"
    if isinstance(record, Org):
        return "org"
    return "team" if isinstance(record, Team) else "project"


def label_of(record: Limited, tree: Snapshot) -> str:
    """How a refusal and a listing name it: "organisation acme", "project ml/demo"."""
    if isinstance(record, ApiKeyRecord):
        return f"key {record.name}"
    if isinstance(record, Org):
        return f"organisation {record.name}"
    if isinstance(record, Team):
        return f"team {record.name}"
    team = tree.teams.get(record.team_id)
    return f"project {team.name}/{record.name}" if team else f"project {record.name}"


def grant_row(record: Limited, tree: Snapshot, server: str | None = None) -> McpGrantJson:
    """One level or key as the grants listing shows it; with ``server``, only the
    patterns reaching it."""
    tools = limits_of(record).tools or ()
    org = record.org_id if not isinstance(record, Org) else record.id
    return {
        "level": level_of(record),
        "id": record.id,
        "label": label_of(record, tree),
        "org": org,
        "patterns": [p for p in tools if server is None or reaches(p, server)],
        "closed": limits_of(record).tools == (),
    }


def grant_rows(
    tree: Snapshot, keys: Iterable[ApiKeyRecord], server: str | None = None
) -> list[McpGrantJson]:
    """Every level and live key that names tools (a closed list too), organisations
    first; with ``server``, only those with a pattern reaching it, or closed."""
    records: list[Limited] = [
        *sorted(tree.orgs.values(), key=lambda o: o.name),
        *sorted(tree.teams.values(), key=lambda t: (t.org_id, t.name)),
        *sorted(tree.projects.values(), key=lambda p: (p.org_id, p.team_id, p.name)),
        *sorted((k for k in keys if k.revoked_at is None), key=lambda k: (k.created_at, k.id)),
    ]
    out = []
    for record in records:
        tools = limits_of(record).tools
        if tools is None:
            continue
        row = grant_row(record, tree, server)
        if server is None or row["patterns"] or row["closed"]:
            out.append(row)
    return out


def limits_set_json(result: LimitsSet, tree: Snapshot) -> LimitsSetJson:
    """The answer to setting limits: the limits now, and what a revoke changed."""
    limits = result.limits
    return {
        "rpm": limits.rpm,
        "tpm": limits.tpm,
        "budget": limits.budget,
        "models": list(limits.models),
        "tools": None if limits.tools is None else list(limits.tools),
        "guard": list(limits.guard),
        "revoked": [grant_row(r, tree) for r in result.revoked],
    }
