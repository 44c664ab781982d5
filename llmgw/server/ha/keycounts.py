"""The other control planes' last minute of each limited key, for the cluster's limits.

Every round each control plane asks the others for their counts (``/peer/state``'s
``key_counts``: requests and tokens of each key with a rate limit on it or a level above
it, over the last minute) and hands their sum to its key book. A control plane that does
not answer a round (busy, its answer late) is taken at what it said last, for as long
as that minute lasts: forgetting it would let each key through here at its whole limit
again. Counts older than a minute would all have aged out of its windows, so they go.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.jsonvalue import JSON, as_int, as_list, as_object

# How long another control plane's counts stand when it stops answering: its window.
COUNTS_LAST = 60.0

Counts = dict[str, tuple[int, int]]


class PeerCounts:
    def __init__(self) -> None:
        # Each control plane's counts as it last said them, and when.
        self.said: dict[str, tuple[float, Counts]] = {}

    def heard(self, name: str, counts: JSON, now: float) -> None:
        """What a control plane answered this round (its ``key_counts``)."""
        said: Counts = {}
        for key_id, pair in as_object(counts or {}).items():
            requests, tokens = as_list(pair)
            said[key_id] = (as_int(requests), as_int(tokens))
        self.said[name] = (now, said)

    def summed(self, live: Iterable[str], now: float) -> Counts:
        """The counts of every control plane still in the cluster, summed per key; those
        of one gone, or unheard for a minute, are forgotten."""
        names = set(live)
        out: Counts = {}
        for name, (when, said) in list(self.said.items()):
            if name not in names or now - when > COUNTS_LAST:
                del self.said[name]
                continue
            for key_id, (requests, tokens) in said.items():
                r, t = out.get(key_id, (0, 0))
                out[key_id] = (r + requests, t + tokens)
        return out
