"""Message dataclasses of the agent stream and their map form.

Each message is a frozen dataclass with a class-level ``TYPE``; on the wire it is a map
``{"t": TYPE, ...fields}``. A field whose value is None is left out, so an unknown figure
travels as absent, never as 0. Decoding ignores unknown fields and unknown types, so a
newer peer can talk to an older one; a known field of the wrong type is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from llmgw.wire.codec import MessageError, decoder, from_map, to_map
from llmgw.wire.framing import encode_frame
from llmgw.wire.hardware import (
    GPU,
    Disk,
    GpuFigures,
    GpuHealth,
    HostFacts,
    IbPort,
    NodeVitals,
)
from llmgw.wire.states import ShardState


@dataclass(frozen=True)
class EngineInfo:
    """An engine a node can run: installed and seen to run, or named to it on purpose."""

    name: str
    path: str
    version: str | None = None
    build: str | None = None  # "cpu", "cuda", ...
    origin: str = "installed"  # "installed" by the agent, or "configured" by its operator


@dataclass(frozen=True)
class GroupSpec:
    """A shard's place in one replica spread over several nodes.

    Rank 0, the leader, serves the replica's HTTP; ranks 1.. are its workers. For
    llama.cpp a worker is an RPC server the leader reaches at ``workers``; vLLM and
    SGLang meet at ``leader:rendezvous_port``. ``peers`` are the member nodes'
    addresses: the only ones, beside the control planes, let in to the shard's ports.
    """

    rank: int
    size: int
    leader: str
    rendezvous_port: int | None = None
    workers: list[str] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)
    # Where a worker listens: its node's address as the other members reach it.
    bind: str | None = None
    # Every card of the replica is in one NVLink domain (NCCL_MNNVL_ENABLE=1).
    nvlink: bool = False


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter a replica loads beside its weights, unapplied: the gateway applies
    it per request (llama.cpp at ``scale``). ``path`` is the agent's alone: where it
    fetched ``source`` to; never sent by the control plane nor reported back."""

    name: str
    source: str
    scale: float = 1.0
    path: str | None = None


@dataclass(frozen=True)
class ShardSpec:
    """Everything a node needs to run one replica's engine; kept on disk for adoption."""

    replica_id: str
    engine: str
    source: str
    port: int
    key: str
    fingerprint: str
    model: str | None = None
    args: list[str] = field(default_factory=list)
    cards: list[str] = field(default_factory=list)
    cpu_cores: int | None = None
    allow_pickle: bool = False
    # The engine version the cluster wants it run with (``engines:``); None leaves the
    # choice to the node (a shard started directly, or a control plane naming none).
    engine_version: str | None = None
    # Set for one of the shards of a replica spanning nodes; None for a whole replica.
    group: GroupSpec | None = None
    # vLLM publishes its KV-cache events to the agent, which sends them up (KvBlocks).
    kv_events: bool = False
    # LoRA adapters, in the engine's order (llama.cpp's adapter ids are positions in it).
    adapters: list[AdapterSpec] = field(default_factory=list)
    # The sha256 of the source's files (path in its repository -> hex) that the control
    # plane vouches for (its mirror's, offline): a fetched file that differs is refused,
    # whatever the hub it was fetched from lists.
    sha256: dict[str, str] = field(default_factory=dict)
    # The hub endpoint to fetch the source's files from (a live mirror of ``mirror.api``
    # or ``mirror.peers``); None: the node's own (``hf_endpoint``).
    hub: str | None = None
    # Variables the profile sets in the engine's environment (``ctl model serve --env``),
    # checked again by the agent (``modelkit.engineenv``).
    env: dict[str, str] = field(default_factory=dict)
    # Set by the node, not the control plane: the multimodal projector it found with a
    # GGUF model (llama.cpp's --mmproj), kept so an adopted engine is known by it.
    projector: str | None = None


@dataclass(frozen=True)
class Compute:
    """What the engine said it runs on, read from its start-up output."""

    backend: str | None = None
    devices: list[str] = field(default_factory=list)
    offloaded_layers: int | None = None
    total_layers: int | None = None


@dataclass(frozen=True)
class ShardUsage:
    """An engine's process group's share of the node, for heartbeats."""

    replica_id: str
    cpu_percent: float | None = None
    rss: int | None = None


@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""


@dataclass(frozen=True)
class Register(Message):
    """First message of every stream: who the node is and what it has."""

    TYPE: ClassVar[str] = "register"
    node_id: str
    version: str
    host: HostFacts
    address: str | None = None
    features: list[str] = field(default_factory=list)
    engines: list[EngineInfo] = field(default_factory=list)
    # False until the agent has looked: then an empty list means "has none".
    engines_probed: bool = False
    installable_engines: list[str] = field(default_factory=list)
    # The settings this agent runs with, each with where it came from (default, cluster,
    # node, file), and the version of the cluster's it applied; None from older agents.
    settings: dict[str, Any] | None = None
    # Shards still running from before this connection, for the control plane to adopt.
    shards: list[ShardStatus] = field(default_factory=list)


@dataclass(frozen=True)
class Heartbeat(Message):
    """Live figures, every few seconds. Absent figures leave the last known ones."""

    TYPE: ClassVar[str] = "heartbeat"
    seq: int
    memory_available: int | None = None
    cpu_percent: float | None = None
    load: list[float] | None = None
    disks: list[Disk] | None = None
    gpus: list[GPU] | None = None
    shards: list[ShardUsage] | None = None
    # Measured once by the agent, in the background; absent until it has (GB/s).
    memory_read_gbs: float | None = None
    memory_read_one_core_gbs: float | None = None
    # Slow card figures: every minute or when they change; absent keeps the last.
    gpu_health: list[GpuHealth] | None = None
    vitals: NodeVitals | None = None
    # The node's health warnings, whole, whenever they change ([] clears them).
    health_warnings: list[str] | None = None
    # What the agent runs with (as in Register), when the cluster's settings it took
    # changed without a restart.
    settings: dict[str, Any] | None = None
    # The node's InfiniBand and RoCE ports with their counters ([] when it has none);
    # None when not read this time.
    ib_ports: list[IbPort] | None = None
    # Seconds since the agent read each figure it collects apart from the heartbeat, by
    # this message's field name ("gpus", "gpu_health", "disks", "ib_ports"), whether
    # or not this heartbeat carries it; a figure with no age was read for this one.
    ages: dict[str, float] | None = None
    # Figures the agent could not read lately (their tool hangs or fails): the control
    # plane keeps its copy but shows none of it as live. Absent: all were read.
    unread: list[str] | None = None
    # In place of ``gpus``, to a control plane that takes them (``CARD_FIGURES``): the
    # cards' moving figures, one a card in the order of the last ``gpus`` this stream
    # carried, whose steady facts have not changed since. The control plane's stream
    # makes whole cards of them, so the registry sees ``gpus`` either way.
    gpu_figures: list[GpuFigures] | None = None


# The Heartbeat figures that have an age (``Heartbeat.ages``), by field name: what the
# control plane and the agent's own /metrics hold as live only while it is recent.
AGED_FIGURES = (
    "memory_available",
    "cpu_percent",
    "load",
    "disks",
    "gpus",
    "gpu_health",
    "vitals",
    "ib_ports",
)


@dataclass(frozen=True)
class Registered(Message):
    """The control plane's answer to Register: accepted, and how to behave."""

    TYPE: ClassVar[str] = "registered"
    node_id: str
    heartbeat_interval: float
    control_planes: list[str] = field(default_factory=list)
    # What this control plane takes beyond what every one does (``CARD_FIGURES``); an
    # older one says nothing, and its agents send what every control plane takes.
    features: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AgentSettings(Message):
    """The cluster's settings for this node (``ctl config``): the default layer and the
    node's own, and the version they make. Sent after Registered and on every change."""

    TYPE: ClassVar[str] = "agent_settings"
    version: int
    default: dict[str, Any] = field(default_factory=dict)
    node: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WantedEngines(Message):
    """The engines the fleet runs (``engines:`` in server.yaml, ``ctl engines set``):
    ``{name: {"version": ..., "sha256": {asset: hex}, "index_url": ...}}``, and this
    node's build choice (``auto``, ``cu13``, ``cu129``, ``cpu``, or ``none``: install
    nothing). Sent after Registered and on every change; the agent converges on it."""

    TYPE: ClassVar[str] = "wanted_engines"
    version: int
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    build: str = "auto"


@dataclass(frozen=True)
class Firewall(Message):
    """llmgw's own nftables table on the node, as the cluster wants it (``firewall:`` in
    server.yaml): on or off, the networks agents may come from, the control planes'
    addresses (the only ones the engines' ports answer besides a replica's own nodes)."""

    TYPE: ClassVar[str] = "firewall"
    enabled: bool = True
    networks: list[str] = field(default_factory=list)
    control_planes: list[str] = field(default_factory=list)
    # The ports the control plane gives engines, and the one agents connect to (kept
    # only on a node that is itself a control plane's machine).
    engine_ports: str = "41000-41999"
    agent_port: int | None = None


@dataclass(frozen=True)
class MetricsAccess(Message):
    """The cluster's metrics token, which a scraper of the agent's own metrics
    (``agent.metrics_listen``) must send; sent after Registered. Never shown or logged."""

    TYPE: ClassVar[str] = "metrics_access"
    token: str = field(repr=False)


@dataclass(frozen=True)
class Goodbye(Message):
    """The sender is ending the stream, and why."""

    TYPE: ClassVar[str] = "goodbye"
    reason: str
    retry: bool = True


@dataclass(frozen=True)
class StartShard(Message):
    TYPE: ClassVar[str] = "start_shard"
    spec: ShardSpec
    # The control plane's span of this start (W3C traceparent), when tracing is on: the
    # agent continues its trace through fetch, engine start and ready.
    traceparent: str | None = None


@dataclass(frozen=True)
class StopShard(Message):
    TYPE: ClassVar[str] = "stop_shard"
    replica_id: str
    grace: float = 10.0


@dataclass(frozen=True)
class ShardStatus(Message):
    """Where a shard stands (``ShardState``)."""

    TYPE: ClassVar[str] = "shard_status"
    replica_id: str
    state: ShardState
    reason: str = ""
    fingerprint: str | None = None
    engine: str | None = None
    source: str | None = None
    port: int | None = None
    pid: int | None = None
    compute: Compute | None = None
    started_at: float | None = None
    last_lines: list[str] | None = None
    # The cards it was given (UUIDs): a restarted control plane reserves them again.
    cards: list[str] = field(default_factory=list)
    # Its rank in a replica spanning nodes (0 the leader); None for a whole replica.
    rank: int | None = None
    # The LoRA adapters its engine loaded, in its order (no path); None: it said nothing.
    adapters: list[AdapterSpec] | None = None
    # Whether it takes images (a projector beside its GGUF model, or a vision model's
    # config); None: not known yet (before its weights are fetched) or an older agent.
    vision: bool | None = None


@dataclass(frozen=True)
class DownloadProgress(Message):
    """Bytes of a source fetched so far; the total only when the server sent one."""

    TYPE: ClassVar[str] = "download_progress"
    source: str
    replica_ids: list[str]
    done: int
    total: int | None = None
    file: str | None = None
    finished: bool = False
    error: str | None = None


@dataclass(frozen=True)
class EngineStatus(Message):
    """What engines the node has, and what installing one is doing, in its own words."""

    TYPE: ClassVar[str] = "engine_status"
    engines: list[EngineInfo] = field(default_factory=list)
    probed: bool = True
    message: str | None = None
    # Per engine the fleet wants: what converging on it is doing ("installing: ...",
    # "install failed: ...", "pinned in agent.yaml to b1"); absent once it is there.
    progress: dict[str, str] | None = None


@dataclass(frozen=True)
class Slurm(Message):
    """This node's part in the cluster's Slurm (``ctl slurm setup``), sent after
    Registered and on every change; ``part`` "none" (Slurm off, or the node not in it):
    the agent stops what it started for Slurm and leaves what it did not start alone.

    ``part``: "slurmctld" (runs the controller on ``slurm_conf`` and ``gres_conf``, the
    files the control plane wrote), "slurmd" (runs slurmd configless from
    ``conf_server``), "both" or "none". ``lent``: Slurm may run jobs here (the agent
    resumes a drain llmgw made); not lent: the agent drains the node in Slurm with
    ``DRAIN_REASON`` unless it is drained already. A drain whose reason does not start
    with ``llmgw:`` is a Slurm administrator's, never touched. ``munge_key`` (base64)
    travels only to a node with a part; the agent writes it 0400, owned by munge."""

    TYPE: ClassVar[str] = "slurm"
    version: int
    part: str = "none"
    lent: bool = False
    # The node's NodeName in slurm.conf, for slurmd -N and scontrol.
    name: str | None = None
    # host:port of slurmctld, for slurmd --conf-server and this node's scontrol.
    conf_server: str | None = None
    munge_key: str | None = None
    # The files slurmctld reads; sent to the controller's node only.
    slurm_conf: str | None = None
    gres_conf: str | None = None
    cgroup_conf: str | None = None
    # Where Slurm keeps its state, spool and logs on every node ("" : the system's own
    # paths, /var/spool/slurmctld, /var/spool/slurmd, /var/log/slurm).
    root: str = ""


# The reason llmgw drains a node in Slurm with; a drain with another reason is not ours.
DRAIN_REASON = "llmgw: reclaimed"
# A drain llmgw made starts so (the reason new nodes enter slurm.conf with included).
OUR_REASON_PREFIX = "llmgw:"


@dataclass(frozen=True)
class SlurmJob:
    """A job with a step on the node, as squeue lists it."""

    id: str
    name: str | None = None
    user: str | None = None
    state: str | None = None
    # When Slurm expects it to end (epoch seconds); None: unknown or unlimited.
    end: float | None = None


@dataclass(frozen=True)
class SlurmdFacts:
    """``slurmd -C``: the node as Slurm sees it (memory in MiB)."""

    cpus: int
    boards: int | None = None
    sockets_per_board: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    real_memory: int | None = None
    gres: str | None = None


@dataclass(frozen=True)
class SlurmStatus(Message):
    """What Slurm is on the node, after every Slurm message and every half minute while
    it has a part (and once more when told it has none). Unknown figures are absent."""

    TYPE: ClassVar[str] = "slurm_status"
    # The Slurm message version it acted on.
    version: int
    part: str = "none"
    # Slurm's version on the node ("22.05.8"); None: not installed.
    installed: str | None = None
    facts: SlurmdFacts | None = None
    # scontrol's State ("IDLE", "IDLE+DRAIN", "MIXED"...) and Reason, as Slurm says them.
    state: str | None = None
    reason: str | None = None
    # The jobs with a step here: squeue's, or None when slurmctld could not be asked.
    jobs: list[SlurmJob] | None = None
    # Job steps running on this machine now (slurmstepd processes), whatever slurmctld says.
    steps: int | None = None
    # The daemons running here, and which of them this agent started.
    running: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    # What is wrong, with its fix (slurmctld down, munge failing, a Slurm too old); None: nothing.
    problem: str | None = None
    # What the agent is doing about its part ("installing slurmd from apt").
    doing: str | None = None
    # Slurm can confine jobs with cgroup v2 here (its controllers mounted and systemd
    # running); None: not looked. slurm.conf's plugins follow the nodes' answers.
    cgroup_v2: bool | None = None


@dataclass(frozen=True)
class FinetuneSpec:
    """A fine-tune job as the control plane sends it to the node that trains it
    (``finetune.start``; its pairs went before it in ``finetune.data`` pieces).

    ``base``: the HF safetensors checkpoint trained on, a weights source as a model's;
    ``device``: "cuda" on ``cards`` (UUIDs), or "cpu"; ``convert``: turn the adapter into
    a GGUF (the model is served by llama.cpp). ``data_sha256`` and ``data_bytes`` let the
    agent check the pairs it put together."""

    id: str
    name: str
    model: str
    base: str
    epochs: int
    rank: int
    device: str
    data_bytes: int
    data_sha256: str
    pairs: int
    cards: list[str] = field(default_factory=list)
    mib: int | None = None
    convert: bool = False
    allow_pickle: bool = False
    seed: int = 0


@dataclass(frozen=True)
class FinetuneStatus(Message):
    """Where a fine-tune stands on its node: sent at each change, with each logged step,
    every few seconds while it runs, and for every job the agent holds on a new stream.

    ``state``: preparing, training, converting, uploading (the result is ready for the
    control plane to take in ``finetune.piece``s), failed or cancelled. ``loss`` holds
    the losses from step ``loss_at`` on (0: all of them)."""

    TYPE: ClassVar[str] = "finetune_status"
    id: str
    state: str
    step: int | None = None
    steps: int | None = None
    pairs: int | None = None
    loss_at: int = 0
    loss: list[float] = field(default_factory=list)
    peak_mib: float | None = None
    error: str | None = None
    # The result, once it is ready: its size, sha256 and kind ("gguf" or "peft-tar").
    adapter_bytes: int | None = None
    adapter_sha256: str | None = None
    adapter_kind: str | None = None
    # What it is doing, in words ("fetching the base weights").
    doing: str | None = None


@dataclass(frozen=True)
class AdapterAsk(Message):
    """The agent asks for a piece of a fine-tune's stored adapter (``finetune:NAME``,
    a shard's LoRA adapter), from byte ``at``; answered by an AdapterPiece."""

    TYPE: ClassVar[str] = "adapter_ask"
    ask_id: str
    name: str
    at: int = 0


@dataclass(frozen=True)
class AdapterPiece(Message):
    """The control plane's answer to an AdapterAsk: up to 1 MiB of the adapter from
    ``at``, with the whole file's size, sha256 and kind ("gguf" or "peft-tar"); or
    ``error`` in words (no such fine-tune, not succeeded)."""

    TYPE: ClassVar[str] = "adapter_piece"
    ask_id: str
    name: str
    at: int = 0
    data: bytes = b""
    total: int | None = None
    sha256: str | None = None
    kind: str | None = None
    error: str | None = None


# The PYTHONHASHSEED vLLM runs with where its KV events are routed on: the root of its
# block hashes, so the router can hash a prompt's blocks as the engine does.
KV_HASH_SEED = "0"


@dataclass(frozen=True)
class KvBlocks(Message):
    """A vLLM replica's KV-cache blocks changed (its KV events, netted by the agent):
    the 64-bit block hashes now held (``added``) and no longer held (``removed``).
    ``reset``: drop what was known of the replica and take ``added`` as all it holds
    (sent on every new stream, and after events were lost)."""

    TYPE: ClassVar[str] = "kv_blocks"
    replica_id: str
    block_size: int
    added: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    reset: bool = False


@dataclass(frozen=True)
class Request(Message):
    """A question for the other side, answered by Response(s) with the same id."""

    TYPE: ClassVar[str] = "request"
    id: str
    kind: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Response(Message):
    """An answer; ``more`` says further answers to the same id follow (a log followed)."""

    TYPE: ClassVar[str] = "response"
    id: str
    ok: bool = True
    result: Any = None
    error: str | None = None
    more: bool = False


__all__ = ["MessageError", "from_map", "to_map"]  # re-exported for the callers' ease

_REGISTRY: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        Register,
        Heartbeat,
        Registered,
        AgentSettings,
        WantedEngines,
        Firewall,
        MetricsAccess,
        Goodbye,
        StartShard,
        StopShard,
        ShardStatus,
        DownloadProgress,
        EngineStatus,
        KvBlocks,
        Slurm,
        SlurmStatus,
        FinetuneStatus,
        AdapterAsk,
        AdapterPiece,
        Request,
        Response,
    )
}


def message_types() -> dict[str, type[Message]]:
    return dict(_REGISTRY)


def encode_message(msg: Message) -> bytes:
    """One message as one frame, ready to write."""
    payload = to_map(msg)
    payload["t"] = msg.TYPE
    return encode_frame(payload)


def decode_message(payload: dict[str, Any]) -> Message | None:
    """The message a decoded frame holds, or None for a type this side does not know."""
    kind = payload.get("t")
    if not isinstance(kind, str):
        raise MessageError("frame has no message type ('t')")
    cls = _REGISTRY.get(kind)
    if cls is None:
        return None
    return decoder(cls)(payload)
