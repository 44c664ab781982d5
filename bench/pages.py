"""How long the admin pages take to render on a large fleet: the nodes table and the GPU
map of N recorded-looking nodes (most with 8 cards), from the registry's views to HTML,
as a page request does it (no HTTP, no browser). Target (issue 14): a table of a
thousand rows in under 100 ms.

    .venv/bin/python bench/pages.py --nodes 1000,5000 --runs 5
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.server.fleet.nodeview import NodeView  # noqa: E402
from llmgw.server.pages.fleetpages import gpu_map, node_rows  # noqa: E402
from llmgw.server.sessions import Session  # noqa: E402
from tests.support.pagesfleet import fleet, frame, request  # noqa: E402


def best(runs: int, work: object) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        size = len(work())  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times), size


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="1000,5000")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    pages = frame()
    session = Session("admin@bench", "admin", "sid", time.time() + 3600, "b")
    print(f"llmgw admin pages benchmark: Python {platform.python_version()}; best of {args.runs}")
    print(
        f"{'nodes':>6} {'cards':>6} {'nodes table ms':>15} {'KB':>6} {'GPU map ms':>11} {'KB':>6}"
    )
    for n in (int(x) for x in args.nodes.split(",")):
        views = fleet(n)
        cards = sum(len(v.facts.gpus) for v in views if v.facts is not None)

        def table(views: list[NodeView] = views, n: int = n) -> bytes:
            rows = node_rows(views, "", "name")
            answer = pages.render(
                request(), "nodes_table.html", session, rows=rows, q="", sort="name", total=n
            )
            return bytes(answer.body)

        def gpus(views: list[NodeView] = views) -> bytes:
            groups = gpu_map(views, "work")
            answer = pages.render(
                request(), "gpus_body.html", session, groups=groups, by="work", figures={}
            )
            return bytes(answer.body)

        t_table, s_table = best(args.runs, table)
        t_map, s_map = best(args.runs, gpus)
        print(
            f"{n:>6} {cards:>6} {t_table * 1000:>15.1f} {s_table // 1024:>6} "
            f"{t_map * 1000:>11.1f} {s_map // 1024:>6}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
