"""The admin API's answers as typed shapes: what ``/api/v1`` says of nodes, replicas,
models, keys, usage and the rest, as the control plane writes it and as ``ctl`` and the
console read it.

The server's builders return these, the admin client hands them out, and the tables and
screens read them, so the JSON the roles share is one checked contract; a test asks a
real admin app for each answer and compares its keys with the keys declared here.

Each shape is a ``TypedDict``: every key is always there unless marked ``NotRequired``
(a key really sometimes absent: a figure the agent did not read, the adapters of an
external provider). ``None`` is a value, not absence: ``"cpu_percent": null`` is a figure
not read yet, and the key is still there. Maps the agents send (a card, a disk, an IB
port) leave their unread figures out, as ``wire.messages`` does; those keys are
``NotRequired``.

No ``from __future__ import annotations`` here, on purpose: on Python 3.11 a TypedDict
whose annotations are strings counts every key as required in ``__required_keys__``, and
the test (and any reader at run time) relies on those being right.
"""

from typing import Literal, NotRequired, TypedDict, final

# ------------------------------------------------------------------------ a node


class DiskJson(TypedDict):
    """A filesystem holding an agent directory (``wire.messages.Disk``)."""

    path: str
    fstype: str
    total: int
    free: int
    shared: bool


class GpuProcessJson(TypedDict):
    pid: int
    name: NotRequired[str]
    memory: NotRequired[int]


class CardJson(TypedDict):
    """A card as the agent last read it (``wire.messages.GPU``): only the figures read."""

    index: int
    uuid: str
    name: str
    memory_total: NotRequired[int]
    memory_used: NotRequired[int]
    utilization: NotRequired[int]
    compute_capability: NotRequired[str]
    driver: NotRequired[str]
    bus_id: NotRequired[str]
    memory_utilization: NotRequired[int]
    temperature: NotRequired[int]
    memory_temperature: NotRequired[int]
    power: NotRequired[float]
    power_limit: NotRequired[float]
    energy: NotRequired[float]
    sm_clock: NotRequired[int]
    memory_clock: NotRequired[int]
    fan: NotRequired[int]
    pstate: NotRequired[str]
    throttle: NotRequired[list[str]]
    pcie_gen: NotRequired[int]
    pcie_width: NotRequired[int]
    pcie_gen_max: NotRequired[int]
    pcie_width_max: NotRequired[int]
    pcie_gen_device_max: NotRequired[int]
    pcie_gen_host_max: NotRequired[int]
    sm_active: NotRequired[float]
    sm_occupancy: NotRequired[float]
    tensor_active: NotRequired[float]
    dram_active: NotRequired[float]
    processes: NotRequired[list[GpuProcessJson]]
    mig_mode: NotRequired[bool]
    mig_parent: NotRequired[str]
    mig_profile: NotRequired[str]
    mig_class: NotRequired[str]


class XidJson(TypedDict):
    code: int
    count: int
    last: float
    meaning: NotRequired[str]


class CardHealthJson(TypedDict):
    """A card's slow figures (``wire.messages.GpuHealth``): only those read."""

    uuid: str
    index: int
    persistence_mode: NotRequired[bool]
    ecc_mode: NotRequired[bool]
    ecc_volatile_corrected: NotRequired[int]
    ecc_volatile_uncorrected: NotRequired[int]
    ecc_aggregate_corrected: NotRequired[int]
    ecc_aggregate_uncorrected: NotRequired[int]
    retired_pages: NotRequired[int]
    retired_pending: NotRequired[bool]
    remapped_correctable: NotRequired[int]
    remapped_uncorrectable: NotRequired[int]
    remap_pending: NotRequired[bool]
    remap_failed: NotRequired[bool]
    xids: NotRequired[list[XidJson]]
    nvlink_links: NotRequired[int]
    nvlink_active: NotRequired[int]
    nvlink_errors: NotRequired[dict[str, int]]
    fabric_state: NotRequired[str]
    fabric_status: NotRequired[str]
    fabric_cluster_uuid: NotRequired[str]
    fabric_clique_id: NotRequired[int]
    fabric_health: NotRequired[dict[str, str]]


class VitalsJson(TypedDict):
    """A node's sensors (``wire.messages.NodeVitals``): only those read."""

    cpu_temperatures: NotRequired[dict[str, float]]
    board_temperatures: NotRequired[dict[str, float]]
    cpu_power: NotRequired[dict[str, float]]
    imex_running: NotRequired[bool]
    imex_channels: NotRequired[int]


class CardLinksJson(TypedDict):
    """One card in ``nvidia-smi topo -m`` (``wire.messages.CardLinks``)."""

    index: int
    numa_node: NotRequired[int]
    cpu_affinity: NotRequired[str]
    gpus: dict[str, str]
    nics: dict[str, str]


class TopologyJson(TypedDict):
    """How a node's cards and NICs are wired (``wire.messages.GpuTopology``)."""

    cards: list[CardLinksJson]


class IbPortJson(TypedDict):
    """One RDMA port as the node reads it (``wire.messages.IbPort``)."""

    device: str
    port: int
    state: NotRequired[str]
    phys_state: NotRequired[str]
    rate_gbps: NotRequired[float]
    width_speed: NotRequired[str]
    link_layer: NotRequired[str]
    node_guid: NotRequired[str]
    port_guid: NotRequired[str]
    lid: NotRequired[int]
    sm_lid: NotRequired[int]
    roce_networks: list[str]
    counters: dict[str, int]
    master_sm_guid: NotRequired[str]
    master_sm_lid: NotRequired[int]


class EngineJson(TypedDict):
    """An engine a node has (``wire.messages.EngineInfo``)."""

    name: str
    path: str
    version: NotRequired[str]
    build: NotRequired[str]
    origin: str


class SettingJson(TypedDict):
    """One setting an agent runs with, and where it came from."""

    value: object
    source: str  # default, cluster, node, file


class SettingsReportJson(TypedDict):
    """What an agent says it runs with: every setting, the cluster's version it took."""

    version: int
    values: dict[str, SettingJson]
    problem: str | None


class NodeJson(TypedDict):
    """``GET /api/v1/nodes/{id}`` (and each of ``/api/v1/nodes``): a node, flat. A
    figure the agent has not reported is null; ``engines`` is null until it looked."""

    id: str
    state: str  # NodeState: Ready, NotReady
    reason: str
    connected: bool
    address: str | None
    version: str
    last_seen: float | None
    hostname: str | None
    os: str | None
    arch: str | None
    kernel: str | None
    cpu_model: str | None
    cpu_count: int | None
    cpu_cores: int | None
    cpu_flags: list[str]
    cpu_percent: float | None
    load: list[float] | None
    memory_total: int | None
    memory_available: int | None
    disks: list[DiskJson] | None
    gpus: list[CardJson]
    gpu_source: str | None
    cuda_version: str | None
    warnings: list[str]
    health_warnings: list[str]
    gpu_health: list[CardHealthJson] | None
    vitals: VitalsJson | None
    topology: TopologyJson | None
    ib_ports: list[IbPortJson] | None
    memory_read_gbs: float | None
    memory_read_one_core_gbs: float | None
    engines: list[EngineJson] | None
    engine_message: str | None
    engine_progress: dict[str, str]
    engines_installable: list[str]
    cordoned: bool
    draining: bool
    labels: dict[str, str]
    settings: SettingsReportJson | None
    features: list[str]


class CardHistoryJson(TypedDict):
    """One card's figures in a node's history, one value per step (null: not read)."""

    uuid: str
    index: int | None
    name: str
    utilization: list[int | None]
    sm_active: list[float | None]
    memory_used: list[int | None]
    memory_total: list[int | None]
    power: list[float | None]
    temperature: list[int | None]


class HistoryJson(TypedDict):
    """``GET /api/v1/nodes/{id}/history``: columnar, oldest step first."""

    node: str
    step_seconds: float
    t: list[float]
    cpu_percent: list[float | None]
    memory_used: list[int | None]
    memory_total: list[int | None]
    gpus: list[CardHistoryJson]


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
    weight_bytes: int | None
    shape: ShapeJson
    profiles: list[ProfileJson]
    adapters: NotRequired[list[AdapterJson]]
    external: NotRequired[ExternalJson]


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
    fits_on: list[str]
    nodes: list[PlanNodeJson]
    warnings: list[str]


# ------------------------------------------------------------------ keys and usage

KeyState = Literal["active", "revoked", "expired"]


class KeyJson(TypedDict):
    """A gateway key as the admin API shows it: never the key itself."""

    id: str
    name: str
    state: KeyState
    models: list[str]
    rpm: int | None
    tpm: int | None
    budget: int | None
    priority: int
    expires_at: float | None
    created_at: float
    revoked_at: float | None


class NewKeyJson(KeyJson):
    """``POST /api/v1/keys``: the key, this once."""

    key: str


class UsageJson(TypedDict):
    """Each of ``GET /api/v1/usage``: a day's use of one model's replica by one key."""

    day: str
    key_id: str
    model: str
    replica: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    key_name: str | None


class EnergyJson(TypedDict):
    """Each of ``GET /api/v1/energy``: a replica's card energy over its tokens."""

    model: str
    replica: str
    joules: float
    tokens: int
    joules_per_token: float


class ServingJson(TypedDict):
    """``GET`` and ``POST /api/v1/serving``: whether ``/v1`` is stopped."""

    stopped: bool


# ---------------------------------------------------------------------- the cluster


class NodeCountsJson(TypedDict):
    total: int
    ready: int
    not_ready: int


class ControlPlaneCountsJson(TypedDict):
    total: int
    answering: int


class HandlingJson(TypedDict):
    """Milliseconds to handle a heartbeat; null before any."""

    p50_ms: float | None
    p99_ms: float | None


class ListenerJson(TypedDict):
    """An HTTP listener's connections; none of them before it has started."""

    open: NotRequired[int]
    cap: NotRequired[int]
    refused: NotRequired[int]
    evicted: NotRequired[int]
    header_timeouts: NotRequired[int]


class StatusJson(TypedDict):
    """``GET /api/v1/status``: this control plane, its nodes and its store."""

    version: str
    uptime_seconds: float
    leader: bool
    name: str
    role: str
    term: int
    control_planes: ControlPlaneCountsJson
    serving: Literal["serving", "stopped"]
    store: str
    store_writable: bool
    store_problem: str | None
    listen: str
    agent_port: int
    advertise: list[str]
    ca_fingerprint: str
    nodes: NodeCountsJson
    agent_streams: int
    heartbeats: int
    heartbeat_handling: HandlingJson
    reconcile_passes: int
    connections: dict[str, ListenerJson]
    usage_pending: int


class VersionJson(TypedDict):
    version: str


class TokenJson(TypedDict):
    """``POST /api/v1/tokens`` and ``/api/v1/servers/tokens``: a join token."""

    token: str
    id: str
    expires_at: float
    addresses: list[str]


class ServerJson(TypedDict):
    """Each of ``GET /api/v1/servers``: a control plane as this one knows it; ``role``
    null when it does not answer now."""

    name: str
    role: str | None
    term: int | None
    answers: bool
    api_address: str
    agent_address: str
    peer_address: str
    last_contact: float | None
    lag_seconds: float | None
    problem: str | None
    joined_at: float
    removed_at: float | None
    this: bool


class ServerRemovedJson(TypedDict):
    """``DELETE /api/v1/servers/{name}``: False when it already was."""

    name: str
    removed: bool


# --------------------------------------------------- the agents' settings, engines


class SettingsJson(TypedDict):
    """``GET /api/v1/config`` (and ``POST``): the default layer, each node's, and the
    version they make. The layers hold what agent.yaml would."""

    default: dict[str, object]
    nodes: dict[str, dict[str, object]]
    version: int


class SettingValueJson(TypedDict):
    """``GET /api/v1/config?key=KEY[&node=NODE]``: a key's value in a layer."""

    key: str
    node: str | None
    value: object


class NodeSettingsJson(TypedDict):
    """``GET /api/v1/config?node=NODE``: what the cluster gives that node."""

    node: str
    settings: dict[str, object]


class SettingsChangeJson(TypedDict):
    """Each of ``GET /api/v1/config/history``, newest first."""

    at: float
    actor: str
    action: str
    layer: str
    change: str


class WantedEngineJson(TypedDict):
    engine: str
    version: str
    sha256: dict[str, str]
    index_url: str | None
    source: str


class EngineStandingJson(TypedDict):
    """A node's standing with an engine the fleet names."""

    node: str
    engine: str
    wanted: str
    versions: list[str]
    build: str
    state: str  # ready, installing, failed, configured, off, missing, unknown
    message: str | None


class EnginesJson(TypedDict):
    """``GET /api/v1/engines``: the engines the fleet runs, each node's build and its
    standing with each."""

    version: int
    engines: list[WantedEngineJson]
    builds: dict[str, str]
    nodes: list[EngineStandingJson]


class EngineChangeJson(TypedDict):
    """Each of ``GET /api/v1/engines/history``, newest first."""

    at: float
    actor: str
    action: str
    target: str
    change: str


# -------------------------------------------------------------- fabrics and NVLink


class PortJson(TypedDict):
    """An InfiniBand or RoCE port in the fabrics' answer."""

    node: str
    device: str
    port: int
    state: str | None
    phys_state: str | None
    rate_gbps: float | None
    width_speed: str | None
    port_guid: str | None
    master_sm_guid: str | None


class FabricJson(TypedDict):
    """An InfiniBand fabric: the ports that see one master subnet manager (or did
    lately), named by the lowest SM GUID seen in it."""

    id: str
    master_sm: str | None
    masters: list[str]
    subnet_managers: list[str]
    nodes: list[str]
    ports: list[PortJson]
    ports_by_state: dict[str, int]
    active_rates_gbps: dict[str, int]
    problems: list[str]
    topology_read_at: float | None
    subnet_manager_records: list[dict[str, object]] | None


class RoceNetworkJson(TypedDict):
    network: str
    nodes: list[str]
    ports: list[PortJson]


class FabricsJson(TypedDict):
    """``GET /api/v1/fabrics``."""

    fabrics: list[FabricJson]
    roce_networks: list[RoceNetworkJson]
    unassigned_ports: list[PortJson]


class MapNodeJson(TypedDict):
    """A switch, an adapter (ca) or a router in a fabric's map, by its GUID."""

    guid: str
    kind: Literal["switch", "ca", "router"]
    description: str
    ports: int | None  # null: seen only as the far end of a cable
    lid: int | None
    host: str | None
    adapter: str | None
    devid: str | None
    system: str | None


class CableJson(TypedDict):
    """A cable between two ends, each ``[guid, port]``; ``degraded`` says why it is."""

    a: tuple[str, int]
    b: tuple[str, int]
    width: str
    speed: str
    rate_gbps: float
    degraded: str | None


class RailMissJson(TypedDict):
    """A host adapter cabled to a leaf that carries another rail."""

    host: str
    adapter: str
    leaf: str
    leaf_port: int
    leaf_rail: str
    expected: list[str]


class FabricMapJson(TypedDict):
    """``GET /api/v1/fabrics/{id}/topology``: a fabric's wiring as a node last read it."""

    fabric: str
    read_at: float
    age_seconds: float
    read_by: str
    nodes: list[MapNodeJson]
    tiers: dict[str, Literal["leaf", "spine", "core"]]
    links: list[CableJson]
    rail_misses: list[RailMissJson]
    problems: list[str]
    error: str | None


class RailJson(TypedDict):
    """One rail of a bandwidth test: an adapter of each node, the link's rate and what
    was measured, graded against it."""

    rail: int
    a_device: str
    b_device: str
    rate_gbps: float | None
    gbps: float | None
    ratio: float | None
    grade: str  # good, fair, poor, failed
    error: str | None


class FabricTestJson(TypedDict):
    """``POST /api/v1/fabric-tests``."""

    a: str
    b: str
    seconds: int
    rails: list[RailJson]


class NvlinkCardJson(TypedDict):
    """A card of an NVLink domain; ``joined`` null when its fabric was not read."""

    index: int | None
    uuid: str | None
    state: str | None
    status: str | None
    joined: bool | None
    health: dict[str, str] | None


class UnjoinedCardJson(NvlinkCardJson):
    node: str


class ImexJson(TypedDict):
    running: bool | None
    channels: int | None


class TrayJson(TypedDict):
    """A node of an NVLink domain."""

    node: str
    connected: bool
    cards: list[NvlinkCardJson]
    imex: ImexJson


class DomainJson(TypedDict):
    """An NVLink domain: the cards with one ClusterUUID and CliqueId, as trays."""

    id: str
    cluster_uuid: str
    clique_id: int
    nodes: int
    cards: int
    joined: int
    trays: list[TrayJson]
    problems: list[str]


class NvlinkJson(TypedDict):
    """``GET /api/v1/nvlink``."""

    domains: list[DomainJson]
    unjoined: list[UnjoinedCardJson]
