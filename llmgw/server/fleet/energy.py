"""Energy per token: each replica's cards' energy over the tokens it answered.

Each heartbeat carries every card's energy counter (joules since the driver loaded).
``EnergyMeter.heartbeat`` takes the rise since the node's last heartbeat and gives it to
the replicas on that card (split evenly when several share one); the gateway counts
each replica's answered (completion) tokens. ``joules_per_token`` is their quotient since
this control plane started: idle time is part of the price of a replica, so it is
counted too. A card whose counter is not read adds nothing, and a replica none of whose
cards has one has no figure at all (never 0). A counter that went down (the driver was
reloaded) starts a new baseline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llmgw.wire.hardware import GPU


class EnergyMeter:
    def __init__(self) -> None:
        self._last: dict[str, float] = {}  # card UUID -> its last energy reading
        self.joules: dict[str, float] = {}  # replica id -> joules so far

    def heartbeat(self, gpus: Iterable[GPU], shards: Iterable[tuple[str, list[str]]]) -> None:
        """One node's cards and its shards as (replica id, card UUIDs)."""
        rise: dict[str, float] = {}
        for gpu in gpus:
            uuid, energy = gpu.uuid, gpu.energy
            if not uuid or energy is None:
                continue
            before = self._last.get(uuid)
            self._last[uuid] = energy
            if before is not None and energy >= before:
                rise[uuid] = energy - before
        if not rise:
            return
        holders: dict[str, list[str]] = {}
        for replica, cards in shards:
            for uuid in cards:
                holders.setdefault(uuid, []).append(replica)
        for uuid, joules in rise.items():
            on_card = holders.get(uuid, [])
            for replica in on_card:
                self.joules[replica] = self.joules.get(replica, 0.0) + joules / len(on_card)

    def forget(self, replica: str) -> None:
        self.joules.pop(replica, None)

    def joules_per_token(
        self, tokens: Mapping[tuple[str, str], int]
    ) -> dict[tuple[str, str], float]:
        """(model, replica) -> J per answered token, for replicas with energy and tokens;
        ``tokens`` is answered tokens by (model, replica)."""
        out: dict[tuple[str, str], float] = {}
        for (model, replica), n in tokens.items():
            joules = self.joules.get(replica)
            if n > 0 and joules:
                out[(model, replica)] = joules / n
        return out
