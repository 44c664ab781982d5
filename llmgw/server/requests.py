"""The typed requests the control plane's services take, with the rules of every field.

Names follow documented patterns (docs/api.md, "Names"): a model is letters, digits,
``.``, ``_`` and ``-`` (48 at most, starting with a letter or digit); a profile lower-case
letters, digits and ``-`` (16 at most); a label's key and value letters, digits, ``.``,
``_``, ``/`` and ``-`` (63 at most); a key's name may also hold spaces, ``@`` and ``+``
(64 at most). Numbers are bounded by what the cluster can use, far inside what the
store holds. Each rule is read by ``schema.read`` and written into the OpenAPI document.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass
from typing import Any, Literal

from llmgw.server.catalog.model import LABEL, MAX_SLOTS, MODEL_NAME, PROFILE_NAME
from llmgw.server.schema import Spec, spec

NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._@+-]{0,63}")
# A key's allowlist: model names with shell-style wildcards (* ? [...]).
MODEL_PATTERN = re.compile(r"[A-Za-z0-9._*?\[\]!-]{1,64}")
ENGINE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")

MODEL_WORDS = "letters, digits, '.', '_' or '-', up to 48, starting with a letter or digit"
PROFILE_WORDS = "lower-case letters, digits and '-', up to 16"
LABEL_WORDS = "letters, digits, '.', '_', '/' or '-', up to 63, starting with a letter or digit"
KEY_WORDS = "letters, digits, spaces, '.', '_', '@', '+' or '-', up to 64"

MAX_TOKENS = 2**24  # a context or an answer longer than any model's
MAX_REPLICAS = 1000
MAX_CARDS = 64
MAX_RATE = 10**9  # requests or tokens a minute
MAX_BUDGET = 10**15  # tokens a month
MAX_PRIORITY = 1000  # a key's priority, either way of 0
PRIORITY_DOC = (
    "when every replica of a model is busy, waiting requests of higher-priority keys "
    "go first; keys of one priority take turns"
)
MAX_TTL = 7 * 24 * 3600
LABEL_SPEC = Spec(pattern=LABEL, pattern_doc=LABEL_WORDS, max_length=63)
ARG_SPEC = Spec(max_length=4096)
ENV_NAME_SPEC = Spec(max_length=128)


def _model_name(default: Any = MISSING, doc: str = "the model's name") -> Any:
    return spec(default, doc=doc, pattern=MODEL_NAME, pattern_doc=MODEL_WORDS, max_length=48)


def _profile_name(doc: str) -> Any:
    return spec(None, doc=doc, pattern=PROFILE_NAME, pattern_doc=PROFILE_WORDS, max_length=16)


# ------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ServeRequest:
    """Serve a model: its source, and the first profile of its replicas."""

    source: str = spec(
        doc="hf:ORG/REPO[:QUANT], an https:// URL, or a path on the nodes",
        min_length=1,
        max_length=2048,
        example="hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M",
    )
    name: str | None = _model_name(None, "the model's name (from the source when left out)")
    engine: str | None = spec(
        None, doc="llama.cpp, vllm, sglang, freetoken or tensorrt-llm", pattern=ENGINE_NAME
    )
    replicas: int = spec(1, minimum=0, maximum=MAX_REPLICAS)
    context: int | None = spec(None, doc="tokens per request", minimum=1, maximum=MAX_TOKENS)
    slots: int = spec(1, doc="requests at once per replica", minimum=1, maximum=MAX_SLOTS)
    max_output: int | None = spec(
        None, doc="the longest answer, in tokens", minimum=1, maximum=MAX_TOKENS
    )
    gpus: int = spec(
        0, doc="cards per replica (0: the CPU); per node with nodes", minimum=0, maximum=MAX_CARDS
    )
    cpu_cores: float = spec(0.0, doc="cores reserved per replica", minimum=0, maximum=4096)
    memory: int | None = spec(
        None, doc="bytes per replica, when the shape cannot be read", minimum=1, maximum=2**50
    )
    nodes: int = spec(
        1, doc="nodes one replica spans (its layers split over them)", minimum=1, maximum=64
    )
    on_demand: bool = spec(False, doc="start on the first request, back to zero when idle")
    kv_events: bool = spec(
        False, doc="vLLM publishes its KV-cache events; requests go where their prefix is cached"
    )
    args: tuple[str, ...] = spec((), doc="engine arguments", max_items=64, items=ARG_SPEC)
    allow_pickle: bool = spec(False, doc="let Python pickles load (they run code)")
    allow_image_urls: bool = spec(
        False, doc="the gateway fetches http(s) image URLs in chat requests (else data: only)"
    )
    profile: str | None = _profile_name("the first profile's name (default)")
    priority: int = spec(0, minimum=-1000, maximum=1000)
    selector: dict[str, str] | None = spec(
        None, doc="node labels a replica needs", max_items=32, keys=LABEL_SPEC, items=LABEL_SPEC
    )
    role: str | None = spec(None, doc="the node role label", pattern=LABEL, pattern_doc=LABEL_WORDS)
    card_class: str | None = spec(
        None,
        doc="the cards a replica takes: a product name (NVIDIA H100 80GB HBM3) or a MIG "
        "class (a100-80g-mig-3g.40gb)",
        min_length=1,
        max_length=128,
    )
    env: dict[str, str] | None = spec(
        None,
        doc="variables in the engine's environment on every node (NCCL_DEBUG: INFO); "
        "never LLMGW_*, loader variables, nor a path outside the replica's directory",
        max_items=64,
        keys=ENV_NAME_SPEC,
        items=ARG_SPEC,
    )


@dataclass(frozen=True)
class ProviderKey:
    key: str = spec(
        doc="the provider's API key (sealed in the store)", min_length=1, max_length=4096
    )
    weight: float = spec(1.0, doc="share of requests", minimum=0.001, maximum=10**6)


@dataclass(frozen=True)
class ExternalRequest:
    """An OpenAI-compatible provider as a model."""

    name: str = _model_name(doc="the model's name")
    base_url: str = spec(
        doc="https:// (http:// only to this machine), ending in the provider's /v1",
        min_length=1,
        max_length=2048,
    )
    keys: tuple[ProviderKey, ...] = spec(min_items=1, max_items=64)
    upstream_model: str | None = spec(None, doc="the provider's name for it", max_length=256)
    context: int | None = spec(None, minimum=1, maximum=MAX_TOKENS)
    max_output: int | None = spec(None, minimum=1, maximum=MAX_TOKENS)


@dataclass(frozen=True)
class RestartRequest:
    in_place: bool = spec(False, doc="stop each replica before its replacement starts")


@dataclass(frozen=True)
class ContextRequest:
    context: int | None = spec(None, minimum=1, maximum=MAX_TOKENS)
    slots: int | None = spec(None, minimum=1, maximum=MAX_SLOTS)
    max_output: int | None = spec(None, minimum=1, maximum=MAX_TOKENS)
    in_place: bool = False


@dataclass(frozen=True)
class GpusRequest:
    gpus: int = spec(doc="cards per replica (0: the CPU)", minimum=0, maximum=MAX_CARDS)
    profile: str | None = _profile_name("the profile (needed when there are several)")
    in_place: bool = False


@dataclass(frozen=True)
class ReplicasRequest:
    replicas: int = spec(minimum=0, maximum=MAX_REPLICAS)
    profile: str | None = _profile_name("the profile; a new name adds a CPU profile")


@dataclass(frozen=True)
class RemoveQuery:
    with_files: bool = spec(False, doc="also delete the nodes' copies of its weights")


@dataclass(frozen=True)
class AdapterRequest:
    """A LoRA adapter of a model: every replica loads it; a request names it."""

    name: str = _model_name(doc="the adapter's name: clients ask for it, or for MODEL:NAME")
    source: str = spec(
        doc="as a model's: hf:ORG/REPO[:FILE], an https:// URL, or a path on the nodes "
        "(llama.cpp: a LoRA GGUF; vLLM: a PEFT directory)",
        min_length=1,
        max_length=2048,
    )
    scale: float = spec(
        1.0, doc="how strongly llama.cpp applies it (vLLM ignores it)", minimum=-100, maximum=100
    )


@dataclass(frozen=True)
class PlanQuery:
    source: str = spec(doc="what to plan, as for serve", min_length=1, max_length=2048)
    context: int | None = spec(None, minimum=1, maximum=MAX_TOKENS)
    slots: int | None = spec(None, minimum=1, maximum=MAX_SLOTS)
    gpus: int | None = spec(None, minimum=0, maximum=MAX_CARDS)
    cpu_cores: int | None = spec(None, minimum=1, maximum=4096)
    engine: str | None = spec(None, pattern=ENGINE_NAME)
    allow_pickle: bool = False
    nodes: int | None = spec(
        None, doc="nodes one replica spans (its layers split over them)", minimum=1, maximum=64
    )


@dataclass(frozen=True)
class ExploreQuery:
    """The model explorer's listing (``GET /api/v1/explore``)."""

    q: str | None = spec(None, doc="words the repository's name holds", max_length=200)
    fits: bool = spec(False, doc="only what fits a node now")
    limit: int = spec(100, doc="repositories asked of the hub", minimum=1, maximum=100)
    sort: str = spec(
        "trendingScore",
        doc="trendingScore, likes or downloads",
        pattern=re.compile(r"trendingScore|likes|downloads"),
        pattern_doc="trendingScore, likes or downloads",
    )


# -------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class LabelsRequest:
    set: dict[str, str] | None = spec(
        None, doc="labels to set", max_items=64, keys=LABEL_SPEC, items=LABEL_SPEC
    )
    remove: tuple[str, ...] = spec((), doc="label keys to remove", max_items=64, items=LABEL_SPEC)


@dataclass(frozen=True)
class StartShardRequest:
    """A shard started on a named node by hand, outside the catalog."""

    replica_id: str = spec(pattern=REPLICA_ID, pattern_doc="letters, digits, '.', '_', '-'")
    engine: str = spec(pattern=ENGINE_NAME)
    source: str = spec(min_length=1, max_length=2048)
    port: int = spec(minimum=1024, maximum=65535)
    model: str | None = spec(None, max_length=256)
    args: tuple[str, ...] = spec((), max_items=64, items=ARG_SPEC)
    cards: tuple[str, ...] = spec(
        (), doc="card UUIDs", max_items=MAX_CARDS, items=Spec(max_length=128)
    )
    cpu_cores: int | None = spec(None, minimum=1, maximum=4096)
    allow_pickle: bool = False
    fingerprint: str = spec("direct", max_length=64)


@dataclass(frozen=True)
class LogsQuery:
    source: str = spec("agent", doc="agent, or a replica id", max_length=128)
    n: int = spec(100, doc="lines", minimum=1, maximum=2000)
    follow: bool = False


@dataclass(frozen=True)
class HistoryQuery:
    minutes: int = spec(60, doc="how far back", minimum=1, maximum=60)


@dataclass(frozen=True)
class WeightsQuery:
    node: str | None = spec(None, pattern=NODE_ID, pattern_doc="a node id")


@dataclass(frozen=True)
class CollectRequest:
    node: str | None = spec(None, pattern=NODE_ID, pattern_doc="a node id")


@dataclass(frozen=True)
class MintToken:
    ttl_seconds: int = spec(
        3600, doc="how long the join token is valid", minimum=1, maximum=MAX_TTL
    )


@dataclass(frozen=True)
class Enroll:
    """An agent's first call: its CSR, with a MAC under the join token's secret."""

    token_id: str = spec(max_length=64, min_length=1)
    node_id: str = spec(max_length=256, min_length=1)
    csr: str = spec(max_length=8192, min_length=1)
    mac: str = spec(max_length=256, min_length=1)


@dataclass(frozen=True)
class JoinServer:
    """A new control plane's first call (`server join`): its CSR and where it will
    answer, with a MAC under the server token's secret."""

    token_id: str = spec(max_length=64, min_length=1)
    name: str = spec(max_length=256, min_length=1)
    csr: str = spec(max_length=8192, min_length=1)
    api_address: str = spec(max_length=300, min_length=1)
    agent_address: str = spec(max_length=300, min_length=1)
    peer_address: str = spec(max_length=300, min_length=1)
    mac: str = spec(max_length=256, min_length=1)
    # Every name and address its certificate must carry.
    sans: tuple[str, ...] = spec((), max_items=64)


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class CreateKey:
    """A gateway key; its limits are per minute (rpm, tpm) and per month (budget)."""

    name: str = spec(doc="whose key it is", pattern=KEY_NAME, pattern_doc=KEY_WORDS, max_length=64)
    models: tuple[str, ...] = spec(
        (),
        doc="model name patterns the key may use (all when empty)",
        max_items=256,
        items=Spec(pattern=MODEL_PATTERN, pattern_doc="a model name, * ? [...] allowed"),
    )
    rpm: int | None = spec(None, doc="requests a minute", minimum=1, maximum=MAX_RATE)
    tpm: int | None = spec(None, doc="tokens a minute", minimum=1, maximum=MAX_RATE)
    budget: int | None = spec(None, doc="tokens a month", minimum=1, maximum=MAX_BUDGET)
    expires: float | str | None = spec(
        None,
        doc="a date (2027-01-31), a date and time, or seconds since 1970",
        minimum=0,
        maximum=253402300799,  # the last second of the year 9999
        max_length=40,
    )
    priority: int = spec(0, doc=PRIORITY_DOC, minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)
    org: str | None = spec(
        None, doc="the organisation (id or name); the default one when left out", max_length=128
    )
    project: str | None = spec(
        None,
        doc="the project it belongs to (id, name or TEAM/NAME); the default one when left out",
        max_length=128,
    )
    personal: bool = spec(False, doc="the caller's own key in the organisation, no project's")


@dataclass(frozen=True)
class UpdateKey:
    """What of a key may change after it is made."""

    priority: int = spec(doc=PRIORITY_DOC, minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)


@dataclass(frozen=True)
class Serving:
    stopped: bool = spec(doc="true: llmgw stop; false: llmgw start")


UsageBy = Literal["org", "team", "project", "key", "person"]


@dataclass(frozen=True)
class UsageQuery:
    days: int = spec(30, doc="this many days back, today included", minimum=1, maximum=3660)
    since: str | None = spec(
        None, doc="the first day (2026-12-01), in place of days", max_length=10
    )
    until: str | None = spec(None, doc="the last day (2026-12-31), included", max_length=10)
    by: UsageBy | None = spec(
        None, doc="sum the period per org, team, project, key or person (else per day and key)"
    )
    org: str | None = spec(None, doc="only this organisation's (id or name)", max_length=128)


# ------------------------------------------------------------------ agent settings


@dataclass(frozen=True)
class ConfigQuery:
    key: str | None = spec(None, doc="one setting, dotted (discovery.slow_interval)", max_length=64)
    node: str | None = spec(None, doc="a node's own layer", pattern=NODE_ID)


@dataclass(frozen=True)
class ConfigSet:
    """Set (or unset) one agent setting, for every node or for one."""

    key: str = spec(doc="the setting, dotted (discovery.slow_interval)", max_length=64)
    value: str | None = spec(
        None,
        doc="its value as YAML text (5, true, [a, b], {k: v}); left out with unset",
        max_length=65536,
    )
    node: str | None = spec(None, doc="this node only (its layer wins on it)", pattern=NODE_ID)
    unset: bool = spec(False, doc="remove the key from the layer")


@dataclass(frozen=True)
class EngineSet:
    """Name an engine's version for the whole fleet (or, with unset, stop naming it)."""

    engine: str = spec(doc="llama.cpp, vllm, sglang, freetoken or tensorrt-llm", max_length=16)
    version: str | None = spec(
        None,
        doc="the version (b6000 for llama.cpp, 0.11.0 for vLLM); left out with unset",
        max_length=64,
    )
    sha256: dict[str, str] | None = spec(
        None, doc="each release archive's file name to the sha256 it must have"
    )
    index_url: str | None = spec(
        None, doc="vLLM and SGLang: the package index to install from", max_length=2048
    )
    packages: dict[str, tuple[str, ...]] | None = spec(
        None,
        doc="the OS packages it needs per package manager ({apt: [libgomp1], dnf: "
        "[libgomp]}), installed by each node from its own package sources",
        max_items=2,
        keys=Spec(pattern=re.compile(r"apt|dnf"), pattern_doc="apt or dnf", max_length=3),
        items=Spec(max_items=64, items=Spec(max_length=128)),
    )
    unset: bool = spec(False, doc="stop naming this engine (its installs stay)")


@dataclass(frozen=True)
class FirewallSet:
    """llmgw's firewall on every node: on or off, the networks agents may reach a
    control plane's agents' port from; or, with unset, server.yaml's again."""

    enabled: bool | None = spec(None, doc="keep llmgw's nftables table on every node")
    networks: tuple[str, ...] | None = spec(
        None,
        doc="networks (CIDR) agents may reach the agents' port from; empty: any",
        max_items=256,
        items=Spec(max_length=64),
    )
    unset: bool = spec(False, doc="go back to server.yaml's firewall")


@dataclass(frozen=True)
class EngineBuild:
    """Which build of the engines a node installs."""

    build: str = spec(doc="auto, cu13, cu129, cpu, or none (install nothing there)", max_length=8)


@dataclass(frozen=True)
class FabricTest:
    """ib_write_bw between two nodes, adapter by adapter."""

    a: str = spec(doc="the node that runs the clients", pattern=NODE_ID)
    b: str = spec(doc="the node that runs the servers", pattern=NODE_ID)
    seconds: int = spec(5, doc="seconds each rail runs", minimum=1, maximum=60)


# ------------------------------------------------------------------------- slurm

SLURM_PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")


@dataclass(frozen=True)
class SlurmSetup:
    """Turn on Slurm beside llmgw: which node runs slurmctld, the partition, the nodes
    Slurm may be lent (default: every node), and where Slurm keeps its files."""

    controller: str | None = spec(
        None,
        doc="the node that runs slurmctld (default: the first of nodes that is Ready)",
        pattern=NODE_ID,
        pattern_doc="a node id",
    )
    partition: str | None = spec(
        None,
        doc="the partition of the lent nodes (default llmgw)",
        pattern=SLURM_PARTITION,
        pattern_doc="letters, digits, '_' or '-', up to 32",
    )
    nodes: tuple[str, ...] | None = spec(
        None,
        doc="the nodes Slurm may be lent (default: every node)",
        max_items=10000,
        items=Spec(pattern=NODE_ID, pattern_doc="a node id"),
    )
    ctld_port: int | None = spec(
        None, doc="slurmctld's port (default 6817)", minimum=1, maximum=65535
    )
    slurmd_port: int | None = spec(
        None, doc="slurmd's port (default 6818)", minimum=1, maximum=65535
    )
    root: str | None = spec(
        None,
        doc="a directory that holds Slurm's state, spool and logs on every node "
        "(default: the system's own paths)",
        max_length=200,
    )


@dataclass(frozen=True)
class SlurmNodes:
    """Nodes to lend to Slurm or take back."""

    nodes: tuple[str, ...] = spec(
        doc="node ids",
        min_items=1,
        max_items=10000,
        items=Spec(pattern=NODE_ID, pattern_doc="a node id"),
    )


@dataclass(frozen=True)
class SlurmOff:
    """Turn Slurm off."""

    now: bool = spec(
        False,
        doc="at once: every lent node back in llmgw whatever Slurm runs on it "
        "(default: reclaim each first, then turn off)",
    )


@dataclass(frozen=True)
class SlurmPolicySet:
    """Lending by policy; ``off`` turns it off."""

    lend_idle_after: float | None = spec(
        None,
        doc="lend a node whose cards served nothing this long (seconds)",
        minimum=60,
        maximum=7 * 86400,
    )
    keep_free_gpus: int | None = spec(
        None, doc="cards kept free of Slurm for llmgw's replicas", minimum=0, maximum=100000
    )
    reclaim_when_queued: float | None = spec(
        None,
        doc="take a lent node back when a model's requests wait this long (seconds)",
        minimum=1,
        maximum=3600,
    )
    off: bool = spec(False, doc="turn lending by policy off")


# ------------------------------------------------------------------------- upgrade

VERSION_WORDS = "MAJOR.MINOR.PATCH, e.g. 0.2.0 (or 0.2.0rc1)"


@dataclass(frozen=True)
class UpgradeStart:
    """Move the cluster to another llmgw release (``llmgw ctl upgrade``)."""

    version: str = spec(
        doc="the llmgw version to run",
        pattern=re.compile(r"v?\d{1,4}\.\d{1,4}\.\d{1,4}(?:-?(?:a|b|rc|dev)\d{1,4})?"),
        pattern_doc=VERSION_WORDS,
        max_length=24,
    )
    source: str | None = spec(
        None,
        doc="the release source, in GitHub's release layout (default: server.yaml's "
        "releases.source)",
        pattern=re.compile(r"https?://[^\s\x00]+"),
        pattern_doc="an http(s) URL",
        max_length=500,
    )
    downgrade: bool = spec(False, doc="allow a version older than the cluster's")
    node_timeout: float | None = spec(
        None,
        doc="how long each node (and control plane) may take to come back on the version "
        "(seconds, default 300)",
        minimum=5,
        maximum=86400,
    )


# ---------------------------------------------------------------------- fine-tunes


@dataclass(frozen=True)
class FinetuneRequest:
    """Train a LoRA adapter of a model on prompt/completion pairs (``ctl finetune
    create``); the pairs are judged, and a node chosen, before anything is sent."""

    model: str = _model_name(doc="the model whose adapter this is")
    name: str = _model_name(doc="the adapter's name: clients ask for it, or MODEL:NAME")
    data: str = spec(
        doc="the pairs, JSONL: {prompt, completion} or {messages: [...]} a line; at most "
        "32 MiB and 100,000 lines",
        max_length=48 * 1024 * 1024,
    )
    node: str | None = spec(None, doc="train on this node", min_length=1, max_length=253)
    mib: int = spec(
        8000, doc="memory the training needs: a card's free MiB, or RAM on the CPU", minimum=256
    )
    epochs: int = spec(3, doc="passes over the pairs", minimum=1, maximum=100)
    rank: int = spec(16, doc="the LoRA's rank", minimum=1, maximum=256)
    base: str | None = spec(
        None,
        doc="the HF safetensors checkpoint trained on (hf:ORG/REPO, https://, a path on "
        "the node); default: the model's own source where it is safetensors",
        min_length=1,
        max_length=2048,
    )
