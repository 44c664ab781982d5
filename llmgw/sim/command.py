"""``llmgw sim``: its arguments, and the run from files to a printed report."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from llmgw.cliargs import UsageError, parse_duration
from llmgw.sim.cards import SimError, known, parse_nodes

HELP = """\
Simulate a fleet through the real scheduler, reconciler and router, with no process:
where every replica goes and why, queueing and time to first token per model, what a
node's failure or a drain does, and energy per token. See docs/sim.md."""


def add_parsers(roles: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = roles.add_parser(
        "sim",
        help="simulate a fleet, its models and a load: answer 'what if' offline",
        description=HELP,
    )
    fleet = p.add_mutually_exclusive_group(required=True)
    fleet.add_argument(
        "--fleet", metavar="FLEET.yaml", type=Path, help="a recorded `ctl nodes --json` (or YAML)"
    )
    fleet.add_argument(
        "--nodes",
        metavar="NxCARDSxTYPE",
        help=f"a generated fleet, like 2000x8xH100 (card types: {known()})",
    )
    p.add_argument(
        "--models", metavar="MODELS.yaml", type=Path, required=True, help="what to serve"
    )
    p.add_argument(
        "--load", metavar="TRACE.jsonl", type=Path, required=True, help="one request a line"
    )
    p.add_argument(
        "--duration",
        type=parse_duration,
        metavar="TIME",
        help="simulate this long of the trace (like 1h; default: all of it)",
    )
    p.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="node=NAME@TIME",
        help="a node fails (node=gpu17@10m) or is drained (drain=gpu17@30m); repeatable",
    )
    p.add_argument("--strategy", choices=("binpack", "spread"), default="binpack", help="placement")
    p.add_argument(
        "--fetch-gbs",
        type=float,
        default=1.25,
        metavar="GB/S",
        help="how fast a node fetches weights it lacks (default 1.25 GB/s)",
    )
    p.add_argument("--json", action="store_true", help="one object of plain fields")
    p.set_defaults(handler=cmd_sim)


def cmd_sim(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except SimError as exc:
        raise UsageError(str(exc)) from None


def _run(args: argparse.Namespace) -> int:
    from llmgw.config import SchedulingConfig
    from llmgw.sim import fleet, load, models, report
    from llmgw.sim.run import Simulation

    if not args.fetch_gbs > 0:
        raise SimError("--fetch-gbs: give a rate above 0 GB/s")
    events = [load.parse_event(spec) for spec in args.fail]
    began = time.perf_counter()
    nodes = fleet.generated(parse_nodes(args.nodes)) if args.nodes else fleet.read_fleet(args.fleet)
    load.check_events(events, nodes)
    cards = [g.memory_total or 0 for v in nodes.values() for g in v.figures().gpus]
    host = max((v.figures().memory_total or 0 for v in nodes.values()), default=0)
    catalog = models.read_models(args.models, cards, host)
    duration = float(args.duration) if args.duration is not None else None
    late = next((e for e in events if duration is not None and e.at >= duration), None)
    if late is not None:
        raise SimError(
            f"--fail {late.kind}={late.node}@{late.at:g}s: past --duration "
            f"{duration:g}s, so nothing would be seen of it; give an earlier time"
        )
    trace = load.read_trace(args.load, {m.model.name for m in catalog}, duration)
    sim = Simulation(
        nodes,
        catalog,
        trace,
        events,
        SchedulingConfig(strategy=args.strategy),
        fetch_gbs=args.fetch_gbs,
    )
    asyncio.run(sim.run())
    length = duration if duration is not None else (trace[-1].at if trace else 0.0)
    out = report.build(sim, length)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(report.text(out))
        print(f"(simulated in {time.perf_counter() - began:.1f} s)", file=sys.stderr)
    return 0
