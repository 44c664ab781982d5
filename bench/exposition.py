"""The fleet's part of ``/metrics`` written from recorded nodes, without agents: the
text of 5,000 nodes of 8 cards (every figure ``bench/agents.py``'s gpu phase sends),
written by ``exposition`` as it was before its per-node text was kept (the module at a
commit, ``--before``) and as it is now, side by side in one run.

    .venv/bin/python bench/exposition.py --nodes 5000 --cards 8 [--before eb8d631]

Rows: ``before`` (every node written, each scrape), ``cold`` (every node written into
the kept texts, the first scrape), ``warm`` (no figure changed: every node's text
reused), ``beat`` (a fifth of the nodes sent a heartbeat since: 5,000 nodes beating
every 5 s, scraped every second), ``moved`` (every node sent one since, its cards'
health a twelfth of them: scraped every 5 s or more; the cards' steady facts and health
are kept from the last scrape) and ``off`` (fleet detail off: each node's
``llmgw_node_up`` only). Each the best of ``--repeat`` runs, wall clock.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agents import SimFacts  # noqa: E402
from llmgw.server.fleet import exposition  # noqa: E402
from llmgw.server.fleet.figures import LiveFigures  # noqa: E402
from llmgw.server.fleet.nodeview import NodeView  # noqa: E402
from llmgw.wire.messages import Heartbeat  # noqa: E402
from llmgw.wire.states import NodeState  # noqa: E402


def _node(i: int, sim: SimFacts, now: float) -> NodeView:
    v = NodeView(id=f"gpu{i:05d}", cert_serial=i, state=NodeState.READY, last_seen=now)
    v.facts = asyncio.run(sim.facts(v.id))
    v.live = LiveFigures.registered(now)
    _beat(v, sim, now)
    return v


def _beat(v: NodeView, sim: SimFacts, now: float) -> None:
    f = sim.next_live()
    v.live.take(
        Heartbeat(
            seq=sim.beat,
            memory_available=f.memory_available,
            cpu_percent=f.cpu_percent,
            load=f.load,
            disks=f.disks,
            gpus=f.gpus,
            gpu_health=f.gpu_health,
            vitals=f.vitals,
        ),
        now,
    )
    v.last_seen = now


def _before(commit: str) -> ModuleType:
    """``exposition`` as it was at ``commit``, loaded under another name."""
    source = subprocess.run(
        ["git", "show", f"{commit}:llmgw/server/fleet/exposition.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "exposition_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("exposition_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _best(repeat: int, run: Callable[[], object]) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--cards", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--before", default=None, help="a commit whose exposition to run too")
    args = p.parse_args(argv)
    now = time.time()
    sims = [SimFacts(args.cards, seed=i) for i in range(args.nodes)]
    views = [_node(i, sim, now) for i, sim in enumerate(sims)]

    def snaps() -> list[exposition.NodeSnapshot]:
        return [exposition.NodeSnapshot.of(v, now) for v in views]

    rows: list[tuple[str, float, int, int]] = []
    if args.before:
        old = _before(args.before)
        taken = [old.NodeSnapshot.of(v, now) for v in views]
        secs, lines = _best(args.repeat, lambda: "\n".join(old.fleet_metrics(taken, now=now)))
        rows.append(("before", secs, len(str(lines)), args.nodes))
    taken = snaps()
    cold_secs = float("inf")
    text = ""
    written = 0
    for _ in range(args.repeat):
        texts = exposition.NodeTexts()
        t = time.perf_counter()
        text = texts.text(taken, now=now)
        cold_secs = min(cold_secs, time.perf_counter() - t)
        written = texts.written
    rows.append(("cold", cold_secs, len(text), written))
    n0 = texts.written
    secs, out = _best(args.repeat, lambda: texts.text(snaps(), now=now))
    rows.append(("warm", secs, len(str(out)), (texts.written - n0) // args.repeat))

    def after(beating: Callable[[int], range]) -> tuple[float, int, int]:
        """Best seconds of a scrape after the nodes ``beating(round)`` names beat, the
        text's size and the nodes written."""
        best, size, written = float("inf"), 0, 0
        for r in range(args.repeat):
            for i in beating(r):
                _beat(views[i], sims[i], now)
            n0 = texts.written
            t = time.perf_counter()
            out = texts.text(snaps(), now=now)
            best = min(best, time.perf_counter() - t)
            size, written = len(out), texts.written - n0
        return best, size, written

    rows.append(("beat", *after(lambda r: range(r, args.nodes, 5))))
    rows.append(("moved", *after(lambda r: range(args.nodes))))
    ups = [(v.id, True) for v in views]
    secs, out = _best(args.repeat, lambda: exposition.up_metrics(ups))
    rows.append(("off", secs, len(str(out)), 0))
    print(
        f"{args.nodes} nodes x {args.cards} cards, best of {args.repeat}, {sys.version.split()[0]}"
    )
    print(f"{'row':<8}{'seconds':>9}{'MB':>9}{'written':>9}")
    for name, secs, size, n in rows:
        print(f"{name:<8}{secs:>9.2f}{size / 1e6:>9.1f}{n:>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
