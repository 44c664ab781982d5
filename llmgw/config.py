"""Role configuration: frozen dataclasses loaded once from YAML and passed in, never global.

The loader is strict (``llmgw.configschema``, whose ``build``, ``load``, ``ConfigError``
and ``Settings`` are named here too): an unknown key or a value of the wrong kind is
refused, naming the file, the key and what is allowed, so a typo never silently falls
back to a default.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from llmgw.configschema import ConfigError as ConfigError
from llmgw.configschema import Settings as Settings
from llmgw.configschema import build as build
from llmgw.configschema import load as load
from llmgw.release import DEFAULT_SOURCE as DEFAULT_RELEASE_SOURCE

_V = TypeVar("_V")


def parse_hostport(value: str, default_port: int | None = None) -> tuple[str, int]:
    """Split HOST:PORT (or [v6]:PORT); refuse anything else with a readable reason."""
    text = value.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if not sep:
            raise ConfigError(f"{value!r}: unclosed '[' in an IPv6 address")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not port_text:
        if default_port is None:
            raise ConfigError(f"{value!r} is not HOST:PORT (for example 0.0.0.0:8080)")
        return host or "0.0.0.0", default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"{value!r}: the port must be a number from 1 to 65535")
    return host or "0.0.0.0", int(port_text)


def format_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_hostport(value: str) -> str | None:
    try:
        parse_hostport(value)
    except ConfigError as exc:
        return str(exc)
    return None


def _check_port(value: int) -> str | None:
    return None if 0 < value < 65536 else "a port must be from 1 to 65535"


def _check_http_url(value: str | None) -> str | None:
    if value is None or (isinstance(value, str) and value.startswith(("http://", "https://"))):
        return None
    return (
        f"{value!r} is not an http:// or https:// URL (for example http://127.0.0.1:9400/metrics)"
    )


def _check_positive(value: float) -> str | None:
    return None if value > 0 else "must be greater than 0"


def _check_one_of(*allowed: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in allowed else f"must be one of: {', '.join(allowed)}"

    return check


@typing.overload
def _checked(check: Callable[[_V], str | None], default: None) -> _V | None: ...
@typing.overload
def _checked(check: Callable[[_V], str | None], default: _V) -> _V: ...
def _checked(check: Callable[[_V], str | None], default: _V | None) -> _V | None:
    """A field with a default whose value, once converted and when not None, ``check``
    judges (a problem in words, None when good)."""
    return field(default=default, metadata={"check": check})


@dataclass(frozen=True)
class StoreConfig:
    backend: str = _checked(_check_one_of("sqlite", "postgres"), "sqlite")
    # SQLite: a path (relative to the data dir); PostgreSQL: a libpq DSN.
    dsn: str = "store.db"
    # PostgreSQL: a file holding the DSN (a mounted Kubernetes Secret, say), read at
    # start instead of ``dsn``, so a password stays out of server.yaml.
    dsn_file: str | None = None

    def connection(self) -> str:
        """The DSN to open: ``dsn_file``'s text when set, else ``dsn``."""
        if self.dsn_file is None:
            return self.dsn
        try:
            text = Path(self.dsn_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"store.dsn_file: cannot read {self.dsn_file} ({exc.strerror}); "
                "mount the Secret that holds the DSN there, or set store.dsn"
            ) from exc
        if not text:
            raise ConfigError(f"store.dsn_file: {self.dsn_file} is empty; it must hold the DSN")
        return text


def _check_port_range(value: str) -> str | None:
    m = re.fullmatch(r"(\d+)-(\d+)", str(value))
    if not m or not 1024 <= int(m[1]) <= int(m[2]) <= 65535:
        return "must be FIRST-LAST, ports 1024 to 65535 (like 41000-41999)"
    return None


@dataclass(frozen=True)
class SchedulingConfig:
    """How the reconciler places, restarts and replaces replicas (server.yaml)."""

    # binpack fills the fullest node that fits; spread takes the emptiest.
    strategy: str = _checked(_check_one_of("binpack", "spread"), "binpack")
    # Seconds between passes when nothing changes (a change wakes it at once).
    interval: float = _checked(_check_positive, 2.0)
    # A node NotReady this long has its replicas placed elsewhere; after a restart of
    # the control plane, new replicas wait this long for every node to report.
    node_lost_grace: float = _checked(_check_positive, 60.0)
    # A replica not Ready this long after it last made progress (a state change, a
    # downloaded byte) is stopped and counted as failed.
    start_timeout: float = _checked(_check_positive, 600.0)
    # Restarts after failures wait base x 2^(failures-1) seconds, up to max.
    backoff_base: float = _checked(_check_positive, 10.0)
    backoff_max: float = _checked(_check_positive, 300.0)
    # An on-demand model failing this many times in a row is parked.
    park_after: int = _checked(_check_positive, 3)
    # An on-demand model goes back to zero replicas this long after its last demand.
    on_demand_idle: float = _checked(_check_positive, 900.0)
    # Ports engines listen on, chosen per host.
    engine_ports: str = _checked(_check_port_range, "41000-41999")


def _check_not_negative(value: float) -> str | None:
    return None if value >= 0 else "must be 0 or more"


def _check_between(low: int, high: int) -> Callable[[int], str | None]:
    def check(value: int) -> str | None:
        return None if low <= value <= high else f"must be from {low:,} to {high:,}"

    return check


@dataclass(frozen=True)
class GatewayConfig:
    """The OpenAI-compatible /v1 and the HTTP listener's limits (server.yaml)."""

    # How long a request for an on-demand model at zero waits for its first replica.
    on_demand_wait: float = _checked(_check_positive, 600.0)
    # For this long after the control plane starts, a request for a model with no
    # routable replica waits for one (its agents registering again, the probe proving
    # a remembered replica) rather than answering no_replica; 0 answers at once.
    start_wait: float = _checked(_check_not_negative, 10.0)
    # The longest a request may take from its replica's pick to its answer's end: a 504
    # past it (a stream ends with an error event).
    request_timeout: float = _checked(_check_positive, 600.0)
    # A request for a model whose every replica is at its slots waits in the model's
    # queue (fair across keys, by key priority) at most this many seconds, then a 429.
    queue_wait: float = _checked(_check_positive, 30.0)
    # Requests that may wait in one model's queue; past it a 429 at once (0: none wait).
    queue_depth: int = _checked(_check_between(0, 10**6), 1024)
    # A request's headers must arrive within this many seconds of its first byte (or of
    # the connection, for its first request).
    header_timeout: float = _checked(_check_positive, 10.0)
    # A body must arrive within this many seconds of its headers.
    body_timeout: float = _checked(_check_positive, 60.0)
    # An idle keep-alive connection is closed after this many seconds.
    keepalive_timeout: float = _checked(_check_positive, 75.0)
    # Client connections open at once on a listener; 0 works it out from the process's
    # file limit (raised to its hard limit at start), keeping room for engines, agents
    # and the store. Past it the longest-idle connection is closed to make room, or the
    # new one answered 503 when none is idle.
    max_connections: int = _checked(_check_not_negative, 0)
    # The size of one request's work: body bytes, JSON nesting, messages (or prompts, or
    # inputs), and characters of prompt; past any of them, a 400 naming the limit.
    max_body: int = _checked(_check_between(1024, 2**30), 32 * 2**20)
    max_depth: int = _checked(_check_between(8, 512), 64)
    max_messages: int = _checked(_check_between(1, 10**6), 4096)
    max_prompt_chars: int = _checked(_check_between(1024, 2**30), 8 * 2**20)
    # Images in chat requests (gateway/images.py): the most bytes one image may be, how
    # long fetching an image URL may take (models served with allow_image_urls), and
    # whether such a URL may point at loopback, link-local or private addresses.
    image_max_bytes: int = _checked(_check_between(1024, 2**30), 20 * 2**20)
    image_fetch_timeout: float = _checked(_check_positive, 10.0)
    image_urls_private: bool = False


@dataclass(frozen=True)
class HaConfig:
    """Which control plane this is, and whom it follows while a standby."""

    # Its name in the cluster (`ctl servers`); its peer certificate's name.
    name: str = ""
    role: str = _checked(_check_one_of("leader", "standby"), "leader")
    # The control planes' mutual-TLS link: snapshots, changes, fleet, usage.
    peer_port: int = _checked(_check_port, 8444)
    # A standby's leader on that link (HOST:PORT); written by `server join`.
    leader: str | None = _checked(_check_hostport, None)
    # With store.backend postgres: how long the leader's lease lasts unless renewed;
    # another control plane leads within about this long after the leader is lost.
    lease_seconds: float = _checked(_check_positive, 10.0)


def _check_engines(value: dict[str, object]) -> str | None:
    from llmgw.enginepins import PinError, parse_wanted

    if not isinstance(value, dict):
        return "a map of engine to version, e.g. {llama.cpp: b6000}"
    try:
        parse_wanted(value)
    except PinError as exc:
        return str(exc)
    return None


def _check_networks(value: list[str]) -> str | None:
    import ipaddress

    for item in value:
        try:
            ipaddress.ip_network(str(item), strict=False)
        except ValueError:
            return f"{item!r} is not a network (like 10.0.0.0/8 or fd00::/8)"
    return None


@dataclass(frozen=True)
class ReleasesConfig:
    """Where this cluster's llmgw releases come from (``llmgw/release.py``): what
    ``node add``, ``server add`` and ``ctl upgrade`` install when not told otherwise."""

    # GitHub's release layout: {source}/download/v{VERSION}/{ASSET}.
    source: str = _checked(_check_http_url, DEFAULT_RELEASE_SOURCE)


@dataclass(frozen=True)
class OfflineConfig:
    """A cluster with no route out: the control plane serves its mirror (``DATA_DIR/mirror``,
    filled by ``llmgw bundle import``) at ``/mirror/`` on its listener, and its agents
    install llama.cpp, llmgw and weights from there."""

    mirror: bool = False


def _check_http_urls(value: list[str]) -> str | None:
    for url in value:
        problem = _check_http_url(url)
        if problem:
            return problem
    return None


@dataclass(frozen=True)
class MirrorConfig:
    """Model mirrors beyond the control plane (``llmgw mirror serve`` on a node): the
    control plane asks each every 15 s whether it answers and sends a shard's files from
    the first live one that holds them (``api`` first, then ``peers``), else from its own
    mirror."""

    api: str | None = _checked(_check_http_url, None)
    peers: list[str] = field(default_factory=list, metadata={"check": _check_http_urls})


@dataclass(frozen=True)
class FirewallConfig:
    """llmgw's own nftables table on every node whose agent runs as root."""

    enabled: bool = True
    # Networks agents may reach the control plane's agent port from; empty: any.
    networks: list[str] = field(default_factory=list, metadata={"check": _check_networks})


# Where traces go: OTLP over HTTP (http, https; the path /v1/traces when none is
# given) or over gRPC (grpc for plain text, grpcs for TLS).
TRACE_SCHEMES = ("http://", "https://", "grpc://", "grpcs://")


def _check_trace_endpoint(value: str) -> str | None:
    scheme = next((s for s in TRACE_SCHEMES if value.startswith(s)), None)
    if scheme is None or not value[len(scheme) :].strip("/"):
        return (
            "must be an OTLP collector's URL: http://HOST:4318 or https://... for OTLP "
            "over HTTP, grpc://HOST:4317 or grpcs://... for OTLP over gRPC"
        )
    return None


def _check_ratio(value: float) -> str | None:
    return None if 0.0 <= value <= 1.0 else "must be from 0 to 1 (the share of traces kept)"


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry traces (docs/telemetry.md, Traces): off while ``endpoint`` is unset."""

    endpoint: str | None = _checked(_check_trace_endpoint, None)
    # The share of new traces kept; a trace begun elsewhere (a client's traceparent, the
    # control plane's replica start) is kept or not as its parent was.
    sample: float = _checked(_check_ratio, 1.0)


@dataclass(frozen=True)
class ServerConfig:
    """server.yaml, in the data dir."""

    listen: str = _checked(_check_hostport, "0.0.0.0:8080")
    agent_port: int = _checked(_check_port, 8443)
    # Addresses (host or IP) agents and clients reach this control plane at; they go in
    # the server certificate's SANs and in join tokens.
    advertise: list[str] = field(default_factory=list)
    # A separate listener for /api/v1 and /admin only, when set.
    admin_listen: str | None = _checked(_check_hostport, None)
    # The admin pages are reached over TLS (a proxy in front ends it): their session
    # cookie is then sent only over TLS (Secure).
    pages_behind_tls: bool = False
    heartbeat_interval: float = _checked(_check_positive, 5.0)
    missed_heartbeats: int = _checked(_check_positive, 3)
    store: StoreConfig = field(default_factory=StoreConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    ha: HaConfig = field(default_factory=HaConfig)
    # The engines the fleet runs, {engine: VERSION or {version, sha256, index_url}};
    # unset: the llama.cpp release this llmgw names (llmgw/enginepins.py). ``ctl engines
    # set`` changes it for the running cluster (kept in the store, over this).
    engines: dict[str, Any] | None = _checked(_check_engines, None)
    firewall: FirewallConfig = field(default_factory=FirewallConfig)
    releases: ReleasesConfig = field(default_factory=ReleasesConfig)
    offline: OfflineConfig = field(default_factory=OfflineConfig)
    mirror: MirrorConfig = field(default_factory=MirrorConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)


@dataclass(frozen=True)
class DiscoveryConfig:
    """How an agent reads its hardware (docs/telemetry.md)."""

    # A dcgm-exporter on the node (http://127.0.0.1:9400/metrics): its profiling
    # counters (SM active, occupancy, tensor, DRAM) where NVML's GPM gives none.
    dcgm_exporter: str | None = _checked(_check_http_url, None)
    # The nvidia-smi read when NVML is absent or broken: a name on PATH or a path.
    nvidia_smi: str = "nvidia-smi"
    # Seconds between reads of the slow figures (ECC, retired rows, NVLink counters).
    slow_interval: float = _checked(_check_positive, 15.0)
    # Seconds a read of the cards (NVML or nvidia-smi) or the InfiniBand ports may take;
    # past it the read is ended and its figures are absent until one answers.
    read_deadline: float = _checked(_check_positive, 5.0)


@dataclass(frozen=True)
class AgentConfig:
    """agent.yaml: what a node's agent needs to find and join its control plane."""

    # The control plane's HTTP listener, HOST:PORT, used once to enroll.
    server: str | None = _checked(_check_hostport, None)
    token: str | None = None
    node_id: str | None = None
    state_dir: str | None = None
    # Directories whose filesystems are reported (model weights, caches); the state dir
    # is always one of them.
    data_dirs: list[str] = field(default_factory=list)
    heartbeat_interval: float = _checked(_check_positive, 5.0)
    # Where fetched weights are kept, each source under a hash of its name.
    # Default: /var/lib/llmgw-weights for root, else ~/.cache/llmgw-weights.
    weights_dir: str | None = None
    # Engines named on purpose: {engine: path}, e.g. {llama.cpp: /opt/llama/llama-server}.
    engines: dict[str, str] = field(default_factory=dict)
    # Where llama.cpp releases come from (GitHub's layout) and which one; latest if unset.
    release_source: str = "https://github.com/ggml-org/llama.cpp/releases"
    llamacpp_version: str | None = None
    # Where a fine-tune's GGUF conversion (llama.cpp's convert_lora_to_gguf.py) comes
    # from: a URL or a path on the node of llama.cpp's source archive or tree; default
    # the tag's archive on GitHub.
    converter_source: str | None = None
    # Hugging Face endpoint (else HF_ENDPOINT, else huggingface.co); HF_TOKEN is honoured.
    hf_endpoint: str | None = None
    # The user engines run as when the agent runs as root; None runs them as the agent.
    engine_user: str | None = None
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    # Where the agent serves its own node's metrics to Prometheus (HOST:PORT, e.g.
    # 0.0.0.0:9464); None: it serves none. A scrape sends the cluster's metrics token.
    metrics_listen: str | None = _checked(_check_hostport, None)
    # Who may reach that port through llmgw's firewall on the node: addresses or
    # networks (10.0.0.5, 10.0.0.0/24); empty: anyone (the token still guards it).
    metrics_scrapers: list[str] = field(default_factory=list, metadata={"check": _check_networks})
    tracing: TracingConfig = field(default_factory=TracingConfig)


# What agent.yaml says that the cluster's settings (ctl config) do not: who the node is
# and where it joins.
AGENT_IDENTITY = ("server", "token", "node_id", "state_dir")


def agent_setting_keys() -> list[str]:
    """Every agent.yaml key the cluster may set, dotted for a nested section
    (``discovery.slow_interval``)."""
    out: list[str] = []
    hints = typing.get_type_hints(AgentConfig)
    for f in dataclasses.fields(AgentConfig):
        if f.name in AGENT_IDENTITY:
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            out += [f"{f.name}.{inner.name}" for inner in dataclasses.fields(tp)]
        else:
            out.append(f.name)
    return out


def agent_sections() -> frozenset[str]:
    """The agent.yaml keys that are sections of their own (``discovery``, ``tracing``):
    layers merge them key by key."""
    hints = typing.get_type_hints(AgentConfig)
    return frozenset(
        f.name
        for f in dataclasses.fields(AgentConfig)
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(hints[f.name], type)
    )


def merge_agent_layers(base: Settings, over: Settings) -> dict[str, object]:
    """Agent settings ``over`` ``base``: key by key, a nested section merged key by key."""
    out = dict(copy.deepcopy(base))
    for key, value in over.items():
        current = out.get(key)
        if isinstance(value, dict) and isinstance(current, dict) and key in agent_sections():
            out[key] = {**current, **value}
        else:
            out[key] = copy.deepcopy(value)
    return out


def dump(obj: ServerConfig | AgentConfig) -> str:
    """A config dataclass as YAML, None values left out."""
    data = {k: v for k, v in dataclasses.asdict(obj).items() if v is not None}
    return yaml.safe_dump(data, sort_keys=False)


def default_data_dir() -> Path:
    """Where the control plane keeps its state unless told: system-wide for root."""
    env = os.environ.get("LLMGW_DATA_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/llmgw")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "llmgw"


def default_weights_dir() -> Path:
    """Where an agent keeps fetched weights unless told."""
    if os.geteuid() == 0:
        return Path("/var/lib/llmgw-weights")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmgw-weights"


def default_state_dir() -> Path:
    """Where an agent keeps its key, certificate and state unless told."""
    env = os.environ.get("LLMGW_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/llmgw-agent")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmgw-agent"
