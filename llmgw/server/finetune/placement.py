"""Which node trains a fine-tune, and on what: a pure judge over the nodes as they are.

The rules, in order, per node:

1. ``--node`` pins the choice to that node (any other is not looked at).
2. The node must be Ready and not cordoned or draining.
3. Nothing else may be training there (one fine-tune a node: training takes a card's
   or the machine's memory whole, and its peak is not known in advance).
4. A node with cards trains on one card with at least ``mib`` MiB free (the card with
   the most free memory); a node without cards trains on the CPU, with ``mib`` MiB of
   RAM available. A figure not read is no room: nothing is assumed.

Of the nodes that pass, a node with a card goes before a CPU node, then the most free
memory, then the name (the same fleet gives the same choice). A refusal names each
node and why it was passed over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.server.refusal import Refusal

MIB = 1024 * 1024


@dataclass(frozen=True)
class Card:
    uuid: str
    free_mib: int | None


@dataclass(frozen=True)
class Candidate:
    """A node as the judge sees it (``service.candidates`` reads the registry)."""

    node: str
    ready: bool
    schedulable: bool
    training: str | None  # the id of the fine-tune running there, if one is
    cards: tuple[Card, ...]
    ram_free_mib: int | None


@dataclass(frozen=True)
class Placement:
    node: str
    device: str  # "cuda" or "cpu"
    cards: tuple[str, ...]
    free_mib: int


def _judge(c: Candidate, mib: int) -> Placement | str:
    if not c.ready:
        return "not Ready"
    if not c.schedulable:
        return "cordoned or draining"
    if c.training is not None:
        return f"already training {c.training}"
    if c.cards:
        known = [card for card in c.cards if card.free_mib is not None]
        if not known:
            return "its cards' free memory is not read yet"
        best = max(known, key=lambda card: (card.free_mib or 0, card.uuid))
        free = best.free_mib or 0
        if free < mib:
            return f"its freest card has {free:,} MiB free; {mib:,} MiB wanted"
        return Placement(c.node, "cuda", (best.uuid,), free)
    if c.ram_free_mib is None:
        return "its available memory is not read yet"
    if c.ram_free_mib < mib:
        return f"no card, and {c.ram_free_mib:,} MiB of RAM available; {mib:,} MiB wanted"
    return Placement(c.node, "cpu", (), c.ram_free_mib)


def choose(candidates: Sequence[Candidate], mib: int, pinned: str | None = None) -> Placement:
    """The node (and card) that trains a fine-tune wanting ``mib`` MiB, or a Refusal
    naming each node and why it cannot."""
    if pinned is not None:
        candidates = [c for c in candidates if c.node == pinned]
        if not candidates:
            raise Refusal(
                404, "not_found", f"no node {pinned!r}; `llmgw ctl nodes` lists them", "node"
            )
    fits: list[Placement] = []
    why: list[str] = []
    for c in sorted(candidates, key=lambda c: c.node):
        judged = _judge(c, mib)
        if isinstance(judged, Placement):
            fits.append(judged)
        else:
            why.append(f"{c.node}: {judged}")
    if not fits:
        said = "; ".join(why) if why else "the cluster has no nodes"
        raise Refusal(
            409,
            "no_room",
            f"no node can train with {mib:,} MiB now ({said}); free a card, pass a smaller "
            "--mib, or wait for the running fine-tune to end",
            "mib",
            nodes=why,
        )
    fits.sort(key=lambda p: (p.device != "cuda", -p.free_mib, p.node))
    return fits[0]
