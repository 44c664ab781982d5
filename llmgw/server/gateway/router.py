"""Which replica gets a request: the routing table, pools, load, prefix affinity, breakers.

The table maps each model to the replicas that serve it: every Ready shard on a Ready
node, and every Ready shard on a node whose agent has gone silent as long as its engine
still answers the control plane's own probe (``probe.py``) — an agent's death never
takes a model down. After a control plane start, before a node's agent registers, the
replicas the store remembered of it are routed to once their engine has answered the
probe, so a restart does not take a model down either. The table is rebuilt only when
nodes, the catalog or the probe's verdicts change. A pick takes the highest-priority
pool that has a usable replica, within it the one holding the longest shared prompt
prefix unless that one is much busier, else the least outstanding. What a replica
holds is known from vLLM's KV events where the model asks for them (``kvroute.py``),
else guessed from the prompts sent to it lately; each pick is counted by the reason it
was made (``decisions``).

A breaker opens on a replica after BREAKER_FAILURES failures of the replica itself in a
row (refused or reset connections, a connect timeout, a 5xx to a request the gateway
checked): never on an answer about the request, so no client can open it.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llmgw import pki
from llmgw.jsonvalue import JSONObject
from llmgw.server.catalog.model import Model, parse_replica_id
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.gateway.kvroute import KvIndex
from llmgw.wire.messages import KvBlocks
from llmgw.wire.states import NodeState, ShardState

log = logging.getLogger("llmgw.gateway")

BREAKER_FAILURES = 3
BREAKER_OPEN = 10.0
# Prefix affinity: prompts are hashed in blocks of this many characters; a replica is
# affine when it likely holds at least PREFIX_MIN_BLOCKS of them, and chosen unless it
# has more than PREFIX_SLACK requests outstanding beyond the least busy.
PREFIX_BLOCK = 256
PREFIX_MIN_BLOCKS = 2
PREFIX_SLACK = 4
PREFIX_MEMORY = 4096
# A prompt's blocks past these are not hashed: two prompts that share this much (16 KiB
# of text) are routed as alike whatever follows, and a replica's memory holds the
# leading blocks of PREFIX_MEMORY / PREFIX_MAX_BLOCKS such prompts at least.
PREFIX_MAX_BLOCKS = 64
# KV-event routing scores each replica by the share of the prompt's leading blocks it
# holds less KV_LOAD_WEIGHT times its load (requests outstanding per slot): a replica
# with every slot taken keeps a prompt only if it holds three quarters more of it than
# an idle one. (0.75: the best of 0.5, 0.75 and 1.0 in bench/routing.py.)
KV_LOAD_WEIGHT = 0.75
# Why a replica was picked (llmgw_router_decisions_total{reason}).
KV_EVENTS = "kv_events"  # it holds the prompt's leading blocks, its engine says
APPROXIMATE = "approximate_prefix"  # it likely holds them: prompts sent to it lately
LEAST_OUTSTANDING = "least_outstanding"  # no cache to go by, or its holder too busy
ONLY_REPLICA = "only_replica"  # one usable replica: nothing to choose
# Engines that close their connection after a streamed answer while announcing
# keep-alive (llama.cpp's server does): such a connection is closed, never pooled.
CLOSES_AFTER_STREAM = frozenset({"llama.cpp"})


class Nodes(Protocol):
    nodes: dict[str, NodeView]
    version: int


class Catalog(Protocol):
    models: dict[str, Model]
    version: int


class Verdicts(Protocol):
    """The probe's word on engines whose agent is silent."""

    version: int

    def answers(self, replica_id: str) -> bool: ...

    def proven(self, replica_id: str) -> bool: ...


@dataclass
class Endpoint:
    """One Ready replica (or an external provider's key) as the router sees it."""

    replica_id: str
    url: str
    key: str
    priority: int
    outstanding: int = 0
    failures: int = 0
    open_until: float = 0.0
    weight: float = 1.0
    # An external provider's key: its answers are judged by key (429, 401).
    external: bool = False
    upstream_model: str | None = None
    # Why this endpoint is passed over now, in words (never the key).
    problem: str = ""
    # Its engine closes the connection after a stream: do not pool it.
    closes_after_stream: bool = False
    # Its node's agent is silent; the control plane's probe vouches for the engine.
    vouched: bool = False
    # Requests it serves at once (the model's slots); 0: unbounded (a provider's key).
    # Past them a request waits in the gateway's queue (queue.py).
    slots: int = 0
    # Its node, and whether its engine reports its cache (vLLM with kv_events).
    node: str = ""
    kv: bool = False
    # Its engine, and the LoRA adapters it loaded in its order, as its agent reported
    # (None: not said); a request for an adapter goes only where it is loaded.
    engine: str = ""
    adapters: tuple[str, ...] | None = None
    # Whether it takes images, as its agent reported (None: not said).
    vision: bool | None = None
    # Hashes of the prompt prefixes sent here lately, oldest first: what its cache
    # likely holds. Approximate on purpose: a miss costs a prefill, not a wrong answer.
    prefixes: OrderedDict[int, None] = field(default_factory=OrderedDict)

    @property
    def full(self) -> bool:
        """At its slots: a request more would wait in the engine's own queue."""
        return 0 < self.slots <= self.outstanding

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt this replica likely holds."""
        lo, hi = 0, len(hashes)
        while lo < hi:  # prefixes nest: if block k is held, so are those before it
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in self.prefixes:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def remember(self, hashes: Sequence[int]) -> None:
        prefixes = self.prefixes
        for h in hashes:
            prefixes[h] = None
            prefixes.move_to_end(h)
        while len(prefixes) > PREFIX_MEMORY:
            prefixes.popitem(last=False)


def _adapter_routes(
    models: Mapping[str, Model], table: Mapping[str, list[Endpoint]]
) -> dict[str, list[Endpoint]]:
    """Each LoRA adapter's name → its model's replicas that loaded it, by priority: a
    replica started before the adapter was added (or that did not say) is passed over."""
    out: dict[str, list[Endpoint]] = {}
    for model in models.values():
        for adapter in model.adapters:
            out[adapter.name] = [
                e for e in table.get(model.name, ()) if adapter.name in (e.adapters or ())
            ]
    return out


def engine_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def prompt_prefix(body: JSONObject) -> list[int]:
    """Hashes of a prompt's leading blocks (each hash covers every block before it), at
    most ``PREFIX_MAX_BLOCKS`` of them, read from no more of the prompt than they cover:
    the time is the same for a prompt of a megabyte as of 16 KiB. Empty for a
    prompt too short to be worth routing by."""
    limit = PREFIX_BLOCK * PREFIX_MAX_BLOCKS
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        size = 0
        for m in messages:
            if size >= limit:
                break
            if not isinstance(m, dict):
                continue
            part = f"{m.get('role')}\x00{_leading_text(m.get('content'), limit)}"
            parts.append(part)
            size += len(part) + 1
        text = "\x01".join(parts)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return []
        text = prompt
    blocks = min(len(text) // PREFIX_BLOCK, PREFIX_MAX_BLOCKS)
    if blocks < PREFIX_MIN_BLOCKS:
        return []
    out, h = [], 0
    for i in range(blocks):
        h = hash((h, text[i * PREFIX_BLOCK : (i + 1) * PREFIX_BLOCK]))
        out.append(h)
    return out


def _leading_text(content: object, limit: int) -> object:
    """A message's content as prompt_prefix reads it, no more than ``limit`` characters
    of it: a string, or its parts' texts joined; anything else as it is."""
    if isinstance(content, str):
        return content[:limit]
    if not isinstance(content, list):
        return content
    texts: list[str] = []
    got = 0
    for c in content:
        if got >= limit:
            break
        if isinstance(c, dict):
            texts.append(str(c.get("text", ""))[:limit])
            got += len(texts[-1])
    return "".join(texts)


class Router:
    def __init__(
        self,
        nodes: Nodes,
        catalog: Catalog,
        probe: Verdicts,
        secret: bytes,
        unseal: Callable[[str], str] | None = None,
        kv: KvIndex | None = None,
    ) -> None:
        self.nodes = nodes
        self.catalog = catalog
        self.probe = probe
        self.secret = secret
        self.unseal = unseal or (lambda sealed: pki.unseal(secret, sealed).decode())
        self._table: dict[str, list[Endpoint]] = {}
        self._endpoints: dict[str, Endpoint] = {}
        self._version: tuple[int, int, int] = (-1, -1, -1)
        # An adapter's name → its model's replicas that loaded it (rebuilt with the table).
        self._adapted: dict[str, list[Endpoint]] = {}
        self.prefix_hits: dict[str, int] = {}
        # Replicas' cached blocks from vLLM's KV events; picks by (model, reason); picks
        # sent to a replica that held at least one leading block, by model.
        self.kv = kv if kv is not None else KvIndex()
        self.decisions: dict[tuple[str, str], int] = {}
        self.kv_hits: dict[str, int] = {}
        self.tokenize_failures = 0
        # Failures of replicas themselves, and breakers opened, per (model, replica).
        self.failures: dict[tuple[str, str], int] = {}
        self.breaker_opens: dict[tuple[str, str], int] = {}
        # Node id -> when (monotonic) a request last began or ended on one of its
        # replicas: how long its cards have served nothing (lending by policy).
        self.last_served: dict[str, float] = {}

    def table(self) -> dict[str, list[Endpoint]]:
        """Model name → the replicas that serve it, rebuilt only when something changed."""
        version = (self.nodes.version, self.catalog.version, self.probe.version)
        if version == self._version:
            return self._table
        table: dict[str, list[Endpoint]] = {}
        seen: dict[str, Endpoint] = {}
        models = self.catalog.models
        for view in self.nodes.nodes.values():
            if not view.address:
                continue
            silent = view.state != NodeState.READY
            for rid, shard in view.routable().items():
                if shard.state != ShardState.READY or not shard.port:
                    continue
                if silent and not self._vouched(rid, rid in view.shards):
                    continue
                parsed = parse_replica_id(rid)
                model = models.get(parsed[0]) if parsed else None
                profile = model.profile(parsed[1]) if model and parsed else None
                if model is None or profile is None:
                    continue
                url = engine_url(view.address, shard.port) + "/v1"
                endpoint = self._endpoints.get(rid)
                if endpoint is None or endpoint.url != url:
                    endpoint = Endpoint(
                        rid, url, pki.engine_key(self.secret, rid), profile.priority
                    )
                endpoint.priority = profile.priority
                endpoint.closes_after_stream = profile.engine in CLOSES_AFTER_STREAM
                endpoint.vouched = silent
                endpoint.slots = model.slots
                endpoint.node = view.id
                endpoint.kv = model.kv_events and profile.engine == "vllm"
                endpoint.engine = profile.engine
                loaded = shard.adapters
                endpoint.adapters = None if loaded is None else tuple(a.name for a in loaded)
                endpoint.vision = shard.vision
                seen[rid] = endpoint
                table.setdefault(model.name, []).append(endpoint)
        for model in models.values():
            if model.external:
                table[model.name] = self._external(model, seen)
        for endpoints in table.values():
            endpoints.sort(key=lambda e: -e.priority)
        self.kv.keep_only(rid for view in self.nodes.nodes.values() for rid in view.shards)
        self._adapted = _adapter_routes(models, table)
        self._endpoints, self._table, self._version = seen, table, version
        return table

    def _vouched(self, replica_id: str, reported: bool) -> bool:
        """Whether a replica on a node whose agent is silent is routed to: one its agent
        reported Ready until the probe finds its engine gone; one only remembered from
        the store once the probe has found its engine answering."""
        if reported:
            return self.probe.answers(replica_id)
        return self.probe.proven(replica_id)

    def serving(self, name: str) -> Sequence[Endpoint]:
        """The replicas a name routes to: a model's own, or for one of its LoRA adapters
        (by the adapter's name) those of its replicas that loaded it."""
        return self.table().get(name) or self._adapted.get(name) or ()

    def prefix_of(self, name: str, body: JSONObject) -> list[int]:
        """The prompt's leading blocks hashed for the approximate guess, where there is
        a choice to make: none (and no hashing) while one replica or none serves the
        name, as a model of one replica always has."""
        if len(self.serving(name)) < 2:
            return []
        return prompt_prefix(body)

    def kv_blocks(self, node_id: str, msg: KvBlocks) -> None:
        """A node's report of one replica's cache: believed only for its own replicas."""
        view = self.nodes.nodes.get(node_id)
        self.kv.apply(node_id, msg, runs=view is not None and msg.replica_id in view.shards)

    def kv_sizes(self, model: str) -> set[int]:
        """The block sizes of a model's replicas that report their cache; empty when
        none does (then its prompts are not tokenized for routing)."""
        return self.kv.block_sizes(e.replica_id for e in self.serving(model) if e.kv)

    def _external(self, model: Model, seen: dict[str, Endpoint]) -> list[Endpoint]:
        """One endpoint per key of an external provider: ``external:MODEL#N``."""
        spec = model.external or {}
        base = str(spec["base_url"]).rstrip("/")
        out = []
        for i, entry in enumerate(spec.get("keys") or [], start=1):
            name = f"external:{model.name}#{i}"
            endpoint = self._endpoints.get(name)
            if endpoint is None or endpoint.url != base:
                endpoint = Endpoint(name, base, self.unseal(entry["sealed"]), 0, external=True)
            endpoint.weight = float(entry.get("weight") or 1.0)
            endpoint.upstream_model = spec.get("upstream_model") or None
            seen[name] = endpoint
            out.append(endpoint)
        return out

    def endpoints_of(self, model: str) -> list[Endpoint]:
        return list(self.table().get(model, ()))

    def room(self, model: str) -> int | None:
        """Requests a model's usable replicas take before each is at its slots (what
        ``pick(room=True)`` can place); None when nothing bounds them (a provider's
        keys) or none is usable, so there is nothing to queue for."""
        now = time.monotonic()
        free: int | None = None
        for endpoint in self.serving(model):
            if endpoint.open_until > now:
                continue
            if not endpoint.slots:
                return None
            free = (free or 0) + max(0, endpoint.slots - endpoint.outstanding)
        return free

    def pick(
        self,
        model: str,
        exclude: Endpoint | None = None,
        prefix: Sequence[int] = (),
        blocks: Mapping[int, Sequence[int]] | None = None,
        room: bool = False,
    ) -> Endpoint | None:
        """The highest-priority pool with a usable replica; within it the replica that
        holds the longest shared prompt prefix in its cache (``blocks``: the prompt's
        block hashes by block size, for replicas that report their cache; ``prefix``:
        the approximate guess's hashes), unless that one is much busier than the rest;
        else the least outstanding. ``room``: a replica at its slots is not usable."""
        best, reason = self._pick(model, exclude, prefix, blocks, room)
        if best is not None:
            key = (model, reason)
            self.decisions[key] = self.decisions.get(key, 0) + 1
        return best

    def other(self, model: str, exclude: Endpoint) -> Endpoint | None:
        """A usable replica of the model other than ``exclude``, not counted as a pick
        (a resumed stream asks one to count its prompt's tokens)."""
        return self._pick(model, exclude, (), None)[0]

    def _pick(
        self,
        model: str,
        exclude: Endpoint | None,
        prefix: Sequence[int],
        blocks: Mapping[int, Sequence[int]] | None,
        room: bool = False,
    ) -> tuple[Endpoint | None, str]:
        now = time.monotonic()
        pool: list[Endpoint] = []
        best: Endpoint | None = None
        least, top = 0.0, 0
        # The pool and its least loaded in one pass, ``full`` written out: a pick looks at
        # every replica of the model, so on a large fleet this loop is the router's cost.
        for endpoint in self.serving(model):
            if endpoint is exclude or endpoint.open_until > now:
                continue
            if room and 0 < endpoint.slots <= endpoint.outstanding:
                continue
            if best is None:
                top = endpoint.priority
            elif endpoint.priority < top:
                break  # a lower pool: the higher one had a replica
            load = (endpoint.outstanding + 1) / endpoint.weight
            if best is None or load < least:  # the first of the least, as min() gives
                best, least = endpoint, load
            pool.append(endpoint)
        if best is None:
            return None, ""
        reason = ONLY_REPLICA if len(pool) == 1 else LEAST_OUTSTANDING
        if blocks:
            holder = self._kv_best(pool, blocks)
            if holder is not None:
                self.kv_hits[model] = self.kv_hits.get(model, 0) + 1
                return holder, KV_EVENTS if len(pool) > 1 else ONLY_REPLICA
        if prefix:
            longest, affine = 0, None
            for endpoint in pool:
                held = endpoint.match(prefix)
                if held > longest:
                    longest, affine = held, endpoint
            if (
                affine is not None
                and longest >= PREFIX_MIN_BLOCKS
                and affine.outstanding <= best.outstanding + PREFIX_SLACK
            ):
                if affine is not best:
                    self.prefix_hits[model] = self.prefix_hits.get(model, 0) + 1
                    reason = APPROXIMATE
                best = affine
            best.remember(prefix)
        return best, reason

    def _kv_best(
        self, pool: Sequence[Endpoint], blocks: Mapping[int, Sequence[int]]
    ) -> Endpoint | None:
        """The replica whose held share of the prompt's leading blocks, less its load,
        is highest, when it holds any of them; None when the best holds none (then
        the least outstanding is as good)."""
        top: tuple[float, int] | None = None
        chosen: Endpoint | None = None
        for endpoint in pool:
            held, share = 0, 0.0
            record = self.kv.held(endpoint.replica_id) if endpoint.kv else None
            chain = blocks.get(record.block_size, ()) if record else ()
            if record is not None and chain:
                held = record.leading(chain)
                share = held / len(chain)
            load = endpoint.outstanding / (endpoint.slots or 1)
            score = (share - KV_LOAD_WEIGHT * load, -endpoint.outstanding)
            if top is None or score > top:
                top, chosen = score, endpoint if held else None
        return chosen

    # -------------------------------------------------------------- breakers

    def serves(self, endpoint: Endpoint) -> None:
        """A request begins or ends on ``endpoint``: its node served just now."""
        if endpoint.node:
            self.last_served[endpoint.node] = time.monotonic()

    def succeeded(self, endpoint: Endpoint) -> None:
        endpoint.failures = 0

    def failed(self, model: str, endpoint: Endpoint, why: str) -> None:
        """A failure of the replica itself: counted, and past the limit its breaker opens."""
        key = (model, endpoint.replica_id)
        self.failures[key] = self.failures.get(key, 0) + 1
        endpoint.failures += 1
        log.info("%s failed: %s", endpoint.replica_id, why)
        if endpoint.failures >= BREAKER_FAILURES:
            endpoint.open_until = time.monotonic() + BREAKER_OPEN
            endpoint.failures = 0
            endpoint.problem = ""
            self.breaker_opens[key] = self.breaker_opens.get(key, 0) + 1
            log.warning(
                "%s failed %d times in a row: passed over for %g s",
                endpoint.replica_id,
                BREAKER_FAILURES,
                BREAKER_OPEN,
            )

    def key_refused(self, endpoint: Endpoint, status: int, retry_after: str | None) -> None:
        """A provider's key answered 429 (pass it over a while) or 401/403 (pass it
        over until its key changes); said by endpoint name, never by key."""
        now = time.monotonic()
        if status == 429:
            try:
                wait = min(300.0, max(1.0, float(retry_after or 30)))
            except ValueError:
                wait = 30.0
            endpoint.open_until = now + wait
            endpoint.problem = f"answered 429 (rate limited): passed over for {wait:g} s"
        else:
            endpoint.open_until = now + 3600
            endpoint.problem = f"answered {status}: the provider refused this key"
        log.warning("%s %s", endpoint.replica_id, endpoint.problem)
