"""A node as the admin API shows it: its facts and figures, the maps its agent sends
(cards and their health, disks, vitals, InfiniBand ports), its settings report and its
last hour. Part of ``llmgw.wire.admin``; read its docstring for the rules."""

# No `from __future__ import annotations` (the package's docstring says why).
from typing import NotRequired, TypedDict

# ------------------------------------------------------------------------ a node


class DiskJson(TypedDict):
    """A filesystem holding an agent directory (``wire.hardware.Disk``)."""

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
    """A card as the agent last read it (``wire.hardware.GPU``): only the figures read."""

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
    """A card's slow figures (``wire.hardware.GpuHealth``): only those read."""

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
    """A node's sensors (``wire.hardware.NodeVitals``): only those read."""

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
    """One RDMA port as the node reads it (``wire.hardware.IbPort``)."""

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
    # Seconds since each live figure was read, by its field name ("gpus", "vitals"...),
    # and those shown above that are not live (older than 30 s, or unread lately by the
    # agent): the last copy, not the figure of now.
    figure_ages: dict[str, float]
    stale_figures: list[str]
    engines: list[EngineJson] | None
    engine_message: str | None
    engine_progress: dict[str, str]
    engines_installable: list[str]
    cordoned: bool
    draining: bool
    labels: dict[str, str]
    settings: SettingsReportJson | None
    features: list[str]
    # The node's stage in Slurm's set (serving, lending, lent, reclaiming); null when
    # it is not in it (``GET /api/v1/slurm``).
    slurm: str | None


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
