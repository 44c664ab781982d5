"""What limits at four levels cost a request, in the gateway's own process.

Everything the gateway does differently for a key under an organisation, team and
project with limits at each (and its own) is in the key book: the model allowed
(``Key.may_use``), the limits checked (``KeyBook.over_limit``), the request counted
(``KeyBook.admitted``) and its tokens counted (``Usage.add``). This times those four,
as one request makes them, for a bare key and for a levelled key, the best of several
repeats (other work on shared cores only ever adds time). ``bench/gateway.py --levels``
measures the same whole requests through a control plane, where the noise of shared
cores is far above the difference.

    .venv/bin/python bench/levels.py
    .venv/bin/python bench/levels.py --requests 200000 --repeat 9
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.server.gateway.limits import Key, KeyBook, Usage, UsageRows, key_hash  # noqa: E402
from llmgw.server.people.directory import Snapshot  # noqa: E402
from llmgw.server.people.records import Limits, Org, Project, Team  # noqa: E402
from llmgw.server.store import ApiKeyRecord, SQLiteStore  # noqa: E402

# Far above what a run asks: each is checked, none reached.
HIGH = Limits(rpm=10**9, tpm=10**9, budget=10**15, models=("tiny*",))


async def _nowhere(rows: UsageRows) -> None:
    """Usage is not written here: only counted."""


def key_book() -> tuple[KeyBook, Key, Key]:
    tree = Snapshot(
        orgs={"o": Org("o", "bench", HIGH)},
        teams={"t": Team("t", "o", "bench", HIGH)},
        projects={"p": Project("p", "o", "t", "p", HIGH)},
    )
    # The store is never opened: usage goes to _nowhere, the month is not read.
    usage = Usage(SQLiteStore(Path("/nonexistent/store.db")), time.time, _nowhere)
    keys = KeyBook(usage, time.time, lambda: tree)
    keys.load(
        [
            ApiKeyRecord("bare", "bare", key_hash("sk-bare"), org_id="default"),
            ApiKeyRecord(
                "levels",
                "levels",
                key_hash("sk-levels"),
                models=HIGH.models,
                rpm=HIGH.rpm,
                tpm=HIGH.tpm,
                budget=HIGH.budget,
                org_id="o",
                project_id="p",
            ),
        ]
    )
    bare, levelled = keys.authorise("Bearer sk-bare"), keys.authorise("Bearer sk-levels")
    assert isinstance(bare, Key) and isinstance(levelled, Key)
    assert len(levelled.chain) == 3 and not bare.chain
    return keys, bare, levelled


def per_request(keys: KeyBook, key: Key, requests: int, repeat: int) -> float:
    """Microseconds a request spends in the key book: the best of ``repeat`` runs."""

    def one() -> None:
        if not key.may_use("tiny") or keys.over_limit(key) is not None:
            raise SystemExit("a limit was reached: the benchmark measures checks that pass")
        keys.admitted(key)
        keys.usage.add(key, "tiny", "tiny.default.1", 7, 5)

    return 1e6 * min(timeit.repeat(one, number=requests, repeat=repeat)) / requests


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=100_000, help="requests a repeat")
    p.add_argument("--repeat", type=int, default=7, help="repeats; the best is kept")
    args = p.parse_args(argv)
    keys, bare, levelled = key_book()
    # Alternating, so neither always has the warmer caches.
    figures: dict[str, list[float]] = {"bare": [], "levels": []}
    for _ in range(2):
        figures["bare"].append(per_request(keys, bare, args.requests, args.repeat))
        figures["levels"].append(per_request(keys, levelled, args.requests, args.repeat))
    b, lv = min(figures["bare"]), min(figures["levels"])
    print(f"key book, a request: bare key {b:.2f} us, key under four levels {lv:.2f} us")
    print(f"limits at four levels add {lv - b:.2f} us of the gateway's CPU a request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
