"""Which set of nodes one replica spanning N nodes goes to, judged by how they are wired.

The nodes that could each hold their share are grouped by what joins them, best wire
first: an NVLink domain (every card in one NVL72-class rack: NCCL goes over NVLink
between the trays); else one InfiniBand fabric, preferring nodes under the same leaf
switches over a set that reaches through the spine; else, for nodes with no
InfiniBand at all, Ethernet. A set never mixes two fabrics, nor a fabric with nodes
outside it: NCCL would fall back to sockets for the whole replica without saying so.

Pure: the scheduler hands in the nodes that fit with their order keys (the same
scores a one-node replica is placed by); the answer is every candidate set, best
first, each with the nodes it would take or why it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmgw.wire.admin.catalog import SpanJson

Kind = Literal["nvlink", "fabric", "ethernet"]
# A node's placement score, smallest first (``scheduler._order``): passed over, lacks the
# weights, the strategy's figure (free bytes, negated to spread), its id.
OrderKey = tuple[bool, bool, int, str]
# A set's score: its members' first three figures summed; () for no set.
SetScore = tuple[int, ...]
_TIER: dict[str, int] = {"nvlink": 0, "fabric": 1, "ethernet": 2}


@dataclass(frozen=True)
class Candidate:
    """A node that could hold its share, with its placement score (smaller is better:
    not passed over, holds the weights, binpack or spread) and its wiring."""

    node: str
    key: OrderKey
    nvlink_domain: str | None = None
    fabric: str | None = None
    leaves: tuple[str, ...] = ()


@dataclass(frozen=True)
class Span:
    """One place a replica could go: a domain, a fabric, or the Ethernet-only nodes."""

    kind: Kind
    id: str
    fitting: tuple[str, ...]
    needed: int
    chosen: tuple[str, ...] = ()
    # How many sets of leaf switches the chosen nodes hang under; 0 when not known.
    leaf_sets: int = 0
    notes: tuple[str, ...] = ()
    score: SetScore = field(default=(), compare=False)

    @property
    def ok(self) -> bool:
        return len(self.chosen) == self.needed

    @property
    def reason(self) -> str:
        if self.ok:
            return ""
        return f"{len(self.fitting)} node(s) fit, {self.needed} needed"

    def describe(self) -> str:
        if self.kind == "nvlink":
            return f"NVLink domain {self.id}"
        if self.kind == "fabric":
            return f"InfiniBand fabric {self.id}"
        return "nodes without InfiniBand"

    def as_json(self) -> SpanJson:
        return {
            "kind": self.kind,
            "id": self.id or None,
            "ok": self.ok,
            "fitting": list(self.fitting),
            "needed": self.needed,
            "chosen": list(self.chosen),
            "leaf_sets": self.leaf_sets or None,
            "notes": list(self.notes),
            "reason": self.reason,
        }


def _best(cands: Sequence[Candidate], n: int) -> list[Candidate]:
    return sorted(cands, key=lambda c: c.key)[:n]


def _score(chosen: Sequence[Candidate]) -> SetScore:
    """A set's score from its members' keys: fewest passed over, most holding the
    weights, then the strategy's figure summed."""
    if not chosen:
        return ()
    keys = [c.key for c in chosen]
    return (sum(k[0] for k in keys), sum(k[1] for k in keys), sum(k[2] for k in keys))


def _whole(kind: Kind, name: str, group: Sequence[Candidate], n: int, note: str) -> Span:
    """A set where any n nodes are as well joined as any others: the best-scored n."""
    fitting = tuple(c.node for c in sorted(group, key=lambda c: c.key))
    chosen = _best(group, n) if len(group) >= n else []
    notes = (note,) if chosen else ()
    return Span(
        kind, name, fitting, n, tuple(c.node for c in chosen), notes=notes, score=_score(chosen)
    )


def _fabric_span(fabric: str, cands: Sequence[Candidate], n: int) -> Span:
    fitting = tuple(c.node for c in sorted(cands, key=lambda c: c.key))
    if len(cands) < n:
        return Span("fabric", fabric, fitting, n)
    groups: dict[tuple[str, ...], list[Candidate]] = {}
    for c in cands:
        groups.setdefault(c.leaves, []).append(c)
    if all(not leaves for leaves in groups):
        chosen = _best(cands, n)
        note = "its leaf switches are not known yet (no map of the fabric read)"
        return Span("fabric", fabric, fitting, n, tuple(c.node for c in chosen), 0, (note,))
    whole = [g for leaves, g in groups.items() if leaves and len(g) >= n]
    if whole:
        chosen = min((_best(g, n) for g in whole), key=lambda b: (_score(b), b[0].node))
        return Span(
            "fabric",
            fabric,
            fitting,
            n,
            tuple(c.node for c in chosen),
            1,
            ("all under the same leaf switches",),
            _score(chosen),
        )
    # Take whole leaf sets, largest first, so the replica crosses the spine as little
    # as it can; nodes whose leaves are not known come last.
    order = sorted(
        groups.items(),
        key=lambda kv: (not kv[0], -len(kv[1]), min(c.key for c in kv[1])),
    )
    chosen, used = [], 0
    for _, group in order:
        if len(chosen) >= n:
            break
        chosen += _best(group, n - len(chosen))
        used += 1
    note = f"across {used} sets of leaf switches: traffic between them crosses the spine"
    return Span(
        "fabric", fabric, fitting, n, tuple(c.node for c in chosen), used, (note,), _score(chosen)
    )


def spans(cands: Sequence[Candidate], n: int) -> list[Span]:
    """Every set the replica could go to, best first: the first that is ``ok`` is
    where it goes. The leader (rank 0) is the chosen set's best-scored node."""
    out: list[Span] = []
    domains: dict[str, list[Candidate]] = {}
    fabrics: dict[str, list[Candidate]] = {}
    ethernet: list[Candidate] = []
    for c in cands:
        if c.nvlink_domain:
            domains.setdefault(c.nvlink_domain, []).append(c)
        if c.fabric:
            fabrics.setdefault(c.fabric, []).append(c)
        elif not c.nvlink_domain:
            ethernet.append(c)
    mnnvl = "NCCL joins the cards over NVLink between the trays (NCCL_MNNVL_ENABLE=1)"
    for domain, group in sorted(domains.items()):
        out.append(_whole("nvlink", domain, group, n, mnnvl))
    for fabric, group in sorted(fabrics.items()):
        out.append(_fabric_span(fabric, group, n))
    if ethernet:
        slow = "no InfiniBand between these nodes: the replica's traffic goes over Ethernet"
        out.append(_whole("ethernet", "", ethernet, n, slow))
    out.sort(
        key=lambda s: (not s.ok, _TIER[s.kind], s.leaf_sets or 1 if s.ok else 0, s.score, s.id)
    )
    return out
