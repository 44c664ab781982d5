"""``llmgw sim`` benchmark: a generated fleet, a catalog that fills it, and an hour of a
Poisson trace, timed end to end in this process (reading the files, the simulation,
the report) as ``llmgw sim`` runs it.

Each size is run once, the smallest first as the baseline. The issue's target: 2,000
nodes x 1 hour of a trace in under a minute.

    .venv/bin/python bench/sim.py --nodes 200,2000 --rate 50 --hours 1
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llmgw.sim.command import add_parsers  # noqa: E402

SHAPES = {
    "llama-8b": {
        "parameters": 8_030_000_000,
        "file_bytes": "15GiB",
        "layers": 32,
        "embedding": 4096,
        "heads": 32,
        "kv_heads": 8,
        "head_size": 128,
        "trained_context": 131072,
    },
    "qwen-32b": {
        "parameters": 32_800_000_000,
        "file_bytes": "61GiB",
        "layers": 64,
        "embedding": 5120,
        "heads": 40,
        "kv_heads": 8,
        "head_size": 128,
        "trained_context": 131072,
    },
    "llama-70b": {
        "parameters": 70_600_000_000,
        "file_bytes": "131GiB",
        "layers": 80,
        "embedding": 8192,
        "heads": 64,
        "kv_heads": 8,
        "head_size": 128,
        "trained_context": 131072,
    },
}
# Model -> (cards a replica, replicas per 100 nodes of 8 cards, share of the requests).
CATALOG = {"llama-8b": (1, 200, 0.5), "qwen-32b": (2, 100, 0.3), "llama-70b": (4, 100, 0.2)}


def write_inputs(root: Path, nodes: int, rate: float, hours: float, seed: int) -> None:
    """MODELS.yaml and TRACE.jsonl; a model past the 1,000 replicas a profile may have is
    served as several (``llama-8b-1``, ``llama-8b-2``...), its requests shared out."""
    models = []
    names: list[str] = []
    weights: list[float] = []
    for base, (cards, per100, share) in CATALOG.items():
        replicas = max(1, per100 * nodes // 100)
        copies = -(-replicas // 1000)
        for j in range(1, copies + 1):
            name = f"{base}-{j}"
            models.append(
                {
                    "source": f"hf:bench/{name}",
                    "name": name,
                    "engine": "vllm",
                    "gpus": cards,
                    "replicas": replicas // copies,
                    "slots": 16,
                    "context": 8192,
                    "shape": {"architecture": "llama", **SHAPES[base]},
                }
            )
            names.append(name)
            weights.append(share / copies)
    (root / "models.yaml").write_text(json.dumps(models))  # JSON is YAML
    rng = random.Random(seed)
    t, end = 0.0, hours * 3600
    with (root / "trace.jsonl").open("w") as f:
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            model = rng.choices(names, weights)[0]
            prompt, output = rng.randint(50, 4000), rng.randint(10, 800)
            f.write(
                f'{{"at": {t:.3f}, "model": "{model}", "prompt_tokens": {prompt}, '
                f'"output_tokens": {output}}}\n'
            )


def run_once(root: Path, nodes: int, hours: float) -> tuple[float, float, dict[str, object]]:
    """Wall and CPU seconds of one ``llmgw sim --json``, and its report."""
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers())
    args = parser.parse_args(
        [
            "sim",
            "--nodes",
            f"{nodes}x8xH100",
            "--models",
            str(root / "models.yaml"),
            "--load",
            str(root / "trace.jsonl"),
            "--duration",
            f"{int(hours * 3600)}s",
            "--json",
        ]
    )
    out = io.StringIO()
    began, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(out):
        args.handler(args)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    return wall, cpu, json.loads(out.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="200,2000", help="fleet sizes, comma separated")
    ap.add_argument("--rate", type=float, default=50.0, help="requests a second")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    opts = ap.parse_args()
    # CPU seconds beside wall seconds: on a shared machine the wall clock counts the
    # others' work too.
    print(
        f"{'nodes':>6} {'cards':>6} {'replicas':>8} {'requests':>9} {'passes':>6} "
        f"{'seconds':>8} {'cpu s':>7}"
    )
    worst = 0.0
    for n in (int(x) for x in opts.nodes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            write_inputs(root, n, opts.rate, opts.hours, opts.seed)
            seconds, cpu, report = run_once(root, n, opts.hours)
        replicas = report["replicas"]
        assert isinstance(replicas, list)
        print(
            f"{n:>6} {report['cards']:>6} {len(replicas):>8} {report['requests']:>9} "
            f"{report['reconcile_passes']:>6} {seconds:>8.1f} {cpu:>7.1f}"
        )
        if n >= 2000:
            worst = max(worst, seconds)
    if worst:
        verdict = "meets" if worst < 60 else "misses"
        print(f"target: 2,000 nodes x {opts.hours:g} h under 60 s: {verdict} ({worst:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
