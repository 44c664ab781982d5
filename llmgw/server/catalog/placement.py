"""What placement speaks of: a node's capacity, a replica's request, and the answers
(a placement, or a refusal with every node's verdict). Plain frozen data; the judging is
in ``scheduler.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict

from llmgw.wire.admin.catalog import SpanJson, VerdictJson
from llmgw.wire.hardware import GPU
from llmgw.wire.messages import EngineInfo
from llmgw.wire.states import NodeState

if TYPE_CHECKING:
    from llmgw.server.catalog.spanning import Span
    from llmgw.server.fleet.figures import NodeFigures
    from llmgw.server.fleet.nodeview import NodeView


ROLE_LABEL = "llmgw.role"
GIB = 1024**3

Strategy = Literal["binpack", "spread"]


MIG_EMPTY = (
    "MIG mode is on and no instance is carved (carve some: `nvidia-smi mig -cgi PROFILES -C`,"
    " or turn MIG off)"
)


@dataclass(frozen=True)
class Card:
    """One accelerator as placement sees it; `reserved` is held by placed replicas."""

    uuid: str
    index: int
    name: str = ""
    memory_total: int = 0
    memory_free: int = 0
    reserved: int = 0
    # A MIG instance: a replica may have one, never more.
    mig_instance: bool = False
    # Why no replica may use it ("MIG mode is on and no instance is carved").
    unusable: str | None = None
    # As NVML says them ("8.6", "580.65.06"); None where the node did not.
    compute_capability: str | None = None
    driver: str | None = None

    def is_class(self, card_class: str | None) -> bool:
        """Whether the card is of ``card_class`` (any, when None): its MIG class or
        product name, letter case aside."""
        return card_class is None or self.name.lower() == card_class.lower()

    @classmethod
    def of(cls, gpu: GPU, reserved: int) -> Card:
        """A card as its node reports it; a MIG-mode card with no instance is unusable."""
        unusable = MIG_EMPTY if gpu.mig_mode and gpu.mig_parent is None else None
        total = gpu.memory_total or 0
        return cls(
            uuid=gpu.uuid,
            index=gpu.index,
            name=gpu.mig_class or gpu.name,
            memory_total=total,
            memory_free=0 if unusable else total - (gpu.memory_used or 0),
            reserved=reserved,
            mig_instance=gpu.mig_parent is not None,
            unusable=unusable,
            compute_capability=gpu.compute_capability,
            driver=gpu.driver,
        )


@dataclass(frozen=True)
class NodeCapacity:
    """A node's facts plus what placed replicas already hold on it."""

    id: str
    ready: bool = True
    cordoned: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    cpu_cores: float = 0.0
    cpu_reserved: float = 0.0
    memory_total: int = 0
    memory_available: int = 0
    memory_reserved: int = 0
    # None means the agent reported no local disk: unknown, not full.
    disk_free: int | None = None
    weights: frozenset[str] = frozenset()
    engines_installed: frozenset[str] = frozenset()
    engines_installable: frozenset[str] = frozenset()
    # The versions of each engine the node installed itself, the engines its operator
    # named on purpose (any version: theirs), and what converging on each is doing.
    engine_versions: Mapping[str, frozenset[str]] = field(default_factory=dict)
    engines_configured: frozenset[str] = frozenset()
    engine_progress: Mapping[str, str] = field(default_factory=dict)
    cards: tuple[Card, ...] = ()
    # How it is wired to the others (``fleet/wiring.py``), for replicas spanning nodes.
    nvlink_domain: str | None = None
    fabric: str | None = None
    leaves: tuple[str, ...] = ()
    # Its machine type (``x86_64``, ``aarch64``); None where it did not say.
    arch: str | None = None

    @classmethod
    def from_view(
        cls,
        view: NodeView,
        *,
        cpu_reserved: float = 0.0,
        memory_reserved: int = 0,
        card_reserved: Mapping[str, int] | None = None,
        weights: Iterable[str] = (),
        figures: NodeFigures | None = None,
    ) -> NodeCapacity:
        """A node's typed figures (``NodeView.figures``) plus what only the control
        plane knows: what its replicas hold, the weights it has, its scheduling marks."""
        figures = figures or view.figures()
        card_reserved = card_reserved or {}
        cards = tuple(Card.of(g, card_reserved.get(g.uuid, 0)) for g in figures.gpus)
        # A model file cannot span filesystems, and a shared filer's free space is
        # everyone's, so the room a node has is its largest local filesystem.
        local = [d.free for d in figures.disks or () if not d.shared]
        return cls(
            id=view.id,
            ready=view.state == NodeState.READY,
            cordoned=view.cordoned or view.draining,
            labels=dict(view.labels),
            cpu_cores=float(figures.cpu_count or 0),
            cpu_reserved=cpu_reserved,
            memory_total=figures.memory_total or 0,
            memory_available=figures.memory_available or 0,
            memory_reserved=memory_reserved,
            disk_free=max(local) if local else None,
            weights=frozenset(weights),
            engines_installed=view.engine_names(),
            engines_installable=frozenset(view.installable),
            engine_versions=_versions(view.engines),
            engines_configured=frozenset(e.name for e in view.engines if e.origin == "configured"),
            engine_progress=dict(view.engine_progress),
            cards=cards,
            arch=view.facts.arch if view.facts else None,
        )


def _versions(engines: Iterable[EngineInfo]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for e in engines:
        if e.origin == "installed" and e.version:
            found.setdefault(e.name, set()).add(e.version)
    return {k: frozenset(v) for k, v in found.items()}


@dataclass(frozen=True)
class Request:
    """One replica to place: what a profile asks of a node."""

    model: str
    profile: str
    engine: str
    source: str
    memory: int = 0
    disk: int = 0
    cpu_cores: float = 0.0
    cards: int = 0
    card_memory: int = 0
    role: str | None = None
    selector: Mapping[str, str] = field(default_factory=dict)
    # Only cards of this class (a product name or a MIG class), when set.
    card_class: str | None = None
    # Nodes where this model failed recently (the reconciler's memory).
    avoid: frozenset[str] = frozenset()
    # The engine version the fleet runs (``engines:``); None asks for none in particular.
    engine_version: str | None = None
    # Nodes one replica spans; the figures above are what it takes on each.
    nodes: int = 1

    @property
    def wanted_role(self) -> str | None:
        # A selector naming the role label asks for that role as surely as `role` does.
        return self.role if self.role is not None else self.selector.get(ROLE_LABEL)


@dataclass(frozen=True)
class Verdict:
    """One node's answer to one request, as `ctl explain` prints it."""

    node: str
    ok: bool
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # Bytes free after placing (card memory when cards are asked, host memory if not).
    score: int | None = None
    rank: int | None = None  # 1 is where the replica would go
    holds_weights: bool = False
    cards: tuple[str, ...] = ()

    def as_json(self) -> VerdictJson:
        return {
            "node": self.node,
            "ok": self.ok,
            "reasons": list(self.reasons),
            "notes": list(self.notes),
            "score": self.score,
            "rank": self.rank,
            "holds_weights": self.holds_weights,
            "cards": list(self.cards),
        }


class WorkerJson(TypedDict):
    node: str
    cards: list[str]


class PlacementJson(TypedDict):
    """Where a replica goes; ``nodes``, ``workers`` and ``nvlink`` only for one spanning
    nodes."""

    model: str
    profile: str
    node: str
    cards: list[str]
    notes: list[str]
    nodes: NotRequired[list[str]]
    workers: NotRequired[list[WorkerJson]]
    nvlink: NotRequired[bool]


class RefusalJson(TypedDict):
    """Nowhere fits: every node's verdict (and, spanning nodes, every set's)."""

    model: str
    profile: str
    node: None
    verdicts: list[VerdictJson]
    spans: NotRequired[list[SpanJson]]


@dataclass(frozen=True)
class Placement:
    request: Request
    node: str
    cards: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # A replica spanning nodes: (node, cards) of ranks 1.. (``node`` is rank 0's), and
    # whether every card is in one NVLink domain.
    workers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    nvlink: bool = False

    def as_json(self) -> PlacementJson:
        out: PlacementJson = {
            "model": self.request.model,
            "profile": self.request.profile,
            "node": self.node,
            "cards": list(self.cards),
            "notes": list(self.notes),
        }
        if self.request.nodes > 1:
            out["nodes"] = [self.node, *(n for n, _ in self.workers)]
            out["workers"] = [{"node": n, "cards": list(c)} for n, c in self.workers]
            out["nvlink"] = self.nvlink
        return out


@dataclass(frozen=True)
class Refusal:
    """Nowhere fits. Verdicts are judged when first read: a batch that refuses
    thousands of replicas should not pay for explaining each one it never shows.
    From `place_many` they judge the fleet as the whole batch left it."""

    request: Request
    judge: Callable[[], Sequence[Verdict]] = field(repr=False, compare=False)
    # For a replica spanning nodes: every set of nodes judged (``spanning.Span``).
    spans: tuple[Span, ...] = ()

    @cached_property
    def verdicts(self) -> tuple[Verdict, ...]:
        return tuple(self.judge())

    @property
    def reason(self) -> str:
        if self.request.nodes > 1:
            return span_reason(self.request.nodes, self.spans)
        if not self.verdicts:
            return "no nodes"
        return "; ".join(f"{v.node}: {', '.join(v.reasons)}" for v in self.verdicts)

    def as_json(self) -> RefusalJson:
        out: RefusalJson = {
            "model": self.request.model,
            "profile": self.request.profile,
            "node": None,
            "verdicts": [v.as_json() for v in self.verdicts],
        }
        if self.request.nodes > 1:
            out["spans"] = [s.as_json() for s in self.spans]
        return out


def span_reason(nodes: int, spans: Sequence[Span]) -> str:
    """Why no set of ``nodes`` nodes was found, set by set."""
    if not spans:
        return f"no node could hold its share of a replica spanning {nodes} nodes"
    said = "; ".join(f"{s.describe()}: {s.reason}" for s in spans)
    return f"no {nodes} nodes wired together fit ({said}); a set never mixes fabrics"
