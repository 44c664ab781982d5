"""The model explorer: the hub's trending or searched repositories, each judged by the
planner against the nodes as they are now (``GET /api/v1/explore``, ``ctl models
explore``, the Explore page), and one repository's file sets (``GET
/api/v1/explore/{org}/{repo}``).

``ExploreService`` asks the hub (``modelkit/hublist.py``) through the cluster's
``hf_endpoint`` (``ctl config set hf_endpoint``; else ``HF_ENDPOINT``, else
huggingface.co) with the control plane's ``HF_TOKEN``, a hundred repositories at a time:
safetensors and GGUF where some node has a card, GGUF only where none has. What the hub
answered is kept for a few minutes (``ttl``) and for a bounded number of queries, so a
page reloaded or a list filtered again does not ask it again; the verdicts are made
fresh at every call, since the nodes change. Judging is ``explorejudge.py``'s.

A hub that does not answer within ``timeout`` seconds, or answers something that is not
its API, is a ``Refusal`` with status 424 (the answer depends on the hub, and the hub
failed: no 5xx, which the admin API keeps for its own faults), code ``hub_timeout`` or
``hub_error``, saying which and what to do; the pages render it in place of the list.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from llmgw.modelkit.hub import HubError, HubFile, HubNotFound
from llmgw.modelkit.hublist import MAX_LIMIT, HubListing, HubRepo, is_repo_id
from llmgw.server.catalog.explorejudge import JudgeFleet, judge, judge_fleet, not_fitting
from llmgw.server.catalog.exploresets import (
    NotJudged,
    file_sets,
    headline,
    parameters_of,
    repo_format,
)
from llmgw.server.catalog.room import Room
from llmgw.server.catalog.scheduler import NodeCapacity
from llmgw.server.fleet.agentsettings import AgentSettings
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
from llmgw.server.requests import ExploreQuery
from llmgw.wire.admin.explore import (
    ExploreJson,
    ExploreRepoJson,
    ExploreRowJson,
    ExploreSetJson,
)

# What the hub answered is kept this long, for at most this many queries.
TTL = 300.0
MAX_KEPT = 64
# The hub must answer within this; a page waits no longer.
TIMEOUT = 20.0
# Failed Dependency: the hub, which the answer depends on, stalled or answered garbage.
HUB_FAILED = 424

T = TypeVar("T")


class _Kept:
    """Answers kept ``ttl`` seconds, the ``size`` most recent."""

    def __init__(self, ttl: float, size: int, clock: Callable[[], float]) -> None:
        self.ttl, self.size, self.clock = ttl, size, clock
        self._items: OrderedDict[object, tuple[float, object]] = OrderedDict()

    def get(self, key: object) -> object | None:
        found = self._items.get(key)
        if found is None or self.clock() - found[0] > self.ttl:
            self._items.pop(key, None)
            return None
        return found[1]

    def put(self, key: object, value: object) -> None:
        self._items[key] = (self.clock(), value)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


class ExploreService:
    def __init__(
        self,
        nodes: Callable[[], Mapping[str, NodeView]],
        capacities: Callable[[], Sequence[NodeCapacity]],
        endpoint: Callable[[], str | None],
        *,
        token: str | None = None,
        environ: Mapping[str, str] | None = None,
        ttl: float = TTL,
        timeout: float = TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``nodes``: the registry's views; ``capacities``: the nodes as placement sees
        them now (``Room.fleet``); ``endpoint``: the cluster's hf_endpoint as set now
        (None: ``HF_ENDPOINT`` or huggingface.co); ``token``: else ``HF_TOKEN``."""
        self._nodes = nodes
        self._capacities = capacities
        self._endpoint = endpoint
        self._token = token
        self._environ = environ
        self.timeout = timeout
        self._kept = _Kept(ttl, MAX_KEPT, clock)

    def _hub(self) -> HubListing:
        try:
            return HubListing(
                self._endpoint(),
                self._token,
                environ=self._environ,
                connect_timeout=self.timeout,
                read_timeout=self.timeout,
            )
        except HubError as exc:
            raise Refusal(
                HUB_FAILED, "hub_error", f"{exc}; set it with `ctl config set hf_endpoint URL`"
            ) from None

    async def _asked(
        self, key: tuple[object, ...], fetch: Callable[[HubListing], Awaitable[T]]
    ) -> T:
        """What ``fetch`` asks of the hub, kept by the hub's address and ``key``."""
        hub = self._hub()
        where = str(hub.endpoint)
        kept = self._kept.get((where, *key))
        if kept is not None:
            return kept  # type: ignore[return-value]
        try:
            async with hub, asyncio.timeout(self.timeout):
                found = await fetch(hub)
        except TimeoutError:
            raise Refusal(
                HUB_FAILED,
                "hub_timeout",
                f"the hub at {where} did not answer within {self.timeout:g} s; try again, or "
                "point the cluster at a hub this control plane reaches "
                "(`ctl config set hf_endpoint URL`)",
            ) from None
        except HubNotFound as exc:
            raise Refusal(404, "not_found", str(exc)) from None
        except HubError as exc:
            raise Refusal(HUB_FAILED, "hub_error", f"the hub at {where}: {exc}") from None
        self._kept.put((where, *key), found)
        return found

    def fleet(self) -> JudgeFleet:
        return judge_fleet(self._nodes(), self._capacities())

    def hub_address(self) -> str:
        return str(self._hub().endpoint)

    async def explore(self, ask: ExploreQuery) -> ExploreJson:
        """The hub's repositories for ``ask``, each judged at its headline set."""
        fleet = self.fleet()
        gguf_only = not fleet.has_cards
        query = (ask.q or "").strip() or None
        limit = min(ask.limit, MAX_LIMIT)
        key = ("list", query, ask.sort, gguf_only, limit)

        async def fetch(hub: HubListing) -> list[HubRepo]:
            return await hub.list_models(query, sort=ask.sort, limit=limit, gguf_only=gguf_only)

        repos: list[HubRepo] = await self._asked(key, fetch)
        rows = [self._row(repo, fleet) for repo in repos]
        return {
            "hub": self.hub_address(),
            "query": query,
            "sort": ask.sort,
            "fits_only": ask.fits,
            "gguf_only": gguf_only,
            "judged_by": fleet.judged_by,
            "listed": len(rows),
            "repos": [r for r in rows if r["verdict"]["fits"]] if ask.fits else rows,
        }

    def _row(self, repo: HubRepo, fleet: JudgeFleet) -> ExploreRowJson:
        row: ExploreRowJson = {
            "repo": repo.id,
            "format": repo_format(repo),
            "parameters": parameters_of(repo),
            "pipeline_tag": repo.pipeline_tag,
            "downloads": repo.downloads,
            "likes": repo.likes,
            "trending_score": repo.trending_score,
            "set": None,
            "source": None,
            "bytes": None,
            "verdict": not_fitting(""),
        }
        try:
            found = headline(repo)
        except NotJudged as exc:
            return {**row, "verdict": not_fitting(str(exc))}
        verdict = judge(found, fleet)
        return {
            **row,
            "set": found.name,
            "source": found.source,
            "bytes": found.bytes,
            "verdict": verdict,
        }

    async def repository(self, repo: str) -> ExploreRepoJson:
        """A repository's file sets, each judged by the planner."""
        if not is_repo_id(repo):
            raise Refusal(
                400,
                "bad_request",
                f"{repo!r} is not a repository of the hub: give it as ORG/REPO (letters, "
                "digits, '-', '_', '.')",
            )
        fleet = self.fleet()

        async def fetch(hub: HubListing) -> tuple[HubRepo, Sequence[HubFile]]:
            return await hub.repository(repo)

        info, files = await self._asked(("repo", repo), fetch)
        note: str | None = None
        sets: list[ExploreSetJson] = []
        try:
            candidates = file_sets(info, files)
        except NotJudged as exc:
            candidates, note = [], str(exc)
        for c in candidates:
            assert c.source is not None
            sets.append(
                {
                    "name": c.name,
                    "format": c.format,
                    "source": c.source,
                    "files": list(c.files),
                    "bytes": c.bytes,
                    "verdict": judge(c, fleet),
                }
            )
        if not candidates and note is None:
            note = "the repository holds no GGUF or safetensors weights llmgw serves"
        return {
            "hub": self.hub_address(),
            "repo": info.id,
            "parameters": parameters_of(info),
            "pipeline_tag": info.pipeline_tag,
            "trained_context": info.gguf.context_length if info.gguf else None,
            "judged_by": fleet.judged_by,
            "sets": sets,
            "note": note,
        }


def explore_service(registry: NodeRegistry, room: Room, settings: AgentSettings) -> ExploreService:
    """The explorer over the cluster's ``hf_endpoint`` (``ctl config``) as set at each call."""

    def endpoint() -> str | None:
        found = settings.get("hf_endpoint")
        return found if isinstance(found, str) and found else None

    return ExploreService(lambda: registry.nodes, lambda: room.fleet(at_rest=False), endpoint)
