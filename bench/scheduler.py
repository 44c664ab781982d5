"""Placement benchmark: the real reconciler and scheduler on synthetic fleets, no processes.

For each fleet size N this builds N ``NodeView`` objects as the agents' reports would
leave them (some CPU-only nodes, the others with 1, 2, 4 or 8 cards of 24, 48, 80 or
141 GiB, various cores, host memory and disk), a catalog of models whose replicas add up
to ``--replicas`` (CPU models of 2-16 GiB and 1-4 cores; card models of 1, 2 or 4 cards
with 10-70 GiB each, on vLLM or, on one card, llama.cpp), and measures:

- ``pass 1``: one ``Reconciler.plan`` pass from nothing, which places every replica it
  can through ``scheduler.place_many`` (and explains, once per profile, why the rest
  fit nowhere); placements a second are the replicas it placed over its time;
- ``steady``: a second pass after every replica it started is reported Ready by its
  node (the node's free memory and card memory reduced by what it holds); it must start
  and stop nothing;
- ``place_many``: ``scheduler.place_many`` alone on the same requests and the same
  fleet's capacities, for comparison (``capacities`` is the time to build those).

Each figure is the best of ``--runs`` runs, each on a freshly built fleet and a fresh
``Reconciler``; the fleet and catalog come from ``--seed``, so runs are comparable. The
plans are checked: no card, host memory, CPU core, disk or engine port over-committed,
and the steady pass idle. The issue's target: 10,000 replicas on 2,000 nodes in under a
second for one pass.

    .venv/bin/python bench/scheduler.py --nodes 100,1000,2000,5000 --replicas 10000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.host import machine  # noqa: E402
from llmgw.config import SchedulingConfig  # noqa: E402
from llmgw.server.catalog import scheduler  # noqa: E402
from llmgw.server.catalog.model import Model, Profile, fingerprint  # noqa: E402
from llmgw.server.catalog.ports import port_range  # noqa: E402
from llmgw.server.catalog.reconciler import Plan, Reconciler  # noqa: E402
from llmgw.server.fleet.nodeview import NodeView  # noqa: E402
from llmgw.server.fleet.wiring import Wiring  # noqa: E402
from llmgw.wire.hardware import GPU, Disk, HostFacts  # noqa: E402
from llmgw.wire.messages import EngineInfo, ShardStatus  # noqa: E402
from llmgw.wire.states import NodeState, ShardState  # noqa: E402

GIB = 1024**3
GB = 1000**3
T0 = 1_000.0  # the benchmark's clock: the first pass runs at T0, the steady one a second on
TARGET_NODES = 2_000
TARGET_REPLICAS = 10_000
TARGET_SECONDS = 1.0

# Card size in GiB -> the name an agent would report.
CARDS = {24: "NVIDIA L4", 48: "NVIDIA L40S", 80: "NVIDIA H100 80GB HBM3", 141: "NVIDIA H200"}
CPU_ONLY_SHARE = 0.3
# Of the models; sized so the 2,000-node fleet has room for 10,000 replicas and the
# 1,000-node one has not, so both the placing and the refusing paths are measured.
CPU_MODEL_SHARE = 0.6
CARD_MODEL_WEIGHT = 0.5
ENGINES = {"llama.cpp": "/opt/llama.cpp/llama-server", "vllm": "/opt/vllm/bin/vllm"}


# --- the synthetic fleet and catalog ------------------------------------------------------


def fleet(n: int, seed: int) -> dict[str, NodeView]:
    """N Ready nodes, the same for the same N and seed; each has its own address."""
    rng = random.Random(f"fleet-{seed}-{n}")
    nodes: dict[str, NodeView] = {}
    for i in range(n):
        nid = f"node-{i:05d}"
        if rng.random() < CPU_ONLY_SHARE:
            count, size = 0, 0
            cores = rng.choice((8, 16, 32, 64, 96, 128))
            memory = rng.choice((32, 64, 128, 256, 512)) * GIB
            engines = ["llama.cpp"]
        else:
            count, size = rng.choice((1, 2, 4, 8)), rng.choice(tuple(CARDS))
            cores = rng.choice((16, 32, 64, 128)) * max(1, count // 4)
            memory = max(64 * GIB, count * size * GIB * rng.choice((1, 2, 4)))
            engines = ["llama.cpp", "vllm"]
        gpus = [
            GPU(
                index=k,
                uuid=f"GPU-{i:05d}-{k}",
                name=CARDS[size],
                memory_total=size * GIB,
                memory_used=0,
            )
            for k in range(count)
        ]
        disk = rng.choice((480, 960, 1920, 3840)) * GB
        disks = [
            Disk(path="/", fstype="ext4", total=disk, free=int(disk * 0.8), shared=False),
            Disk(path="/models", fstype="nfs", total=100_000 * GB, free=40_000 * GB, shared=True),
        ]
        nodes[nid] = NodeView(
            id=nid,
            cert_serial=i + 1,
            state=NodeState.READY,
            address=f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
            facts=HostFacts(
                hostname=nid,
                os="Linux",
                arch="x86_64",
                cpu_count=cores,
                memory_total=memory,
                memory_available=int(memory * 0.9),
                gpus=gpus,
                disks=disks,
            ),
            last_heartbeat=T0,
            # A connected agent: the reconciler only asks whether there is one.
            session=object(),  # type: ignore[arg-type]
            engines=[EngineInfo(name=e, path=ENGINES[e]) for e in engines],
            engines_probed=True,
        )
    return nodes


def catalog(
    replicas: int, seed: int, card_weight: float = CARD_MODEL_WEIGHT, count: int = 60
) -> list[Model]:
    """`count` models, some on cards, whose replicas add up to `replicas`."""
    rng = random.Random(f"catalog-{seed}-{replicas}")
    on_cpu = [rng.random() < CPU_MODEL_SHARE for _ in range(count)]
    # A replica on cards takes more of a node than one on CPU: card models get fewer.
    weights = [rng.uniform(0.2, 1.0) * (1.0 if cpu else card_weight) for cpu in on_cpu]
    shares = [int(replicas * w / sum(weights)) for w in weights]
    for k in range(replicas - sum(shares)):
        shares[k % count] += 1
    models = []
    for k, share in enumerate(shares):
        if on_cpu[k]:
            memory = rng.randint(2, 16) * GIB
            profile = Profile(
                name="cpu",
                engine="llama.cpp",
                cpu_cores=float(rng.randint(1, 4)),
                replicas=share,
                memory=memory,
                memory_set=True,
            )
            weight_bytes = int(memory * 0.8)
        else:
            cards = rng.choice((1, 1, 2, 2, 4))
            engine = rng.choice(("vllm", "llama.cpp")) if cards == 1 else "vllm"
            card_memory = rng.randint(10, 70) * GIB
            profile = Profile(
                name="gpu",
                engine=engine,
                cards=cards,
                cpu_cores=float(rng.choice((1, 2))),
                replicas=share,
                priority=1,
                memory=GIB,
                card_memory=card_memory,
            )
            weight_bytes = int(cards * card_memory * 0.6)
        models.append(
            Model(
                name=f"bench-{k:02d}",
                source=f"hf:bench/model-{k:02d}",
                engine=profile.engine,
                profiles=(profile,),
                context=4096,
                weight_bytes=weight_bytes,
            )
        )
    return models


def facts_of(view: NodeView) -> HostFacts:
    assert view.facts is not None, f"{view.id} has no facts"
    return view.facts


def describe(nodes: dict[str, NodeView]) -> str:
    cards = sum(len(facts_of(v).gpus) for v in nodes.values())
    cpu_only = sum(1 for v in nodes.values() if not facts_of(v).gpus)
    return f"{cards} cards, {cpu_only} CPU-only nodes"


# --- checks -------------------------------------------------------------------------------


def check_plan(plan: Plan, nodes: dict[str, NodeView], models: Sequence[Model]) -> None:
    """No node or card given more than it has; each replica its own port on its host."""
    profiles = {(m.name, p.name): (m, p) for m in models for p in m.profiles}
    memory: dict[str, int] = {}
    cores: dict[str, float] = {}
    card: dict[str, int] = {}
    sources: dict[str, set[str]] = {}
    ports: set[tuple[str, int]] = set()
    allowed = port_range(SchedulingConfig().engine_ports)
    for start in plan.starts:
        model, profile = profiles[(start.model, start.profile)]
        view = nodes[start.node]
        assert view.address is not None
        memory[start.node] = memory.get(start.node, 0) + profile.memory
        cores[start.node] = cores.get(start.node, 0.0) + profile.cpu_cores
        sources.setdefault(start.node, set()).add(model.source)
        assert len(set(start.cards)) == len(start.cards) == profile.cards, start
        for uuid in start.cards:
            card[uuid] = card.get(uuid, 0) + profile.card_memory
        assert start.port in allowed, start
        assert (view.address, start.port) not in ports, f"port {start.port} twice on {start.node}"
        ports.add((view.address, start.port))
        engines = {e.name for e in view.engines}
        assert profile.engine in engines, f"{start.node} has no {profile.engine}"
    for nid, used in memory.items():
        available = nodes[nid].figures().memory_available or 0
        assert used <= available, f"{nid}: host memory over-committed"
    for nid, used_cores in cores.items():
        assert used_cores <= (facts_of(nodes[nid]).cpu_count or 0), f"{nid}: cores over-committed"
    by_uuid = {g.uuid: g for v in nodes.values() for g in v.figures().gpus}
    for uuid, used in card.items():
        g = by_uuid[uuid]
        room = (g.memory_total or 0) - (g.memory_used or 0)
        assert used <= room, f"{uuid}: card over-committed"
    weights = {m.source: m.weight_bytes for m in models}
    for nid, held in sources.items():
        free = max(d.free for d in facts_of(nodes[nid]).disks if not d.shared)
        assert sum(weights[s] for s in held) <= free, f"{nid}: disk over-committed"


def report_ready(
    plan: Plan, nodes: dict[str, NodeView], rec: Reconciler, models: Sequence[Model]
) -> None:
    """Every started replica reported Ready by its node, holding its memory there."""
    profiles = {(m.name, p.name): (m, p) for m in models for p in m.profiles}
    for start in plan.starts:
        model, profile = profiles[(start.model, start.profile)]
        view = nodes[start.node]
        view.shards[start.replica_id] = ShardStatus(
            replica_id=start.replica_id,
            state=ShardState.READY,
            fingerprint=rec.tracks[start.replica_id].fingerprint,
            port=start.port,
            source=model.source,
        )
        # What the node's next heartbeat says: its memory and cards the less.
        figures = view.figures()
        view.live.memory_available = (figures.memory_available or 0) - profile.memory
        view.live.gpus = [
            replace(g, memory_used=(g.memory_used or 0) + profile.card_memory)
            if g.uuid in start.cards
            else g
            for g in figures.gpus
        ]


# --- measuring ----------------------------------------------------------------------------


def requests_of(rec: Reconciler, models: Sequence[Model]) -> list[scheduler.Request]:
    """What a pass from nothing asks `place_many` for, in the reconciler's order."""
    out: list[scheduler.Request] = []
    for model in sorted(models, key=lambda m: m.name):
        for profile in model.profiles:
            out += [rec.request(model, profile, T0)] * profile.replicas
    return out


def UNPINNED(engine: str) -> str | None:
    """No engine version asked: every node's engines will do."""
    return None


def UNWIRED(views: Mapping[str, NodeView]) -> dict[str, Wiring]:
    """No NVLink domain or fabric known: each node on its own."""
    return {}


def run_once(n: int, models: Sequence[Model], seed: int) -> dict[str, Any]:
    config = SchedulingConfig()
    fps = {(m.name, p.name): fingerprint(m, p) for m in models for p in m.profiles}

    nodes = fleet(n, seed)
    now = [T0]
    rec = Reconciler(config, UNPINNED, UNWIRED, clock=lambda: now[0])
    t = time.perf_counter()
    plan = rec.plan(models, nodes, T0)
    first = time.perf_counter() - t
    check_plan(plan, nodes, models)
    assert not plan.stops and not plan.parks, "a pass from nothing stopped something"
    for start in plan.starts:
        assert rec.tracks[start.replica_id].fingerprint == fps[(start.model, start.profile)]
    refusals = sum(1 for s in rec.status.values() if s.note.startswith("no node fits"))

    report_ready(plan, nodes, rec, models)
    now[0] = T0 + 1.0
    t = time.perf_counter()
    steady = rec.plan(models, nodes, now[0])
    steady_s = time.perf_counter() - t
    assert not steady.starts, f"the steady pass started {len(steady.starts)} replicas"
    assert not steady.stops, f"the steady pass stopped {len(steady.stops)} replicas"
    ready = sum(s.ready for s in rec.status.values())
    assert ready == len(plan.starts), (ready, len(plan.starts))

    fresh = fleet(n, seed)
    alone = Reconciler(config, UNPINNED, UNWIRED, clock=lambda: T0)
    t = time.perf_counter()
    caps = alone.capacities(fresh)
    caps_s = time.perf_counter() - t
    requests = requests_of(alone, models)
    strategy: scheduler.Strategy = "spread" if config.strategy == "spread" else "binpack"
    t = time.perf_counter()
    results = scheduler.place_many(requests, caps, strategy)
    many_s = time.perf_counter() - t
    placed = sum(1 for r in results if isinstance(r, scheduler.Placement))
    assert placed == len(plan.starts), (placed, len(plan.starts))
    return {
        "placed": len(plan.starts),
        "refused": len(requests) - len(plan.starts),
        "profiles_refused": refusals,
        "first_pass_s": first,
        "steady_pass_s": steady_s,
        "capacities_s": caps_s,
        "place_many_s": many_s,
    }


def bench_n(n: int, args: argparse.Namespace) -> dict[str, Any]:
    models = catalog(args.replicas, args.seed, args.card_weight)
    runs = [run_once(n, models, args.seed) for _ in range(args.runs)]
    for key in ("placed", "refused"):
        assert len({r[key] for r in runs}) == 1, f"runs disagree on {key}: the seed should fix it"
    best = {k: min(r[k] for r in runs) for k in runs[0] if k.endswith("_s")}
    placed = runs[0]["placed"]
    return {
        "nodes": n,
        "fleet": describe(fleet(n, args.seed)),
        "models": len(models),
        "replicas": args.replicas,
        "placed": placed,
        "refused": runs[0]["refused"],
        "profiles_refused": runs[0]["profiles_refused"],
        **best,
        "placements_per_s": placed / best["first_pass_s"],
        "place_many_per_s": placed / best["place_many_s"],
        "runs": runs,
    }


# --- reporting ----------------------------------------------------------------------------


def target(fleets: list[dict[str, Any]]) -> dict[str, Any]:
    at = next((f for f in fleets if f["nodes"] == TARGET_NODES), None)
    if at is None or at["replicas"] != TARGET_REPLICAS:
        need = f"--nodes {TARGET_NODES} --replicas {TARGET_REPLICAS}"
        return {"met": None, "text": f"not measured (needs {need})"}
    met = at["first_pass_s"] < TARGET_SECONDS
    return {
        "met": met,
        "seconds": at["first_pass_s"],
        "text": f"{'met' if met else 'NOT met'} ({at['first_pass_s']:.3f} s for one pass, "
        f"{at['placed']} placed, {at['refused']} refused)",
    }


def report(fleets: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"llmgw placement benchmark: {machine()}",
        f"{args.replicas} replicas of {fleets[0]['models'] if fleets else 0} models; "
        f"card weight {args.card_weight:g}; best of {args.runs} runs; seed {args.seed}; "
        f"strategy {SchedulingConfig().strategy}",
        "",
    ]
    head = (
        f"{'nodes':>6}  {'cards':>6}  {'placed':>6}  {'refused':>7}  {'pass 1 s':>8}  "
        f"{'placed/s':>8}  {'steady s':>8}  {'capacities s':>12}  {'place_many s':>12}  "
        f"{'placed/s':>8}"
    )
    lines += [head, "-" * len(head)]
    for f in fleets:
        cards = int(f["fleet"].split()[0])
        lines.append(
            f"{f['nodes']:>6}  {cards:>6}  {f['placed']:>6}  {f['refused']:>7}  "
            f"{f['first_pass_s']:>8.3f}  {f['placements_per_s']:>8.0f}  "
            f"{f['steady_pass_s']:>8.3f}  {f['capacities_s']:>12.3f}  "
            f"{f['place_many_s']:>12.3f}  {f['place_many_per_s']:>8.0f}"
        )
    lines.append("")
    for f in fleets:
        lines.append(
            f"{f['nodes']:>6} nodes: {f['fleet']}; {f['profiles_refused']} of "
            f"{f['models']} profiles had replicas no node fits"
        )
    lines.append(
        f"target ({TARGET_REPLICAS} replicas on {TARGET_NODES} nodes, one pass under "
        f"{TARGET_SECONDS:g} s): {target(fleets)['text']}"
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Place replicas on synthetic fleets through the real reconciler."
    )
    p.add_argument("--nodes", default="100,1000,2000,5000", help="comma-separated fleet sizes")
    p.add_argument("--replicas", type=int, default=TARGET_REPLICAS, help="replicas in all")
    p.add_argument("--runs", type=int, default=3, help="runs per fleet; the best counts")
    p.add_argument("--seed", type=int, default=1, help="seeds the fleets and the catalog")
    p.add_argument(
        "--card-weight",
        type=float,
        default=CARD_MODEL_WEIGHT,
        help="replicas of a card model against a CPU one; 1 asks more than 2,000 nodes hold",
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="write the results as JSON to PATH, or print them instead of the table",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(x) for x in args.nodes.split(",") if x.strip()]
    if args.runs < 1 or args.replicas < 1 or not counts:
        print("bench/scheduler.py: give --runs, --replicas and --nodes of 1 or more")
        return 2
    fleets = [bench_n(n, args) for n in counts]
    out = {
        "machine": machine(),
        "seed": args.seed,
        "card_weight": args.card_weight,
        "fleets": fleets,
        "target": target(fleets),
    }
    if args.json == "-":
        print(json.dumps(out, indent=2))
    else:
        print(report(fleets, args), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
