"""Keys, usage and energy, the cluster's status and control planes, the agents'
settings and engines, the fabrics and NVLink domains as the admin API shows them. Part
of ``llmgw.wire.admin``; read its docstring for the rules."""

# No `from __future__ import annotations` (the package's docstring says why).
from typing import Literal, NotRequired, TypedDict

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
    # Whose: a project's (in an organisation), or a person's in an organisation.
    org_id: str | None
    project_id: str | None
    person_id: str | None
    # MCP tools granted to the key itself (None: says nothing; []: closed) and its own
    # guard policies (its levels' bind it too).
    tools: list[str] | None
    guard: list[str]


class NewKeyJson(KeyJson):
    """``POST /api/v1/keys``: the key, this once."""

    key: str


class RotatedTokenJson(TypedDict):
    """``POST /api/v1/admin-token/rotate``: the new admin token, this once, and the data
    dir file of the leader's machine it was also written to (null: none was)."""

    token: str
    token_file: str | None


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
    # Whose the key is (absent for a key since removed from the store).
    org_id: str | None
    project_id: str | None
    person_id: str | None


class UsageSumJson(TypedDict):
    """Each of ``GET /api/v1/usage?by=...``: the period's use summed per organisation,
    team, project, key or person (``id`` None: keys of no such owner)."""

    by: str
    id: str | None
    name: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int


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
    version: str | None  # the llmgw it runs; null when it does not answer now
    joined_at: float
    removed_at: float | None
    this: bool


class ServerVersionJson(TypedDict):
    """A control plane in ``GET /api/v1/versions``."""

    name: str
    role: str | None  # leader, standby; null when it does not answer now
    version: str | None  # null when it does not answer now
    answers: bool
    this: bool


class NodeVersionJson(TypedDict):
    """An agent in ``GET /api/v1/versions``."""

    id: str
    version: str | None  # null until it has registered
    connected: bool


class VersionsJson(TypedDict):
    """``GET /api/v1/versions``: the llmgw every process of the cluster runs, as the
    control plane asked knows it (``llmgw version --cluster``)."""

    version: str  # the control plane that answered
    servers: list[ServerVersionJson]
    nodes: list[NodeVersionJson]


class ReleaseJson(TypedDict):
    """``GET /api/v1/release``: the llmgw release this cluster installs on a new machine
    (``node add``, ``server add``) and where it comes from (GitHub's release layout)."""

    version: str
    source: str


class ServerRemovedJson(TypedDict):
    """``DELETE /api/v1/servers/{name}``: False when it already was."""

    name: str
    removed: bool


# --------------------------------------------------- the agents' settings, engines


class SettingsJson(TypedDict):
    """``GET /api/v1/config`` (and ``POST``): the default layer, each node's, and the
    version they make. The layers hold what agent.yaml would; ``cluster`` the control
    plane's own keys that are set (``metrics.fleet_detail``)."""

    default: dict[str, object]
    nodes: dict[str, dict[str, object]]
    cluster: dict[str, str]
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
    packages: dict[str, list[str]]  # package manager (apt, dnf) -> OS package names
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


class FirewallJson(TypedDict):
    """``GET /api/v1/firewall`` (and ``POST``): llmgw's firewall on every node, and
    whether server.yaml or the API (``ctl``) set each part."""

    version: int
    enabled: bool
    networks: list[str]
    source: dict[str, Literal["server.yaml", "ctl"]]


class FirewallChangeJson(TypedDict):
    """Each of ``GET /api/v1/firewall/history``, newest first."""

    at: float
    actor: str
    action: str
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
