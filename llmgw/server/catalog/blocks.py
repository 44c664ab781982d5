"""The index placement walks: one group's nodes sorted by the strategy's key, cut
into blocks, each with an upper bound of what its nodes have free, so a walk passes
over whole blocks that lack room rather than trying node after node."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

from llmgw.server.catalog.placement import Request


class Free(Protocol):
    """A node's free figures while one placement call reserves them."""

    memory: int
    cpu: float
    disk: int | None
    top: list[int]


S = TypeVar("S", bound=Free)


class Bound:
    """The most any node of a block has free of each resource.

    An upper bound: a request it does not admit fits none of the block's nodes.
    Taking a node out leaves it loose, still a bound but maybe a high one, until a
    walk finds the block admitted a request that none of its nodes has room for.
    """

    __slots__ = ("memory", "cpu", "disk", "top")

    def __init__(self, states: Sequence[Free]) -> None:
        self.memory = max([st.memory for st in states])
        self.cpu = max([st.cpu for st in states])
        disks = [st.disk for st in states]
        # None: a node reports no disk, so there is no bound.
        self.disk = None if None in disks else max(d for d in disks if d is not None)
        tops = [st.top for st in states]
        width = max(map(len, tops))
        self.top = [max([t[k] for t in tops if len(t) > k]) for k in range(width)]

    def widen(self, st: Free) -> None:
        self.memory = max(self.memory, st.memory)
        self.cpu = max(self.cpu, st.cpu)
        if self.disk is not None:
            self.disk = None if st.disk is None else max(self.disk, st.disk)
        top = self.top
        for k, f in enumerate(st.top):
            if k == len(top):
                top.append(f)
            elif f > top[k]:
                top[k] = f


def admits(free: Free | Bound, req: Request, check_disk: bool) -> bool:
    """Whether free figures have room for the request in each resource taken alone.

    Exact for a node (but for disk, which weights pending there would skip), and
    for a block a condition every fitting member meets.
    """
    if req.memory > free.memory or req.cpu_cores > free.cpu:
        return False
    if check_disk and free.disk is not None and req.disk > free.disk:
        return False
    if req.cards:
        top = free.top
        return len(top) >= req.cards and top[req.cards - 1] >= req.card_memory
    return True


Key = tuple[int, str]


class Order(Generic[S]):
    """One group's nodes sorted by the strategy's key, cut into blocks with bounds.

    The walk for a request passes over whole blocks whose bound lacks room, so a
    fleet whose nodes have the scored resource but not the cores or cards costs a
    look per block rather than a failed fit per node.
    """

    BLOCK = 48

    __slots__ = ("states", "blocks", "firsts", "bounds", "loose")

    def __init__(self, keys: list[Key], states: Mapping[str, S]) -> None:
        self.states = states
        size = self.BLOCK
        self.blocks = [keys[i : i + size] for i in range(0, len(keys), size)]
        self.firsts = [b[0] for b in self.blocks]
        self.bounds = [self._bound(b) for b in self.blocks]
        self.loose = [False] * len(self.blocks)

    def _bound(self, block: list[Key]) -> Bound:
        return Bound([self.states[nid] for _, nid in block])

    def _find(self, key: Key) -> int:
        return max(bisect.bisect_right(self.firsts, key) - 1, 0)

    def remove(self, key: Key) -> None:
        i = self._find(key)
        block = self.blocks[i]
        del block[bisect.bisect_left(block, key)]
        if not block:
            del self.blocks[i], self.firsts[i], self.bounds[i], self.loose[i]
            return
        self.firsts[i] = block[0]
        self.loose[i] = True

    def insert(self, key: Key) -> None:
        st = self.states[key[1]]
        if not self.blocks:
            self.blocks.append([key])
            self.firsts.append(key)
            self.bounds.append(Bound([st]))
            self.loose.append(False)
            return
        i = self._find(key)
        block = self.blocks[i]
        bisect.insort(block, key)
        self.firsts[i] = block[0]
        self.bounds[i].widen(st)
        if len(block) >= 2 * self.BLOCK:
            half = len(block) // 2
            lo, hi = block[:half], block[half:]
            self.blocks[i : i + 1] = [lo, hi]
            self.firsts[i : i + 1] = [lo[0], hi[0]]
            self.bounds[i : i + 1] = [self._bound(lo), self._bound(hi)]
            self.loose[i : i + 1] = [False, False]

    def candidates(
        self, req: Request, lo: Key | None, hi: Key | None, check_disk: bool
    ) -> Iterator[S]:
        """Nodes keyed from `lo` to `hi` (both included) with room, in order.

        Callers stop before reserving: the walk does not survive a change to the order.
        """
        start = 0 if lo is None else self._find(lo)
        for i in range(start, len(self.blocks)):
            block = self.blocks[i]
            if hi is not None and block[0] > hi:
                return
            if not admits(self.bounds[i], req, check_disk):
                continue
            j = bisect.bisect_left(block, lo) if lo is not None and i == start else 0
            roomy = False
            for k in range(j, len(block)):
                key = block[k]
                if hi is not None and key > hi:
                    return
                st = self.states[key[1]]
                if admits(st, req, check_disk):
                    roomy = True
                    yield st
            # Tightening costs a pass over the block, worth it only once the loose
            # bound has let a walk in for nothing: on a filling fleet, it will again.
            if not roomy and self.loose[i]:
                self.bounds[i] = self._bound(block)
                self.loose[i] = False
