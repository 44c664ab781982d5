"""Placement: which node and which cards a replica runs on, and why not elsewhere.

A pure module; its types are in ``placement.py``. The reconciler hands it frozen
snapshots of each node's capacity (with what is already reserved there) and the
replicas it wants; it answers with a `Placement` or a `Refusal` carrying every
candidate's `Verdict`. Nothing here reads the store, talks to an agent or keeps state
between calls, so the same inputs always give the same answer, and `ctl explain` and
`ctl model plan` show exactly the reasoning placement used.

Filters, in order: node Ready and not cordoned; engine installed or installable, and
the host of a machine type it runs on; role label; node selector; host memory; disk
(skipped where the weights already are); CPU cores; cards (of a compute capability
and driver the engine runs on: ``enginerules``). Nodes where the model just failed
are passed over while any other node fits. Scores: weights already on the node first, then binpack
(least free after placing) or spread (most free), ties broken by node id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from llmgw.modelkit.enginerules import RULES
from llmgw.server.catalog import spanning
from llmgw.server.catalog.blocks import Order
from llmgw.server.catalog.placement import (
    GIB,
    ROLE_LABEL,
    Card,
    NodeCapacity,
    Placement,
    Refusal,
    Request,
    Strategy,
    Verdict,
)

__all__ = [
    "Card",
    "NodeCapacity",
    "Placement",
    "ROLE_LABEL",
    "Refusal",
    "Request",
    "Strategy",
    "Verdict",
    "explain",
    "explain_spans",
    "place",
    "place_many",
    "static_reasons",
]


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _cores(n: float) -> str:
    return f"{n:g}"


class _State:
    """A node's free resources, mutable while one place_many call reserves them."""

    __slots__ = ("node", "memory", "cpu", "disk", "card_free", "top", "pending")

    def __init__(self, node: NodeCapacity) -> None:
        self.node = node
        self.memory = node.memory_available - node.memory_reserved
        self.cpu = node.cpu_cores - node.cpu_reserved
        self.disk = node.disk_free
        self.card_free = [c.memory_free - c.reserved for c in node.cards]
        # Card frees largest first: `top[k - 1]` is the most each of k cards has free.
        self.top = sorted(self.card_free, reverse=True)
        # Sources already placed here in this call: their weights arrive once.
        self.pending: set[str] = set()

    def card_total(self) -> int:
        return sum(f for f in self.card_free if f > 0)

    def resource(self, uses_cards: bool) -> int:
        return self.card_total() if uses_cards else self.memory

    def has_weights(self, source: str) -> bool:
        return source in self.node.weights or source in self.pending

    def fitting(self, req: Request) -> list[int]:
        """Positions of the cards one of ``req``'s could be: room, usable, its class,
        and no MIG instance when it asks for more than one card (instances share no
        memory or NVLink, so a replica gets one at most)."""
        cards = self.node.cards
        return [
            i
            for i, f in enumerate(self.card_free)
            if f >= req.card_memory
            and cards[i].unusable is None
            and _engine_refusal(cards[i], req.engine) is None
            and cards[i].is_class(req.card_class)
            and not (req.cards > 1 and cards[i].mig_instance)
        ]

    def choose_cards(self, req: Request, strategy: Strategy) -> list[int] | None:
        """Positions of the cards to use, or None; the same state gives the same set."""
        cards = self.node.cards
        fits = self.fitting(req)
        if len(fits) < req.cards:
            return None
        # Binpack fills the fullest card that fits; spread takes the emptiest.
        sign = 1 if strategy == "binpack" else -1
        fits.sort(key=lambda i: (sign * self.card_free[i], cards[i].index))
        return sorted(fits[: req.cards], key=lambda i: cards[i].index)

    def reserve(self, req: Request, chosen: Sequence[int]) -> None:
        self.memory -= req.memory
        self.cpu -= req.cpu_cores
        if not self.has_weights(req.source) and self.disk is not None:
            self.disk -= req.disk
        self.pending.add(req.source)
        for i in chosen:
            self.card_free[i] -= req.card_memory
        if chosen:
            self.top = sorted(self.card_free, reverse=True)


def _engine_refusal(card: Card, engine: str) -> str | None:
    """Why ``engine`` cannot use this card (its compute capability or driver)."""
    rules = RULES.get(engine)
    return rules.card_refusal(card.compute_capability, card.driver) if rules else None


def static_reasons(node: NodeCapacity, req: Request) -> list[str]:
    """Filters that depend on the node and request only, never on reservations."""
    reasons: list[str] = []
    if not node.ready:
        reasons.append("node not Ready")
    if node.cordoned:
        reasons.append("node cordoned")
    if req.engine not in node.engines_installed and req.engine not in node.engines_installable:
        reasons.append(f"engine: {req.engine} neither installed nor installable")
    elif (
        req.engine_version
        and req.engine not in node.engines_configured
        and req.engine_version not in node.engine_versions.get(req.engine, ())
    ):
        said = node.engine_progress.get(req.engine) or "not installed yet"
        reasons.append(f"engine: {req.engine} {req.engine_version} not on this node: {said}")
    rules = RULES.get(req.engine)
    host = rules.host_refusal(node.arch) if rules else None
    if host is not None:
        reasons.append(f"engine: {host}")
    has, wants = node.labels.get(ROLE_LABEL), req.wanted_role
    if has is not None and has != wants:
        asks = f"asks role {wants!r}" if wants else "asks no role"
        reasons.append(f"role: node is for role {has!r}, request {asks}")
    elif has is None and wants is not None:
        reasons.append(f"role: request asks role {wants!r}, node has none")
    for key, want in sorted(req.selector.items()):
        if key == ROLE_LABEL:
            continue  # judged above, with the role rule's own words
        got = node.labels.get(key)
        if got != want:
            reasons.append(f"selector: {key}={want} wanted, node has {key}={got or '(none)'}")
    return reasons


def _dynamic_reasons(
    st: _State, req: Request, strategy: Strategy, all_reasons: bool
) -> tuple[list[str], list[str], list[int]]:
    """Resource filters against current free figures: (reasons, notes, cards chosen).

    With `all_reasons` false it stops at the first refusal: the fast path only needs
    to know the node does not fit, and formatting figures is most of the cost.
    """
    reasons: list[str] = []
    notes: list[str] = []
    if req.memory > st.memory:
        reasons.append(f"memory: needs {_gib(req.memory)}, {_gib(max(st.memory, 0))} free")
        if not all_reasons:
            return reasons, notes, []
    if st.has_weights(req.source):
        notes.append("disk: weights already here")
    elif st.disk is None:
        if req.disk:
            notes.append("disk: free space not reported, not checked")
    elif req.disk > st.disk:
        reasons.append(f"disk: needs {_gib(req.disk)}, {_gib(max(st.disk, 0))} free")
        if not all_reasons:
            return reasons, notes, []
    if req.cpu_cores > st.cpu:
        reasons.append(
            f"cpu: needs {_cores(req.cpu_cores)} cores, {_cores(max(st.cpu, 0))} free"
            f" of {_cores(st.node.cpu_cores)}"
        )
        if not all_reasons:
            return reasons, notes, []
    chosen: list[int] = []
    if req.cards:
        picked = st.choose_cards(req, strategy)
        if picked is None:
            reasons.append(_cards_reason(st, req))
        else:
            chosen = picked
    return reasons, notes, chosen


def _cards_reason(st: _State, req: Request) -> str:
    """Why no set of the node's cards fits: each card's free memory, or why it is out."""
    cards = st.node.cards

    def name(c: Card) -> str:
        return f"card {c.index} ({c.uuid[:12]})" if c.mig_instance else f"card {c.index}"

    def said_of(c: Card, free: int) -> str:
        why = c.unusable or _engine_refusal(c, req.engine)
        return f"{name(c)}: {why}" if why else f"{name(c)}: {_gib(max(free, 0))} free"

    frees = ", ".join(said_of(c, f) for c, f in zip(cards, st.card_free, strict=True))
    each = f"{_gib(req.card_memory)} free each"
    if req.card_class:
        each = f"{each}, of class {req.card_class}"
    said = f"cards: needs {req.cards} with {each}, {len(st.fitting(req))} have it"
    if req.cards > 1 and any(c.mig_instance for c in cards):
        said += "; a replica gets one MIG instance at most (ask for 1 card, or turn MIG off)"
    return said + (f" ({frees})" if frees else "")


def _order(st: _State, req: Request, strategy: Strategy) -> spanning.OrderKey:
    """Sort key, smallest first: not avoided, holds weights, binpack/spread, node id."""
    free = st.resource(req.cards > 0)
    return (
        st.node.id in req.avoid,
        req.source not in st.node.weights,
        free if strategy == "binpack" else -free,
        st.node.id,
    )


def explain(
    request: Request, nodes: Iterable[NodeCapacity], strategy: Strategy = "binpack"
) -> list[Verdict]:
    """Every node's verdict for one request, sorted by node id, with all reasons."""
    states = sorted((_State(n) for n in nodes), key=lambda s: s.node.id)
    judged: list[tuple[_State, list[str], list[str], list[int]]] = []
    for st in states:
        reasons = static_reasons(st.node, request)
        dyn, notes, chosen = _dynamic_reasons(st, request, strategy, all_reasons=True)
        judged.append((st, reasons + dyn, notes, chosen))
    fitting = sorted((j for j in judged if not j[1]), key=lambda j: _order(j[0], request, strategy))
    others_fit = any(j[0].node.id not in request.avoid for j in fitting)
    ranks = {j[0].node.id: i + 1 for i, j in enumerate(fitting)}
    verdicts: list[Verdict] = []
    for st, reasons, notes, chosen in judged:
        nid = st.node.id
        if nid in request.avoid:
            if reasons:
                notes = [*notes, "model failed here recently"]
            elif others_fit:
                reasons = ["passed over: model failed here recently and another node fits"]
            else:
                notes = [*notes, "model failed here recently; used as no other node fits"]
        ok = not reasons
        uses_cards = request.cards > 0
        need = request.cards * request.card_memory if uses_cards else request.memory
        verdicts.append(
            Verdict(
                node=nid,
                ok=ok,
                reasons=tuple(reasons),
                notes=tuple(notes),
                score=st.resource(uses_cards) - need if ok else None,
                rank=ranks.get(nid) if ok else None,
                holds_weights=request.source in st.node.weights,
                cards=tuple(st.node.cards[i].uuid for i in chosen) if ok else (),
            )
        )
    return verdicts


def place(
    request: Request, nodes: Iterable[NodeCapacity], strategy: Strategy = "binpack"
) -> Placement | Refusal:
    """Place one replica; the same as `place_many` with a list of one."""
    return place_many([request], nodes, strategy)[0]


# What makes requests share a group of nodes (those passing the static filters): engine,
# engine version, role, selector, whether it uses cards, card class.
GroupKey = tuple[str, str | None, str | None, tuple[tuple[str, str], ...], bool, str | None]
# Everything placement reads from a request (not the model's name): engine, version,
# source, memory, disk, cores, cards, card memory, role, selector, nodes avoided, class.
Shape = tuple[
    str,
    str | None,
    str,
    int,
    int,
    float,
    int,
    int,
    str | None,
    tuple[tuple[str, str], ...],
    tuple[str, ...],
    str | None,
]


class _Fleet:
    """Free figures for one place_many call, indexed so a placement is cheap.

    Nodes passing a request's static filters form a group (shared by every request
    with the same engine, role, selector and whether it uses cards), kept sorted by
    the strategy's key. A request bisects to the first node with enough of the scored
    resource and walks on until the dynamic filters pass, passing over blocks of
    nodes short of memory, cores, disk or cards, so it looks at a handful of nodes
    rather than the fleet. Reserving re-sorts that node in each of its groups.
    """

    def __init__(self, nodes: Iterable[NodeCapacity], strategy: Strategy) -> None:
        self.strategy = strategy
        self.states = {n.id: _State(n) for n in nodes}
        self.holders: dict[str, list[str]] = {}
        for nid in sorted(self.states):
            for src in self.states[nid].node.weights:
                self.holders.setdefault(src, []).append(nid)
        self.groups: dict[GroupKey, tuple[bool, Order[_State], set[str]]] = {}
        self.memberships: dict[str, list[tuple[bool, Order[_State]]]] = {}
        # Once a shape is refused it stays refused: a call only ever takes room away.
        self.refused: set[Shape] = set()
        # Per group, the needs of refused requests: one asking at least as much of
        # every resource is refused without a walk, which on a full fleet is the
        # whole group. Disk counts only while no node holds or awaits the source,
        # as a node holding it would skip the disk check.
        self.refused_needs: dict[int, list[tuple[int, float, int, int, int]]] = {}
        self.pending_sources: set[str] = set()

    def _needs(self, req: Request) -> tuple[int, float, int, int, int]:
        held = req.source in self.holders or req.source in self.pending_sources
        return (req.memory, req.cpu_cores, req.cards, req.card_memory, 0 if held else req.disk)

    def dominated(self, req: Request) -> bool:
        needs = self._needs(req)
        past = self.refused_needs.get(id(self.group(req)[1]), ())
        return any(all(n >= p for n, p in zip(needs, old, strict=True)) for old in past)

    def remember_refusal(self, req: Request) -> None:
        if req.source in self.holders or req.source in self.pending_sources:
            return  # its disk figure would not bound another request's
        past = self.refused_needs.setdefault(id(self.group(req)[1]), [])
        if len(past) < 64:  # a cache: dropping entries only costs a walk
            past.append((req.memory, req.cpu_cores, req.cards, req.card_memory, req.disk))

    def _key(self, st: _State, uses_cards: bool) -> tuple[int, str]:
        free = st.resource(uses_cards)
        return (free if self.strategy == "binpack" else -free, st.node.id)

    def group(self, req: Request) -> tuple[bool, Order[_State], set[str]]:
        uses_cards = req.cards > 0
        # The card class too: a refusal for one class must not stand for another.
        gkey: GroupKey = (
            req.engine,
            req.engine_version,
            req.wanted_role,
            tuple(sorted(req.selector.items())),
            uses_cards,
            req.card_class,
        )
        found = self.groups.get(gkey)
        if found is None:
            members = [st for st in self.states.values() if not static_reasons(st.node, req)]
            order = Order(sorted(self._key(st, uses_cards) for st in members), self.states)
            found = (uses_cards, order, {st.node.id for st in members})
            self.groups[gkey] = found
            for st in members:
                self.memberships.setdefault(st.node.id, []).append((uses_cards, order))
        return found

    def fits(self, st: _State, req: Request) -> list[int] | None:
        reasons, _, chosen = _dynamic_reasons(st, req, self.strategy, all_reasons=False)
        return None if reasons else chosen

    def candidates(self, req: Request) -> list[spanning.Candidate]:
        """Every node that could hold its share of a replica spanning nodes."""
        uses_cards, _, members = self.group(req)
        out = []
        for nid in sorted(members):
            st = self.states[nid]
            if self.fits(st, req) is not None:
                n = st.node
                key = _order(st, req, self.strategy)
                out.append(spanning.Candidate(nid, key, n.nvlink_domain, n.fabric, n.leaves))
        return out

    def place_span(self, req: Request) -> Placement | Refusal:
        """Place one replica on ``req.nodes`` nodes, each taking ``req``'s figures."""
        found = spanning.spans(self.candidates(req), req.nodes)
        best = found[0] if found and found[0].ok else None
        if best is None:
            return Refusal(req, lambda: self.explain(req), tuple(found))
        placed: list[tuple[str, tuple[str, ...]]] = []
        for nid in best.chosen:
            st = self.states[nid]
            chosen = self.fits(st, req) or []
            self.reserve(st, req, chosen)
            placed.append((nid, tuple(st.node.cards[i].uuid for i in chosen)))
        (leader, cards), *workers = placed
        notes = (f"{best.describe()}: {', '.join(best.chosen)}", *best.notes)
        return Placement(req, leader, cards, notes, tuple(workers), best.kind == "nvlink")

    def place(self, req: Request) -> Placement | Refusal:
        if req.nodes > 1:
            return self.place_span(req)
        # Everything placement reads from a request; the model's name is not part of it.
        shape: Shape = (
            req.engine,
            req.engine_version,
            req.source,
            req.memory,
            req.disk,
            req.cpu_cores,
            req.cards,
            req.card_memory,
            req.wanted_role,
            tuple(sorted(req.selector.items())),
            tuple(sorted(req.avoid)),
            req.card_class,
        )
        if shape in self.refused or self.dominated(req):
            return Refusal(req, lambda: self.explain(req))
        uses_cards, order, members = self.group(req)
        fallback: tuple[_State, list[int]] | None = None
        best: tuple[_State, list[int]] | None = None
        # Nodes holding the weights come first whatever their free figures.
        held = [self.states[n] for n in self.holders.get(req.source, ()) if n in members]
        held.sort(key=lambda s: self._key(s, uses_cards))
        for st in held:
            chosen = self.fits(st, req)
            if chosen is None:
                continue
            if st.node.id not in req.avoid:
                best = (st, chosen)
                break
            fallback = fallback or (st, chosen)
        if best is None:
            need = req.cards * req.card_memory if uses_cards else req.memory
            if self.strategy == "binpack":
                lo, hi = (need, ""), None
            else:
                lo, hi = None, (-need, "\U0010ffff")
            # Walked nodes lack the weights, so unless a node awaits them, disk counts.
            check_disk = req.source not in self.pending_sources
            for st in order.candidates(req, lo, hi, check_disk):
                if req.source in st.node.weights:
                    continue  # already judged above
                chosen = self.fits(st, req)
                if chosen is None:
                    continue
                if st.node.id not in req.avoid:
                    best = (st, chosen)
                    break
                fallback = fallback or (st, chosen)
        notes: tuple[str, ...] = ()
        if best is None and fallback is not None:
            best = fallback
            notes = ("model failed here recently; used as no other node fits",)
        if best is None:
            self.refused.add(shape)
            self.remember_refusal(req)
            return Refusal(req, lambda: self.explain(req))
        st, chosen = best
        self.reserve(st, req, chosen)
        return Placement(req, st.node.id, tuple(st.node.cards[i].uuid for i in chosen), notes)

    def reserve(self, st: _State, req: Request, chosen: Sequence[int]) -> None:
        groups = self.memberships.get(st.node.id, [])
        old = [(order, self._key(st, uses_cards)) for uses_cards, order in groups]
        st.reserve(req, chosen)
        self.pending_sources.add(req.source)
        for (uses_cards, order), (_, key) in zip(groups, old, strict=True):
            order.remove(key)
            order.insert(self._key(st, uses_cards))

    def explain(self, req: Request) -> list[Verdict]:
        nodes = [self._snapshot(st) for st in self.states.values()]
        return explain(req, nodes, self.strategy)

    @staticmethod
    def _snapshot(st: _State) -> NodeCapacity:
        """The node as this call has left it, so a refusal shows current figures."""
        n = st.node
        cards = tuple(
            replace(c, reserved=c.memory_free - f)
            for c, f in zip(n.cards, st.card_free, strict=True)
        )
        return NodeCapacity(
            id=n.id,
            ready=n.ready,
            cordoned=n.cordoned,
            labels=n.labels,
            cpu_cores=n.cpu_cores,
            cpu_reserved=n.cpu_cores - st.cpu,
            memory_total=n.memory_total,
            memory_available=n.memory_available,
            memory_reserved=n.memory_available - st.memory,
            disk_free=st.disk,
            weights=n.weights | frozenset(st.pending),
            engines_installed=n.engines_installed,
            engines_installable=n.engines_installable,
            engine_versions=n.engine_versions,
            engines_configured=n.engines_configured,
            engine_progress=n.engine_progress,
            cards=cards,
            nvlink_domain=n.nvlink_domain,
            fabric=n.fabric,
            leaves=n.leaves,
            arch=n.arch,
        )


def explain_spans(
    request: Request, nodes: Iterable[NodeCapacity], strategy: Strategy = "binpack"
) -> list[spanning.Span]:
    """Every set of nodes a replica spanning ``request.nodes`` could go to, best first."""
    return spanning.spans(_Fleet(nodes, strategy).candidates(request), request.nodes)


def place_many(
    requests: Iterable[Request], nodes: Iterable[NodeCapacity], strategy: Strategy = "binpack"
) -> list[Placement | Refusal]:
    """Place replicas in order, each seeing the room the ones before it took."""
    fleet = _Fleet(nodes, strategy)
    return [fleet.place(req) for req in requests]
