"""What a node is and reads, as the agent stream carries it: its host, disks, cards
(with their health, processes, links and topology), InfiniBand ports and vitals.

Frozen dataclasses like the messages that carry them (``messages.Register`` and
``messages.Heartbeat``): a field whose value is None is absent on the wire, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.wire.codec import merged


@dataclass(frozen=True)
class Disk:
    """One filesystem that holds an agent directory, counted once however many it holds."""

    path: str
    fstype: str
    total: int
    free: int
    shared: bool = False


@dataclass(frozen=True)
class GPU:
    """One NVIDIA card as NVML or nvidia-smi reads it; sizes in bytes."""

    index: int
    uuid: str
    name: str
    memory_total: int | None = None
    memory_used: int | None = None
    utilization: int | None = None
    compute_capability: str | None = None
    driver: str | None = None
    # The figures that move, read with every heartbeat (docs/telemetry.md). Each is
    # read apart: one a driver will not give is absent, and costs nothing else.
    bus_id: str | None = None
    memory_utilization: int | None = None  # percent of time memory was read or written
    temperature: int | None = None  # degrees C
    memory_temperature: int | None = None
    power: float | None = None  # W
    power_limit: float | None = None
    energy: float | None = None  # J since the driver loaded
    sm_clock: int | None = None  # MHz
    memory_clock: int | None = None
    fan: int | None = None  # percent
    pstate: str | None = None  # "P0".."P15"
    # Active throttle reasons by name; [] when read and none is active.
    throttle: list[str] | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_gen_max: int | None = None  # the most the card and its slot allow together
    pcie_width_max: int | None = None
    pcie_gen_device_max: int | None = None  # the card's own most
    pcie_gen_host_max: int | None = None  # the slot's (host's) most, where the driver says
    # Profiling counters (NVML GPM or dcgm-exporter), shares of time 0..1.
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    # Processes holding the card that are not this node's engines.
    processes: list[GpuProcess] | None = None
    mig_mode: bool | None = None
    # A MIG instance is reported as a card of its own: its parent card's UUID, its
    # profile ("3g.40gb") and class ("a100-80g-mig-3g.40gb").
    mig_parent: str | None = None
    mig_profile: str | None = None
    mig_class: str | None = None


# Figures of a whole card that its MIG instances share: each instance carries them (the
# health rules judge the card through them), and /metrics writes them once per card.
CARD_WIDE_FIGURES = (
    "bus_id",
    "temperature",
    "memory_temperature",
    "power",
    "power_limit",
    "energy",
    "sm_clock",
    "memory_clock",
    "fan",
    "pstate",
    "throttle",
    "pcie_gen",
    "pcie_width",
    "pcie_gen_max",
    "pcie_width_max",
    "pcie_gen_device_max",
    "pcie_gen_host_max",
)


@dataclass(frozen=True)
class GpuFigures:
    """What moves of a card, for a heartbeat: ``GPU`` less its steady facts (uuid,
    name, driver, bus id, limits, PCIe maxima, memory total, MIG), which the control
    plane already holds from the last whole card this stream carried. An agent sends
    these only to a control plane that says it takes them (``CARD_FIGURES``) and only
    while every steady fact of every card is as last sent; a figure absent here is
    absent from the card (not read), as in ``GPU``."""

    index: int
    memory_used: int | None = None
    utilization: int | None = None
    memory_utilization: int | None = None
    temperature: int | None = None
    memory_temperature: int | None = None
    power: float | None = None
    energy: float | None = None
    sm_clock: int | None = None
    memory_clock: int | None = None
    fan: int | None = None
    pstate: str | None = None
    throttle: list[str] | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    processes: list[GpuProcess] | None = None


# The control plane's word (``Registered.features``) that it makes whole cards of
# ``Heartbeat.gpu_figures``.
CARD_FIGURES = "heartbeat.gpu_figures"
MOVING_FIGURES = tuple(n for n in GpuFigures.__dataclass_fields__ if n != "index")
STEADY_FACTS = tuple(n for n in GPU.__dataclass_fields__ if n not in MOVING_FIGURES)


def gpu_figures(card: GPU) -> GpuFigures:
    """A card's moving figures (the agent's side)."""
    return GpuFigures(card.index, *(getattr(card, name) for name in MOVING_FIGURES))


def steady_facts(card: GPU) -> tuple[object, ...]:
    """What of a card ``GpuFigures`` leaves out: equal, and figures alone will do."""
    return tuple(getattr(card, name) for name in STEADY_FACTS)


def with_figures(card: GPU, figures: GpuFigures) -> GPU:
    """``card`` with ``figures`` over its moving ones (the control plane's side)."""
    return merged(card, vars(figures))


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a card, as the driver lists it."""

    pid: int
    name: str | None = None
    memory: int | None = None  # bytes


@dataclass(frozen=True, slots=True)
class XidSeen:
    """One XID code seen on a card: how often since the agent started, and when last."""

    code: int
    count: int
    last: float  # epoch seconds
    meaning: str | None = None


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """A card's slow figures: sent every minute or when they change."""

    uuid: str
    index: int
    persistence_mode: bool | None = None
    ecc_mode: bool | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages: int | None = None
    retired_pending: bool | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    xids: list[XidSeen] | None = None
    nvlink_links: int | None = None
    nvlink_active: int | None = None
    # Error counters summed over the card's links ("crc_flit", "replay", ...).
    nvlink_errors: dict[str, int] | None = None
    # The card's place in a multi-node NVLink fabric (GB200 NVL72 and the like), in
    # nvidia-smi's words: state "Not Started", "In Progress", "Completed"; status
    # "Success" or the driver's error; the fabric's ClusterUUID and the card's CliqueId.
    # All absent where the card has no such fabric (N/A). An all-zero ClusterUUID is a
    # single node's own NVSwitch fabric (HGX), not a multi-node one.
    fabric_state: str | None = None
    fabric_status: str | None = None
    fabric_cluster_uuid: str | None = None
    fabric_clique_id: int | None = None
    # nvidia-smi's fabric health by its tag ("summary": "Healthy", "bandwidth": "Full",
    # "route_unhealthy": "False", ...); only the entries given.
    fabric_health: dict[str, str] | None = None


@dataclass(frozen=True)
class IbPort:
    """One port of one RDMA device, as sysfs or ibstat shows it.

    ``state`` is the kernel's word (DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER) and
    ``phys_state`` ibstat's (Sleep, Polling, Disabled, PortConfigurationTraining, LinkUp,
    LinkErrorRecovery, PhyTest), whichever source read them. GUIDs are "0x" and 16 lower
    hex digits; an all-zero GUID (a RoCE port with no link-local GID yet) is None. LIDs
    are None on Ethernet ports, where they mean nothing; on InfiniBand, 0 means the
    subnet manager has not given one yet. ``counters`` holds only what was read: sysfs
    ``counters/`` and ``hw_counters/`` by file name (``counters/`` wins a clash); ibstat
    gives none. ``port_xmit_data``/``port_rcv_data`` there are octets divided by 4.
    """

    device: str
    port: int
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    width_speed: str | None = None
    link_layer: str | None = None
    node_guid: str | None = None
    port_guid: str | None = None
    lid: int | None = None
    sm_lid: int | None = None
    roce_networks: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    # The master subnet manager this port sees (``sminfo``, each minute; IB only).
    master_sm_guid: str | None = None
    master_sm_lid: int | None = None


@dataclass(frozen=True, slots=True)
class NodeVitals:
    """A node's sensors: hwmon temperatures and RAPL power, by sensor name."""

    cpu_temperatures: dict[str, float] | None = None  # degrees C per CPU package
    board_temperatures: dict[str, float] | None = None
    cpu_power: dict[str, float] | None = None  # W per CPU package
    # NVIDIA IMEX (multi-node NVLink memory export): whether nvidia-imex runs, and its
    # channels (/dev/nvidia-caps-imex-channels/channel*). Absent on a node without IMEX.
    imex_running: bool | None = None
    imex_channels: int | None = None


@dataclass(frozen=True)
class CardLinks:
    """One card in ``nvidia-smi topo -m``: its NUMA node and its path to each peer."""

    index: int
    numa_node: int | None = None
    cpu_affinity: str | None = None
    # Peer card index (as text) -> link ("NV18", "PIX", "SYS", ...).
    gpus: dict[str, str] = field(default_factory=dict)
    # NIC device name ("mlx5_0") -> link.
    nics: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuTopology:
    """How a node's cards and NICs are wired: NVLink peers, NUMA nodes, NIC distances."""

    cards: list[CardLinks] = field(default_factory=list)


@dataclass(frozen=True)
class HostFacts:
    """What discovery found on a node. Absent (None) means not read, never zero."""

    hostname: str
    os: str
    arch: str
    kernel: str | None = None
    cpu_model: str | None = None
    cpu_count: int | None = None
    cpu_cores: int | None = None
    cpu_flags: list[str] = field(default_factory=list)
    memory_total: int | None = None
    memory_available: int | None = None
    cpu_percent: float | None = None
    load: list[float] | None = None
    disks: list[Disk] | None = None
    gpus: list[GPU] = field(default_factory=list)
    gpu_source: str | None = None
    warnings: list[str] = field(default_factory=list)
    cuda_version: str | None = None
    # ``nvidia-smi topo -m`` as read after discovery (see discovery.topology).
    topology: GpuTopology | None = None
