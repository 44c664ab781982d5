"""The model explorer's answers: ``GET /api/v1/explore`` (the hub's repositories, each
judged by the planner against the nodes as they are now) and
``GET /api/v1/explore/{org}/{repo}`` (a repository's file sets, each judged).

No ``from __future__ import annotations`` (see ``__init__``)."""

from typing import Literal, TypedDict

ExploreFormat = Literal["gguf", "safetensors", "other"]
ExploreWhere = Literal["cards", "cpu"]


class JudgedCardJson(TypedDict):
    """The largest card of the fleet: where it is, what it is."""

    node: str
    name: str
    memory: int
    # Its compute capability ("9.0"); None where the node did not say.
    capability: str | None


class JudgedRamJson(TypedDict):
    node: str
    memory: int


class JudgedByJson(TypedDict):
    """What the explorer judged by: the nodes as they are now."""

    nodes: int
    largest_card: JudgedCardJson | None
    # The highest compute capability of any card; FP8 is judged only on 8.9 or more.
    best_capability: str | None
    most_ram: JudgedRamJson | None


class BestNodeJson(TypedDict):
    """What the node nearest to holding a file set offers."""

    node: str
    # Free memory of its cards together; None: no card whose memory is known.
    cards_free: int | None
    # Host memory free for replicas; None where the node did not say.
    memory_available: int | None


class ExploreVerdictJson(TypedDict):
    """One file set judged by the planner."""

    fits: bool
    where: ExploreWhere | None
    # Cards a replica takes on the node that fits it with fewest; None on the CPU.
    cards: int | None
    # The node the verdict names: fewest cards, else the fastest CPU.
    node: str | None
    # How many nodes it fits on now.
    nodes: int
    # The planner's CPU rate on the fastest node that holds it on its CPU.
    tokens_per_second: float | None
    # Bytes a replica needs (weights and overhead, on one card or the CPU).
    needs: int | None
    # Where it fits nowhere: the node nearest to it, and why not.
    best: BestNodeJson | None
    reason: str | None


class ExploreRowJson(TypedDict):
    """A repository of the listing, judged at its headline file set."""

    repo: str
    format: ExploreFormat
    parameters: int | None
    pipeline_tag: str | None
    downloads: int | None
    likes: int | None
    trending_score: int | None
    # The set judged: Q4_K_M for GGUF, the dtype (BF16, FP8, 4-bit AWQ) for safetensors.
    set: str | None
    # What `ctl model serve` takes for it; None where the set is not in the repository.
    source: str | None
    bytes: int | None
    verdict: ExploreVerdictJson


class ExploreJson(TypedDict):
    """``GET /api/v1/explore``."""

    hub: str
    query: str | None
    sort: str
    fits_only: bool
    # The hub was asked for GGUF only: no node has a card.
    gguf_only: bool
    judged_by: JudgedByJson
    # Repositories the hub listed (before ``fits``).
    listed: int
    repos: list[ExploreRowJson]


class ExploreSetJson(TypedDict):
    """One file set of a repository: a GGUF quantisation, or its safetensors."""

    name: str
    format: ExploreFormat
    source: str
    files: list[str]
    bytes: int
    verdict: ExploreVerdictJson


class ExploreRepoJson(TypedDict):
    """``GET /api/v1/explore/{org}/{repo}``."""

    hub: str
    repo: str
    parameters: int | None
    pipeline_tag: str | None
    trained_context: int | None
    judged_by: JudgedByJson
    sets: list[ExploreSetJson]
    # Why the repository holds nothing llmgw serves; None when it has sets.
    note: str | None
