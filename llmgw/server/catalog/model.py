"""The catalog: what the operator wants served, checked before it is kept.

A model is a source of weights, an engine, a context and one or more profiles; a
profile says how one kind of replica runs (engine, arguments, cards, CPU cores,
memory, where) and how many of them. A model's scaling is the sum of its profiles'
replicas. Nothing here does IO: the admin API inspects the source and hands the shape
in, the store keeps ``Model.to_spec()``, and the reconciler reads the figures
(memory, card memory, disk) this module worked out when the model was written.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypedDict

from llmgw import pki
from llmgw.modelkit import sizing
from llmgw.modelkit.engineenv import EnvError, check_env
from llmgw.modelkit.enginerules import RuleError, rules
from llmgw.modelkit.finetuned import finetune_name
from llmgw.modelkit.sizing import ModelShape
from llmgw.modelkit.sources import WeightsError, check_named_pickle, normalise_source, parse_source
from llmgw.wire.messages import AdapterSpec, GroupSpec, ShardSpec

if TYPE_CHECKING:
    from llmgw.server.catalog.tracks import Start

GIB = 1024**3
# Model names end up in replica ids (``MODEL.PROFILE.HEX``, at most 80 characters) and
# in /v1 requests; profile names hold no dot so a replica id splits unambiguously.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}\Z")
PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,15}\Z")
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}\Z")
_REPLICA = re.compile(r"^(?P<model>.+)\.(?P<profile>[a-z0-9][a-z0-9-]{0,15})\.[0-9a-f]{8}\Z")
# A replica spanning nodes runs its leader under the replica's id and each worker under
# ``REPLICA~RANK``: nothing that reads replica ids takes a worker for a replica.
_MEMBER = re.compile(r"^(?P<replica>.+)~(?P<rank>[1-9][0-9]{0,2})\Z")
MAX_NODES = 64
# Host memory a replica on cards holds besides what its cards hold.
CARD_HOST_MEMORY = 1 * GIB
DEFAULT_CONTEXT = 4096
MAX_SLOTS = 256
# The engines llmgw gives LoRA adapters (loaded unapplied, one applied per request).
ADAPTER_ENGINES = ("llama.cpp", "vllm")
MAX_ADAPTERS = 64
MAX_SCALE = 100.0


class CatalogError(ValueError):
    """A model the catalog refuses; ``field`` names what was wrong, the message the fix."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def is_mig_class(card_class: str) -> bool:
    """Whether a card class names a MIG instance (``a100-80g-mig-3g.40gb``)."""
    return "-mig-" in card_class.lower()


@dataclass(frozen=True)
class Profile:
    name: str
    engine: str
    args: tuple[str, ...] = ()
    cards: int = 0
    cpu_cores: float = 0.0
    replicas: int = 1
    # Higher runs first: the router fills a model's higher-priority pool first, and a
    # CPU profile added beside cards is put below them.
    priority: int = 0
    selector: Mapping[str, str] = field(default_factory=dict)
    role: str | None = None
    # Which cards a replica takes: a product name, or a MIG class ("...-mig-3g.40gb").
    card_class: str | None = None
    # Worked out from the model's shape when written; ``memory_set`` marks an operator's.
    memory: int = 0
    card_memory: int = 0
    memory_set: bool = False
    # Nodes one replica spans (``--nodes``); ``cards``, ``memory`` and ``card_memory``
    # are then what it takes on each of them.
    nodes: int = 1
    # Variables set in its engines' environment on every node (``modelkit.engineenv``).
    env: Mapping[str, str] = field(default_factory=dict)

    def to_spec(self) -> dict[str, Any]:
        out = asdict(self)
        out["args"] = list(self.args)
        out["selector"] = dict(self.selector)
        out["env"] = dict(self.env)
        return out

    @classmethod
    def from_spec(cls, data: Mapping[str, Any]) -> Profile:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["args"] = tuple(known.get("args") or ())
        known["selector"] = dict(known.get("selector") or {})
        known["env"] = dict(known.get("env") or {})
        return cls(**known)


class AdapterJson(TypedDict):
    """An adapter as the store keeps it and the admin API shows it."""

    name: str
    source: str
    scale: float


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter of a model: every replica loads it, a request names it
    (``MODEL:NAME`` or ``NAME``); llama.cpp applies it at ``scale``."""

    name: str
    source: str
    scale: float = 1.0

    def to_spec(self) -> AdapterJson:
        return {"name": self.name, "source": self.source, "scale": self.scale}

    @classmethod
    def from_spec(cls, data: Mapping[str, Any]) -> Adapter:
        return cls(str(data["name"]), str(data["source"]), float(data.get("scale", 1.0)))


@dataclass(frozen=True)
class Model:
    name: str
    source: str
    engine: str
    profiles: tuple[Profile, ...]
    context: int
    slots: int = 1
    max_output: int | None = None
    allow_pickle: bool = False
    on_demand: bool = False
    # vLLM's replicas publish their KV-cache events and the router routes by them.
    kv_events: bool = False
    stopped: bool = False
    # Why an on-demand model was parked after failing again and again; None if not.
    parked: str | None = None
    # Fingerprints the operator asked to move away from (a change or a restart): the
    # reconciler replaces replicas that run them. Any other mismatch is only flagged.
    replaced: tuple[str, ...] = ()
    # Changed by a restart so every replica's fingerprint changes with nothing else.
    restart: int = 0
    # When a change needs new replicas and there is no room beside the old, stop first.
    in_place: bool = False
    # What the model is, as inspected when it was written (plain fields, for showing).
    shape: Mapping[str, Any] = field(default_factory=dict)
    weight_bytes: int = 0
    # An OpenAI-compatible provider instead of replicas: {"base_url", "upstream_model",
    # "keys": [{"sealed": ..., "weight": ...}]}; the keys sealed with the cluster key.
    external: Mapping[str, Any] | None = None
    # LoRA adapters, in the order every replica loads them (``catalog/adapters.py``).
    adapters: tuple[Adapter, ...] = ()
    # The gateway fetches http(s) image URLs in its chat requests (gateway/images.py);
    # without it only data: URLs pass. The gateway's alone: in no fingerprint.
    allow_image_urls: bool = False

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    @property
    def replicas(self) -> int:
        return sum(p.replicas for p in self.profiles)

    def to_spec(self) -> dict[str, Any]:
        out = asdict(self)
        out["profiles"] = [p.to_spec() for p in self.profiles]
        out["replaced"] = list(self.replaced)
        out["shape"] = dict(self.shape)
        out["external"] = dict(self.external) if self.external else None
        out["adapters"] = [a.to_spec() for a in self.adapters]
        return out

    @classmethod
    def from_spec(cls, data: Mapping[str, Any]) -> Model:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["profiles"] = tuple(Profile.from_spec(p) for p in known.get("profiles") or ())
        known["replaced"] = tuple(known.get("replaced") or ())
        known["shape"] = dict(known.get("shape") or {})
        known["adapters"] = tuple(Adapter.from_spec(a) for a in known.get("adapters") or ())
        return cls(**known)


# ------------------------------------------------------------------ replicas of a profile


def fingerprint(model: Model, profile: Profile) -> str:
    """What makes a replica of this profile what it is; a change means a new replica.

    Memory figures are left out: a better estimate must not restart anything.
    """
    parts = {
        "source": model.source,
        "engine": profile.engine,
        "args": list(profile.args),
        "context": model.context,
        "slots": model.slots,
        "cards": profile.cards,
        "cpu_cores": profile.cpu_cores,
        "allow_pickle": model.allow_pickle,
        "restart": model.restart,
    }
    if profile.nodes > 1:  # absent for one node, so earlier replicas keep their print
        parts["nodes"] = profile.nodes
    if profile.env:  # likewise absent when none
        parts["env"] = dict(profile.env)
    if model.kv_events and profile.engine == "vllm":  # likewise absent when off
        parts["kv_events"] = True
    if model.adapters:  # absent when none; a scale is the gateway's, so left out
        parts["adapters"] = [[a.name, a.source] for a in model.adapters]
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return digest[:16]


def new_replica_id(model: str, profile: str) -> str:
    return f"{model}.{profile}.{secrets.token_hex(4)}"


def parse_replica_id(replica_id: str) -> tuple[str, str] | None:
    """(model, profile) of a replica the catalog started; None for anything else."""
    m = _REPLICA.match(replica_id)
    return (m["model"], m["profile"]) if m else None


def member_id(replica_id: str, rank: int) -> str:
    """The shard id of one node of a replica spanning nodes (rank 0 is the replica's)."""
    return replica_id if rank == 0 else f"{replica_id}~{rank}"


def parse_member_id(shard_id: str) -> tuple[str, int] | None:
    """(replica id, rank) of a worker shard of a replica spanning nodes; None else."""
    m = _MEMBER.match(shard_id)
    if m is None or parse_replica_id(m["replica"]) is None:
        return None
    return m["replica"], int(m["rank"])


def shard_spec(
    model: Model,
    profile: Profile,
    replica_id: str,
    port: int,
    cards: Sequence[str],
    key: str,
    group: GroupSpec | None = None,
) -> ShardSpec:
    """The StartShard a node gets: the profile's arguments and the catalog's context;
    for one node of a replica spanning nodes, its shard id and place in the group."""
    args = [*profile.args, *rules(profile.engine).context_args(model.context, model.slots)]
    moe = (model.shape.get("experts") or 0) > 1 and (model.shape.get("experts_used") or 0) > 0
    args += rules(profile.engine).layout_args(args, max(profile.cards, 1) * profile.nodes, moe)
    return ShardSpec(
        replica_id=member_id(replica_id, group.rank) if group else replica_id,
        engine=profile.engine,
        source=model.source,
        port=port,
        key=key,
        fingerprint=fingerprint(model, profile),
        model=model.name,
        args=args,
        cards=list(cards),
        cpu_cores=math.ceil(profile.cpu_cores) if profile.cpu_cores else None,
        allow_pickle=model.allow_pickle,
        group=group,
        kv_events=model.kv_events and profile.engine == "vllm",
        adapters=[AdapterSpec(a.name, a.source, a.scale) for a in model.adapters],
        env=dict(profile.env),
    )


def start_specs(
    model: Model,
    profile: Profile,
    start: Start,
    addresses: Mapping[str, str],
    secret: bytes,
) -> list[tuple[str, ShardSpec]]:
    """(node, spec) of each shard of a start: one, or one per node of a replica spanning
    nodes, each told where the others are (``addresses``: each node's, as the others
    reach it). Every shard's engine key is its own."""
    if not start.workers:
        key = pki.engine_key(secret, start.replica_id)
        return [
            (start.node, shard_spec(model, profile, start.replica_id, start.port, start.cards, key))
        ]
    shares = [(start.node, start.port, start.cards)]
    shares += [(w.node, w.port, w.cards) for w in start.workers]
    out = []
    for rank, (node, port, cards) in enumerate(shares):
        group = GroupSpec(
            rank=rank,
            size=len(shares),
            leader=addresses[start.node],
            rendezvous_port=start.rendezvous_port,
            workers=[f"{addresses[n]}:{p}" for n, p, _ in shares[1:]],
            peers=sorted({addresses[n] for n, _, _ in shares}),
            bind=addresses[node],
            nvlink=start.nvlink,
        )
        key = pki.engine_key(secret, member_id(start.replica_id, rank))
        spec = shard_spec(model, profile, start.replica_id, port, cards, key, group)
        out.append((node, spec))
    return out


# ------------------------------------------------------------------------- checking


def default_engine(source: str) -> str:
    """llama.cpp for GGUF (a .gguf file, or a repository's quantisation), vLLM else."""
    text = _bare(source).lower()
    if text.startswith("hf:") and text.count(":") >= 2:
        part = text.split(":", 2)[2]
        return "llama.cpp" if part.endswith(".gguf") or "." not in part else "vllm"
    return "llama.cpp" if text.endswith(".gguf") else "vllm"


def _bare(source: str) -> str:
    """A source without a URL's query or fragment."""
    return source.split("#", 1)[0].split("?", 1)[0] if "://" in source else source


def default_name(source: str) -> str:
    """A model name from its source: the repository or file name, lower case."""
    text = _bare(source).rstrip("/")
    if text.startswith("hf:"):
        parts = text[3:].split(":")
        base = parts[0].split("/")[-1]
        if len(parts) > 1 and "/" not in parts[1] and "." not in parts[1]:
            base = f"{base}-{parts[1]}"
    else:
        base = text.split("/")[-1]
    base = re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE)
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-._").lower()
    return (base or "model")[:48].rstrip("-._") or "model"


def check_source(source: str, allow_pickle: bool) -> str:
    """The source's normal form, or CatalogError naming the accepted forms."""
    try:
        src = parse_source(source, allow_http=True)
        check_named_pickle(src, allow_pickle=allow_pickle)
        return normalise_source(source)
    except WeightsError as exc:
        raise CatalogError("source", str(exc)) from None


def check_name(name: str) -> str:
    if not MODEL_NAME.match(name):
        raise CatalogError(
            "name",
            f"{name!r} is not a model name: use letters, digits, '.', '_' or '-', "
            "up to 48 characters, starting with a letter or digit (give one with --name)",
        )
    return name


def check_profile_name(name: str) -> str:
    if not PROFILE_NAME.match(name):
        raise CatalogError(
            "profile",
            f"{name!r} is not a profile name: lower-case letters, digits and '-', "
            "up to 16 characters",
        )
    return name


def shape_json(shape: ModelShape) -> dict[str, Any]:
    """Every field, unknown ones as null, so ``shape_of`` can build it again."""
    return asdict(shape)


def check_profile(model: Model, profile: Profile, shape: ModelShape | None) -> Profile:
    """Refuse what the engine must not run; work out the profile's memory figures."""
    try:
        engine = rules(profile.engine)
        engine.check(profile.args, profile.cards, profile.nodes)
        check_env(profile.engine, profile.env)
    except (RuleError, EnvError) as exc:
        raise CatalogError(f"profiles.{profile.name}", str(exc)) from None
    if profile.cards < 0 or profile.cards > 64:
        raise CatalogError(f"profiles.{profile.name}.cards", "give 0 (CPU) to 64 cards")
    if profile.replicas < 0 or profile.replicas > 10_000:
        raise CatalogError(f"profiles.{profile.name}.replicas", "give 0 to 10000 replicas")
    if profile.cpu_cores < 0:
        raise CatalogError(f"profiles.{profile.name}.cpu_cores", "must not be negative")
    if not 1 <= profile.nodes <= MAX_NODES:
        raise CatalogError(
            f"profiles.{profile.name}.nodes", f"give 1 to {MAX_NODES} nodes per replica"
        )
    if profile.nodes > 1 and profile.engine != "llama.cpp" and not profile.cards:
        raise CatalogError(
            f"profiles.{profile.name}.nodes",
            f"{profile.engine} spans nodes only on cards: give --gpus 1 or more per node",
        )
    for key, value in profile.selector.items():
        if not LABEL.match(key) or not LABEL.match(value):
            raise CatalogError(f"profiles.{profile.name}.selector", f"{key}={value} is not a label")
    if profile.card_class is not None:
        where = f"profiles.{profile.name}.card_class"
        if not profile.cards:
            raise CatalogError(where, "a card class needs cards: give --gpus 1 or more")
        if is_mig_class(profile.card_class) and profile.cards > 1:
            raise CatalogError(
                where,
                f"{profile.card_class} is a MIG instance, and a replica gets exactly one: "
                "give --gpus 1, or a whole card's class for more",
            )
    if shape is not None and engine.tensor_split and profile.cards > 1:
        problem = sizing.check_cards_vs_kv_heads(shape, profile.cards)
        if problem:
            raise CatalogError(f"profiles.{profile.name}.cards", problem)
    if shape is None:
        if not profile.memory_set:
            raise CatalogError(
                "memory",
                "the model's shape could not be read, so its memory cannot be estimated; "
                "give --memory (bytes per replica, like 8GiB)",
            )
        return replace(profile, card_memory=profile.memory if profile.cards else 0)
    split: sizing.Split = "tensor" if engine.tensor_split else "layer"
    # Across nodes the model is cut in layers (pipeline stages, RPC devices): each
    # node holds its share; the figures kept are one node's.
    nodes = profile.nodes
    estimate = sizing.memory_estimate(
        shape,
        model.context,
        model.slots,
        cards=max(profile.cards, 1) * nodes,
        split=split if nodes == 1 else "layer",
        experts_in_ram=engine.experts_in_ram,
    )
    if profile.cards:
        card_memory = max(estimate.per_card)
        host = CARD_HOST_MEMORY + estimate.host_weights
        memory = profile.memory if profile.memory_set else host
    else:
        card_memory = 0
        memory = (
            profile.memory
            if profile.memory_set
            else max(estimate.per_card)
            if nodes > 1
            else sum(estimate.per_card)
        )
    return replace(profile, memory=memory, card_memory=card_memory)


def check_adapters(model: Model) -> tuple[Adapter, ...]:
    """The model's LoRA adapters with their sources in normal form, or CatalogError:
    names apart from the model's and each other's, sources read as the model's (a pickle
    only where the model allows them), engines that load adapters (llama.cpp, vLLM),
    and vLLM only in replicas of one node (each node would load it from its own path).
    Names apart from every other model's are the service's to judge."""
    if not model.adapters:
        return ()
    if model.external:
        raise CatalogError("adapters", f"{model.name} is an external provider: it loads none")
    if len(model.adapters) > MAX_ADAPTERS:
        raise CatalogError("adapters", f"a model loads at most {MAX_ADAPTERS} adapters")
    for p in model.profiles:
        if p.engine not in ADAPTER_ENGINES:
            raise CatalogError(
                "adapters",
                f"profile {p.name} runs {p.engine}, which llmgw does not give adapters; "
                f"serve the model with {' or '.join(ADAPTER_ENGINES)}",
            )
        if p.engine == "vllm" and p.nodes > 1:
            raise CatalogError(
                "adapters",
                f"profile {p.name} spans {p.nodes} nodes: vLLM would load an adapter on "
                "every node from the leader's path; serve adapters on one node a replica",
            )
    seen = {model.name}
    out = []
    for a in model.adapters:
        if not MODEL_NAME.match(a.name):
            raise CatalogError(
                "name",
                f"{a.name!r} is not an adapter name: use letters, digits, '.', '_' or '-', "
                "up to 48 characters, starting with a letter or digit",
            )
        if a.name in seen:
            raise CatalogError("name", f"{a.name!r} is already a name of {model.name}")
        if not math.isfinite(a.scale) or abs(a.scale) > MAX_SCALE:
            raise CatalogError("scale", f"give a scale from -{MAX_SCALE} to {MAX_SCALE}")
        try:  # a weights source, or a fine-tune's stored adapter (finetune:NAME)
            trained = finetune_name(a.source) is not None
            source = a.source if trained else check_source(a.source, model.allow_pickle)
        except ValueError as exc:  # CatalogError too
            why = str(exc).removeprefix("source: ")
            raise CatalogError("source", f"adapter {a.name}: {why}") from None
        seen.add(a.name)
        out.append(replace(a, source=source))
    return tuple(out)


def check_context(model: Model, shape: ModelShape | None) -> None:
    field_name = "context"
    if model.context < 256:
        raise CatalogError(field_name, f"{model.context} tokens is too short; give 256 or more")
    if not 1 <= model.slots <= MAX_SLOTS:
        raise CatalogError("slots", f"give 1 to {MAX_SLOTS} slots")
    trained = shape.trained_context if shape else None
    if trained and model.context > trained:
        raise CatalogError(
            field_name,
            f"{model.context} tokens is past the {trained} the model was trained for; "
            f"give {trained} or less",
        )
    if model.max_output is not None and not 1 <= model.max_output <= model.context:
        raise CatalogError(
            "max_output", f"give 1 to the context ({model.context}), not {model.max_output}"
        )


def check_model(model: Model, shape: ModelShape | None) -> Model:
    """The model as it will be kept, or CatalogError naming the field and the fix."""
    check_name(model.name)
    model = replace(model, adapters=check_adapters(model))
    if model.external:
        return model  # no replicas: nothing to place or size
    source = check_source(model.source, model.allow_pickle)
    if not model.profiles:
        raise CatalogError("profiles", "a model needs at least one profile")
    names = [check_profile_name(p.name) for p in model.profiles]
    if len(set(names)) != len(names):
        raise CatalogError("profiles", "two profiles share a name")
    model = replace(model, source=source)
    if model.kv_events and not any(p.engine == "vllm" for p in model.profiles):
        raise CatalogError(
            "kv_events",
            "KV-event routing reads vLLM's cache events: serve the model with "
            "--engine vllm, or leave --kv-events out (other engines are routed by the "
            "approximate prefix guess)",
        )
    check_context(model, shape)
    profiles = tuple(check_profile(model, p, shape) for p in model.profiles)
    return replace(
        model,
        profiles=profiles,
        shape=shape_json(shape) if shape else dict(model.shape),
        weight_bytes=shape.file_bytes if shape else model.weight_bytes,
    )


def shape_of(model: Model) -> ModelShape | None:
    """The shape kept with a model, to check a change against without reading it again."""
    if not model.shape:
        return None
    known = {k: v for k, v in model.shape.items() if k in ModelShape.__dataclass_fields__}
    try:
        return ModelShape(**known)
    except TypeError:
        return None


def default_context(shape: ModelShape | None, largest_room: int | None, slots: int) -> int:
    """What the model was trained for, cut to what fits the roomiest place it could go;
    4096 when the shape does not say."""
    if shape is None or not shape.trained_context:
        return DEFAULT_CONTEXT
    context = shape.trained_context
    if largest_room:
        fits = sizing.max_context_that_fits(shape, largest_room, slots)
        if fits >= 256:
            context = min(context, fits)
    return context


def with_change(model: Model, changed: Model) -> Model:
    """``changed`` marked so the reconciler replaces the replicas of whatever profile's
    fingerprint it changed (and only flags other mismatches)."""
    old = {p.name: fingerprint(model, p) for p in model.profiles}
    moved = [
        old[p.name]
        for p in changed.profiles
        if p.name in old and fingerprint(changed, p) != old[p.name]
    ]
    # A change back to what ran before (an adapter added, then removed) wants that
    # fingerprint again: it is no longer one to move away from.
    now = {fingerprint(changed, p) for p in changed.profiles}
    keep = [f for f in model.replaced if f not in moved and f not in now][-32:]
    return replace(changed, replaced=tuple([*keep, *moved]))
