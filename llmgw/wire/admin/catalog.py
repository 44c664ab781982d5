"""Replicas, the weights caches, logs, models, ``explain`` and the planner as the admin
API shows them. Part of ``llmgw.wire.admin``; read its docstring for the rules."""

# No `from __future__ import annotations` (the package's docstring says why).
from typing import Literal, NotRequired, TypedDict, final

# ------------------------------------------------------------ replicas and weights


class DownloadJson(TypedDict):
    """A shard's weights being fetched: bytes so far, of ``total`` when the server said."""

    source: str
    done: int
    total: int | None
    file: str | None


class ShardJson(TypedDict):
    """A shard as its node reports it (``fleet.service.shard_rows``)."""

    replica_id: str
    node: str
    state: str  # ShardState: pending, installing, downloading, ..., ready, failed
    reason: str
    engine: str | None
    port: int | None
    pid: int | None
    fingerprint: str | None
    source: str | None
    started_at: float | None
    backend: str | None
    devices: list[str]
    offloaded_layers: int | None
    total_layers: int | None
    cpu_percent: float | None
    rss: int | None
    download: DownloadJson | None
    last_lines: list[str] | None


class ReplicaJson(ShardJson):
    """Each of ``GET /api/v1/replicas``: the shard, the catalog's view of it (its model
    and profile, null for one started by hand; whether it is stale and why) and the
    cards the reconciler gave it."""

    model: str | None
    profile: str | None
    stale: bool
    note: str
    cards: list[str]


class ShardAskedJson(TypedDict):
    """``POST /api/v1/nodes/{id}/shards`` and ``DELETE .../shards/{replica}``."""

    replica_id: str
    node: str


class CachedFileJson(TypedDict):
    path: str
    size: int
    partial: bool


@final
class WeightsJson(TypedDict):
    """A source's directory in a node's weights cache, and whether a shard uses it."""

    name: str
    source: str | None
    path: str
    files: list[CachedFileJson]
    total_bytes: int
    complete: bool
    node: str
    wanted: bool


@final
class NodeFailedJson(TypedDict):
    """A node that could not answer (weights, collect): which, and why."""

    node: str
    error: str


class KeptJson(TypedDict):
    path: str
    reason: str


@final
class CollectedJson(TypedDict):
    """What one node removed of ``POST /api/v1/weights/collect``."""

    node: str
    asked: list[str]
    removed: list[str]
    kept: list[KeptJson]
    freed_bytes: int
    still_listed: list[str]


# Each of ``GET /api/v1/weights``, and of ``POST /api/v1/weights/collect``.
WeightsEntry = WeightsJson | NodeFailedJson
Collected = CollectedJson | NodeFailedJson


@final
class LogEndJson(TypedDict):
    """What ends a followed log: the node's refusal."""

    error: str


# A followed log's answers: each a batch of lines, or its end.
LogBatch = list[str] | LogEndJson


# ----------------------------------------------------------------------- models

ModelState = Literal[
    "parked",
    "stopped",
    "idle",
    "scaled to zero",
    "serving",
    "degraded",
    "starting",
    "unavailable",
]


class ShapeJson(TypedDict, total=False):
    """What a model is (``modelkit.sizing.ModelShape``): every field, null when not
    known, or none at all (``{}``) for a model never inspected and an external one."""

    architecture: str | None
    parameters: int | None
    file_bytes: int
    layers: int | None
    embedding: int | None
    heads: int | None
    kv_heads: int | None
    head_size: int | None
    value_head_size: int | None
    trained_context: int | None
    experts: int | None
    experts_used: int | None
    quantisation: str | None
    kv_cache_type: str
    kv_heads_total: int | None
    expert_bytes: int | None
    name: str | None


class ProfileStatusJson(TypedDict):
    """Where a profile's replicas stand (the reconciler's count and its note)."""

    desired: int
    ready: int
    starting: int
    stale: int
    replacing: int
    note: str


class ProfileJson(TypedDict):
    """A profile of a model (``catalog.model.Profile``), with its fingerprint, where its
    replicas stand (null before the reconciler has seen it) and a CPU profile's reply
    speed on the fastest node that measured its memory (null on cards)."""

    name: str
    engine: str
    args: list[str]
    cards: int
    cpu_cores: float
    replicas: int
    priority: int
    selector: dict[str, str]
    role: str | None
    card_class: str | None
    memory: int
    card_memory: int
    memory_set: bool
    nodes: int
    # Variables set in its engines' environment (``ctl model serve --env``).
    env: dict[str, str]
    fingerprint: str
    status: ProfileStatusJson | None
    cpu_tokens_per_second: float | None


class AdapterJson(TypedDict):
    """A LoRA adapter of a model (and each of ``/api/v1/models/{name}/adapters``)."""

    name: str
    source: str
    scale: float


class EndpointJson(TypedDict):
    """An external provider's key, by name and weight (never the key)."""

    name: str
    weight: float
    state: Literal["ok", "passed over"]
    problem: str


class ExternalJson(TypedDict):
    base_url: str
    upstream_model: str | None
    endpoints: list[EndpointJson]


class ModelJson(TypedDict):
    """``GET /api/v1/models/{name}`` (each of ``/api/v1/models``, and what every change
    of a model answers). A model of the catalog has ``adapters``; an external provider
    has ``external`` instead, and no profiles."""

    name: str
    source: str
    engine: str
    state: ModelState
    replicas: int
    desired: int
    ready: int
    starting: int
    stale: int
    context: int
    slots: int
    max_output: int | None
    on_demand: bool
    kv_events: bool
    stopped: bool
    parked: str | None
    allow_pickle: bool
    # A replica it routes to takes images (a GGUF model's mmproj projector, a vision
    # model's config); whether the gateway fetches image URLs for it.
    vision: bool
    allow_image_urls: bool
    weight_bytes: int | None
    shape: ShapeJson
    profiles: list[ProfileJson]
    adapters: NotRequired[list[AdapterJson]]
    external: NotRequired[ExternalJson]
    # The serve job that brings it up (``/api/v1/jobs/{id}``): in the answer to a serve.
    job: NotRequired[str]


class ModelRemovedJson(TypedDict):
    """``DELETE /api/v1/models/{name}``."""

    name: str
    removed: bool
    with_files: bool


class DemandJson(TypedDict):
    """``POST /api/v1/models/{name}/demand``."""

    name: str
    on_demand: bool


class VerdictJson(TypedDict):
    """One node's verdict for a replica (``catalog.placement.Verdict``)."""

    node: str
    ok: bool
    reasons: list[str]
    notes: list[str]
    score: int | None
    rank: int | None
    holds_weights: bool
    cards: list[str]


class SpanJson(TypedDict):
    """One set of nodes a replica spanning nodes could go to (``catalog.spanning``)."""

    kind: str  # nvlink, fabric, ethernet
    id: str | None
    ok: bool
    fitting: list[str]
    needed: int
    chosen: list[str]
    leaf_sets: int | None
    notes: list[str]
    reason: str


class ExplainJson(TypedDict):
    """Each of ``GET /api/v1/models/{name}/explain``: a profile, what a replica of it
    asks, and every node's verdict; ``spans`` only for a replica spanning nodes."""

    nodes: int
    spans: list[SpanJson] | None
    model: str
    profile: str
    engine: str
    desired: int
    memory: int
    disk: int
    cpu_cores: float
    cards: int
    card_memory: int
    avoid: list[str]
    running_on: list[str]
    note: str
    verdicts: list[VerdictJson]


class MemoryJson(TypedDict):
    """The memory a replica needs, in bytes, in all and per card."""

    weights: int
    kv_cache: int
    overhead: int
    total: int
    cards: int
    split: str
    per_card: list[int]


class PlanCardJson(TypedDict):
    uuid: str
    index: int
    name: str
    free: int
    total: int | None


class PlanGpuJson(TypedDict):
    """A node's cards against the plan: the cards it would take, or why not."""

    fits: bool
    cards: list[PlanCardJson]
    needed_per_card: list[int]
    reason: str | None


class PlanCpuJson(TypedDict):
    """A node's CPU against the plan, with the reply speed its memory allows."""

    fits: bool
    needed: int
    available: int | None
    reason: str | None
    memory_read_gbs: float | None
    memory_read_one_core_gbs: float | None
    tokens_per_second: float | None
    warning: str | None
    note: str | None


class PlanNodeJson(TypedDict):
    node: str
    state: str
    fits: bool
    where: Literal["cards", "cpu"] | None
    reasons: list[str]
    max_context: int
    gpu: PlanGpuJson | None
    cpu: PlanCpuJson


class PlanJson(TypedDict):
    """``GET /api/v1/plan``: what a source needs and each node's verdict."""

    source: str
    format: str
    files: list[str]
    weight_bytes: int
    shape: ShapeJson
    kv_bytes_per_token: float | None
    engine: str
    split: str
    slots: int
    cards: int | None
    cpu_cores: int | None
    context: int
    context_basis: str  # asked, trained, default, cut to fit
    trained_context: int | None
    memory: MemoryJson
    memory_cpu: MemoryJson
    fits_on: list[str]  # for a replica spanning nodes: the set it would go to
    nodes: list[PlanNodeJson]
    warnings: list[str]
    replica_nodes: int  # nodes one replica spans; each node's verdict is on its share
    spans: list[SpanJson] | None  # the sets of nodes it could go to; None for one node
