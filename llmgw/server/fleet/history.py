"""A bounded history of every node's and card's figures: the last hour at 10 s steps.

Each node keeps a ring of ``span / step`` slots (360 for an hour at 10 s); slot ``s``
covers ``[s * step, (s + 1) * step)`` and lives at position ``s % slots``. A heartbeat
writes into the slot of its time, so one point is kept per slot and a later heartbeat in
the same slot overwrites the figures it read (a figure it did not read leaves the earlier
one of that slot). Slots in which a node was silent are cleared when the ring moves past
them, so they read as "not read" (``null``), never as 0.

Memory: the rings are preallocated ``array.array`` blocks, not Python floats.

* float32 (``'f'``, NaN = not read): node CPU % and memory used, card memory used
  (memory as whole MiB: float32 holds every integer up to 2**24 MiB, 16 TiB, exactly;
  bytes come back as ints, exact to the MiB);
* one byte (``'B'``, 255 = not read): card busy (``utilization``, %) and temperature
  (C, 0..254), SM active in steps of 0.005, and whether memory total was read in the
  slot: the total itself is kept once, the latest read (a card's or a node's total does
  not change while it runs, so the past slots show today's);
* 16 bits (``'H'``, 65535 = not read): card power in tenths of a watt (to 6,553.4 W).

Per slot that is 9 bytes for the node and 10 per card: a card costs 360 * 10 = 3,600
bytes of ring and a node 3,240 plus its cards. Measured with tracemalloc
(``tests/server/fleet/test_history.py``, 100 nodes x 8 cards), a node with 8 cards
costs about 36,300 bytes with every object counted; the test asserts under 38,000, so
5,000 nodes x 8 cards take under 190 MB.
"""

from __future__ import annotations

import math
import sys
import time
from array import array
from collections.abc import Sequence
from typing import TypedDict

from llmgw.wire.hardware import GPU

MIB = 2**20
MAX_CARDS = 64
# Byte columns: "not read".
BYTE_NONE = 255
NAN = math.nan

SHORT_NONE = 65535
# Float32 columns of a node's ring, and of a card's; byte and 16-bit columns of a card's.
NODE_FLOATS = ("cpu_percent", "memory_used")
CARD_FLOATS = ("memory_used",)
# ``memory_total`` as a byte is only "read in this slot" (1): the value is the card's
# (or node's) latest total, which does not change while it runs.
CARD_BYTES = ("utilization", "temperature", "sm_active", "memory_total")
CARD_SHORTS = ("power",)  # tenths of a watt, up to 6,553.4 W
SM_STEPS = 200  # sm_active in steps of 0.005
# Decimals the CPU figure keeps in a series (float32 carries noise past them).
CPU_DECIMALS = 1


def _float(value: float | None) -> float:
    return NAN if value is None else float(value)


def _mib(value: float | None) -> float:
    v = _float(value)
    return v if math.isnan(v) else float(round(v / MIB))


class _Card:
    __slots__ = ("bytes_", "floats", "index", "last_slot", "memory_total", "name", "shorts", "uuid")

    def __init__(
        self, uuid: str, floats: array[float], bytes_: array[int], shorts: array[int]
    ) -> None:
        self.uuid = uuid
        self.index: int | None = None
        self.name: str | None = None
        self.memory_total: int | None = None  # MiB, the latest read
        self.last_slot = -1
        self.floats = array("f", floats)
        self.bytes_ = array("B", bytes_)
        self.shorts = array("H", shorts)


class _Node:
    __slots__ = ("cards", "floats", "last_slot", "memory_total", "total_read")

    def __init__(self, floats: array[float], total_read: array[int]) -> None:
        self.last_slot = -1
        self.floats = array("f", floats)
        self.total_read = array("B", total_read)  # 1 where memory_total was read
        self.memory_total: int | None = None  # MiB, the latest read
        self.cards: dict[str, _Card] = {}


class CardSeries(TypedDict):
    """A card's last hour, one value per slot, None where it was not read."""

    uuid: str
    index: int | None
    name: str | None
    utilization: list[int | None]  # percent
    sm_active: list[float | None]  # share of time, 0..1
    memory_used: list[int | None]  # bytes
    memory_total: list[int | None]
    power: list[float | None]  # W
    temperature: list[int | None]  # degrees C


class NodeSeries(TypedDict):
    """``GET /api/v1/nodes/{id}/history``: a node's last minutes, columnar, oldest slot
    first; ``t`` is each slot's start in epoch seconds."""

    node: str
    step_seconds: float
    t: list[float]
    cpu_percent: list[float | None]
    memory_used: list[int | None]  # bytes, exact to the MiB
    memory_total: list[int | None]
    gpus: list[CardSeries]


class FleetHistory:
    """Per node, the last ``span`` seconds of figures at ``step`` second slots."""

    def __init__(self, step: float = 10.0, span: float = 3600.0) -> None:
        if step <= 0 or span < step:
            raise ValueError("history needs step > 0 and span >= step")
        self.step = step
        self.span = span
        self.slots = int(round(span / step))
        n = self.slots
        # Templates copied into every new ring, and the blank a reset copies from.
        self._node_blank = array("f", [NAN]) * (len(NODE_FLOATS) * n)
        self._node_blank_b = array("B", [BYTE_NONE]) * n
        self._card_blank_f = array("f", [NAN]) * (len(CARD_FLOATS) * n)
        self._card_blank_b = array("B", [BYTE_NONE]) * (len(CARD_BYTES) * n)
        self._card_blank_s = array("H", [SHORT_NONE]) * (len(CARD_SHORTS) * n)
        self._nodes: dict[str, _Node] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def _slot(self, now: float) -> int:
        return math.floor(now / self.step)

    def _clear(self, node: _Node, first: int, last: int) -> None:
        """Blank the slots ``first..last`` (inclusive) of the node and its cards."""
        n = self.slots
        if last - first + 1 >= n:
            node.floats[:] = self._node_blank
            node.total_read[:] = self._node_blank_b
            for card in node.cards.values():
                card.floats[:] = self._card_blank_f
                card.bytes_[:] = self._card_blank_b
                card.shorts[:] = self._card_blank_s
            return
        cards = list(node.cards.values())
        for s in range(first, last + 1):
            p = s % n
            for c in range(len(NODE_FLOATS)):
                node.floats[c * n + p] = NAN
            node.total_read[p] = BYTE_NONE
            for card in cards:
                for c in range(len(CARD_FLOATS)):
                    card.floats[c * n + p] = NAN
                for c in range(len(CARD_BYTES)):
                    card.bytes_[c * n + p] = BYTE_NONE
                for c in range(len(CARD_SHORTS)):
                    card.shorts[c * n + p] = SHORT_NONE

    def _advance(self, node: _Node, slot: int) -> None:
        if node.last_slot >= 0:
            self._clear(node, node.last_slot + 1, slot)
        else:
            node.floats[:] = self._node_blank
            node.total_read[:] = self._node_blank_b
        node.last_slot = slot
        # A card not seen for a whole span has no point left: it ages out.
        oldest = slot - self.slots
        for uuid in [u for u, c in node.cards.items() if c.last_slot <= oldest]:
            del node.cards[uuid]

    def _card(self, node: _Node, uuid: str, slot: int) -> _Card | None:
        card = node.cards.get(uuid)
        if card is not None:
            return card
        if len(node.cards) >= MAX_CARDS:
            # Full: make room by the card seen longest ago, unless every card is current.
            stalest = min(node.cards.values(), key=lambda c: c.last_slot)
            if stalest.last_slot >= slot:
                return None
            del node.cards[stalest.uuid]
        card = _Card(uuid, self._card_blank_f, self._card_blank_b, self._card_blank_s)
        node.cards[card.uuid] = card
        return card

    def record(
        self,
        node_id: str,
        now: float,
        cpu_percent: float | None,
        memory_total: int | None,
        memory_available: int | None,
        gpus: Sequence[GPU],
    ) -> None:
        """Keep a heartbeat's figures in the slot of ``now``. Any figure may be None (not
        read), a card's too (``utilization``, ``sm_active``, ``memory_used``,
        ``memory_total``, ``power``, ``temperature``). Cards are keyed by uuid (by
        ``index`` when a card has none), at most 64 per node."""
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(self._node_blank, self._node_blank_b)
        slot = self._slot(now)
        n = self.slots
        if slot > node.last_slot:
            self._advance(node, slot)
        elif slot <= node.last_slot - n:
            return  # older than the ring holds
        p = slot % n
        total = _float(memory_total)
        available = _float(memory_available)
        cpu, used = _float(cpu_percent), _mib(total - available)
        if not math.isnan(cpu):
            node.floats[p] = cpu
        if not math.isnan(used):
            node.floats[n + p] = used
        if not math.isnan(total):
            node.memory_total = round(total / MIB)
            node.total_read[p] = 1
        for gpu in gpus:
            card = self._card(node, gpu.uuid or f"index:{gpu.index}", slot)
            if card is None:
                continue
            card.last_slot = max(card.last_slot, slot)
            card.index = gpu.index
            if card.name != gpu.name:
                card.name = sys.intern(gpu.name)
            self._card_point(card, gpu, p)

    def _card_point(self, card: _Card, gpu: GPU, p: int) -> None:
        # Eight cards a heartbeat on thousands of nodes: each figure is read and checked
        # once, inline (``x == x`` is false for a NaN, which is not read either).
        n = self.slots
        used = gpu.memory_used
        if used is not None:
            card.floats[p] = round(used / MIB)
        b = card.bytes_
        util = gpu.utilization
        if util is not None:
            b[p] = max(0, min(BYTE_NONE - 1, round(util)))
        temperature = gpu.temperature
        if temperature is not None:
            b[n + p] = max(0, min(BYTE_NONE - 1, round(temperature)))
        sm = gpu.sm_active
        if sm is not None and sm == sm:
            b[2 * n + p] = max(0, min(SM_STEPS, round(sm * SM_STEPS)))
        total = gpu.memory_total
        if total is not None:
            b[3 * n + p] = 1
            card.memory_total = round(total / MIB)
        power = gpu.power
        if power is not None and power == power:
            card.shorts[p] = max(0, min(SHORT_NONE - 1, round(power * 10)))

    def forget(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)

    def series(
        self, node_id: str, minutes: float = 60, now: float | None = None
    ) -> NodeSeries | None:
        """The last ``minutes`` (1..span) of a node, columnar, oldest slot first: ``t``
        holds each slot's start in epoch seconds and every figure one value per slot,
        ``None`` where it was not read. Memory in bytes (ints, exact to the MiB). None
        for a node never recorded (or forgotten)."""
        node = self._nodes.get(node_id)
        if node is None:
            return None
        minutes = max(1.0, min(self.span / 60, float(minutes)))
        count = max(1, min(self.slots, int(round(minutes * 60 / self.step))))
        end = self._slot(time.time() if now is None else now)
        first = end - count + 1
        n = self.slots
        # Positions in the ring of each slot wanted; None where it holds no such slot.
        oldest = node.last_slot - n + 1
        positions = [
            s % n if oldest <= s <= node.last_slot else None for s in range(first, end + 1)
        ]
        step: float | int = int(self.step) if float(self.step).is_integer() else self.step
        t = [s * step for s in range(first, end + 1)]

        def read(ring: array[float], column: int) -> list[float | None]:
            base = column * n
            values = (NAN if p is None else ring[base + p] for p in positions)
            return [None if math.isnan(v) else v for v in values]

        def percents(ring: array[float], column: int) -> list[float | None]:
            return [None if v is None else round(v, CPU_DECIMALS) for v in read(ring, column)]

        def memory(ring: array[float], column: int) -> list[int | None]:
            return [None if v is None else int(v) * MIB for v in read(ring, column)]

        def stored(ring: array[int], column: int, none: int) -> list[int | None]:
            base = column * n
            out: list[int | None] = []
            for p in positions:
                v = none if p is None else ring[base + p]
                out.append(None if v == none else v)
            return out

        def totals(read: list[int | None], mib: int | None) -> list[int | None]:
            return [None if r is None or mib is None else mib * MIB for r in read]

        cards = sorted(
            (c for c in node.cards.values() if c.last_slot >= first),
            key=lambda c: (c.index is None, c.index or 0, c.uuid),
        )
        gpus: list[CardSeries] = []
        for card in cards:
            sm = stored(card.bytes_, 2, BYTE_NONE)
            power = stored(card.shorts, 0, SHORT_NONE)
            gpus.append(
                {
                    "uuid": card.uuid,
                    "index": card.index,
                    "name": card.name,
                    "utilization": stored(card.bytes_, 0, BYTE_NONE),
                    "sm_active": [None if v is None else round(v / SM_STEPS, 3) for v in sm],
                    "memory_used": memory(card.floats, 0),
                    "memory_total": totals(stored(card.bytes_, 3, BYTE_NONE), card.memory_total),
                    "power": [None if v is None else v / 10 for v in power],
                    "temperature": stored(card.bytes_, 1, BYTE_NONE),
                }
            )
        return {
            "node": node_id,
            "step_seconds": step,
            "t": t,
            "cpu_percent": percents(node.floats, NODE_FLOATS.index("cpu_percent")),
            "memory_used": memory(node.floats, NODE_FLOATS.index("memory_used")),
            "memory_total": totals(stored(node.total_read, 0, BYTE_NONE), node.memory_total),
            "gpus": gpus,
        }
