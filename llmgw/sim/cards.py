"""The cards the simulation knows: memory, compute capability, memory bandwidth, board
power and dense BF16 compute, from the vendors' data sheets (SXM parts where there are
several). A generated fleet (``--nodes 2000x8xH100``) is built from this table; a
recorded fleet's cards are matched to it by the name NVML reports, for their speed and
power only (their memory is what the node reported)."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


class SimError(ValueError):
    """Input the simulation refuses; the message says what was wrong and what to do."""


@dataclass(frozen=True)
class CardType:
    key: str  # as ``--nodes`` names it: H100
    name: str  # as NVML reports it: NVIDIA H100 80GB HBM3
    memory: int  # bytes
    compute_capability: str
    bandwidth_gbs: float  # memory bandwidth, GB/s
    power_w: float  # board power, W
    tflops: float  # dense BF16, TFLOP/s
    driver: str = "580.65.06"


CARDS: dict[str, CardType] = {
    c.key.lower(): c
    for c in (
        CardType("H100", "NVIDIA H100 80GB HBM3", 80 * GIB, "9.0", 3350.0, 700.0, 989.0),
        CardType("H200", "NVIDIA H200", 141 * GIB, "9.0", 4800.0, 700.0, 989.0),
        CardType("B200", "NVIDIA B200", 180 * GIB, "10.0", 8000.0, 1000.0, 2250.0),
        CardType("A100", "NVIDIA A100-SXM4-80GB", 80 * GIB, "8.0", 2039.0, 400.0, 312.0),
        CardType("L40S", "NVIDIA L40S", 48 * GIB, "8.9", 864.0, 350.0, 362.0),
        CardType("L4", "NVIDIA L4", 24 * GIB, "8.9", 300.0, 72.0, 121.0),
        CardType("A10", "NVIDIA A10", 24 * GIB, "8.6", 600.0, 150.0, 125.0),
    )
}


def known() -> str:
    return ", ".join(c.key for c in CARDS.values())


def card_type(key: str) -> CardType:
    """A card by its short name (``H100``, any letter case), or SimError listing the known."""
    found = CARDS.get(key.lower())
    if found is None:
        raise SimError(f"unknown card type {key!r}: the simulation knows {known()}")
    return found


def by_name(name: str) -> CardType | None:
    """The table's card a reported name is (``NVIDIA H100 80GB HBM3``, ``NVIDIA H100
    PCIe``): exact first, else the longest short name it contains as a word."""
    low = name.lower()
    for c in CARDS.values():
        if c.name.lower() == low:
            return c
    words = set(low.replace("-", " ").split())
    fits = [c for c in CARDS.values() if c.key.lower() in words]
    return max(fits, key=lambda c: len(c.key)) if fits else None


@dataclass(frozen=True)
class NodeShape:
    """A generated fleet's shape: ``count`` nodes of ``cards`` cards of ``card``."""

    count: int
    cards: int
    card: CardType


def parse_nodes(spec: str) -> NodeShape:
    """``2000x8xH100`` (nodes x cards x card type); ``100x0`` is CPU-only nodes."""
    parts = spec.strip().split("x", 2)
    if len(parts) not in (2, 3) or not parts[0].isdigit() or not parts[1].isdigit():
        raise SimError(
            f"--nodes {spec!r}: give NODESxCARDSxTYPE, like 2000x8xH100 (or 100x0 for "
            f"nodes without cards); card types: {known()}"
        )
    count, cards = int(parts[0]), int(parts[1])
    if not 1 <= count <= 100_000:
        raise SimError(f"--nodes {spec!r}: give 1 to 100000 nodes")
    if cards > 64:
        raise SimError(f"--nodes {spec!r}: give 0 to 64 cards a node")
    if cards and len(parts) != 3:
        raise SimError(f"--nodes {spec!r}: name the card type, like {count}x{cards}xH100")
    card = card_type(parts[2]) if len(parts) == 3 else CARDS["h100"]
    return NodeShape(count, cards, card)
