"""Message dataclasses of the agent stream and their map form.

Each message is a frozen dataclass with a class-level ``TYPE``; on the wire it is a map
``{"t": TYPE, ...fields}``. A field whose value is None is left out, so an unknown figure
travels as absent, never as 0. Decoding ignores unknown fields and unknown types, so a
newer peer can talk to an older one; a known field of the wrong type is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from llmgw.wire.codec import MessageError, from_map, to_map
from llmgw.wire.framing import encode_frame
from llmgw.wire.states import ShardState


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


@dataclass(frozen=True)
class EngineInfo:
    """An engine a node can run: installed and seen to run, or named to it on purpose."""

    name: str
    path: str
    version: str | None = None
    build: str | None = None  # "cpu", "cuda", ...
    origin: str = "installed"  # "installed" by the agent, or "configured" by its operator


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


@dataclass(frozen=True)
class Registered(Message):
    """The control plane's answer to Register: accepted, and how to behave."""

    TYPE: ClassVar[str] = "registered"
    node_id: str
    heartbeat_interval: float
    control_planes: list[str] = field(default_factory=list)


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
        Goodbye,
        StartShard,
        StopShard,
        ShardStatus,
        DownloadProgress,
        EngineStatus,
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
    return from_map(cls, payload)
