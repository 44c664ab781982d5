"""``llmgw ctl model plan SOURCE``: what a model needs and where it fits, before serving it.

Asks the control plane (``GET /api/v1/plan``) and prints the model's shape, the memory a
replica needs in all and per card, each node's verdict with its reasons, and the CPU
speed from each node's measured memory read rate (with a warning when a reply would
take minutes); ``--json`` prints the answer as it came. With ``--nodes N`` it plans one
replica spanning N nodes: each node's verdict is on its share (the layers cut over the
nodes, ``--gpus`` cards on each), then the sets of nodes it could go to, best first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llmgw.client.tables import DASH, render, span_line
from llmgw.wire.admin import PlanJson

GIB = 2**30


def add_plan_parser(model_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``plan`` to the ``ctl model`` subcommands."""
    p = model_sub.add_parser(
        "plan", help="what a model needs (memory per replica and card) and where it fits"
    )
    p.add_argument("source", help="hf:ORG/REPO[:QUANT|:FILE.gguf], https://.../FILE.gguf or /PATH")
    p.add_argument("--context", type=int, help="tokens per request (default: the trained one)")
    p.add_argument("--slots", type=int, default=1, help="requests served at once (default 1)")
    p.add_argument(
        "--gpus", type=int, help="cards per replica, per node with --nodes (0: the CPU only)"
    )
    p.add_argument(
        "--nodes",
        type=int,
        help="nodes one replica spans, its layers split over them (default 1; with it, "
        "--gpus defaults to 1 a node)",
    )
    p.add_argument("--cpu-cores", type=int, help="CPU cores a CPU replica may use")
    p.add_argument(
        "--engine", help="llama.cpp, vllm, sglang, freetoken, tensorrt-llm (default: by format)"
    )
    p.add_argument("--allow-pickle", action="store_true", help="plan pickled weights too")
    p.add_argument("--json", action="store_true")
    p.add_argument("--server", help="control plane HTTP address, HOST:PORT (or LLMGW_SERVER)")
    p.add_argument("--token", help="admin token (or LLMGW_TOKEN)")
    p.add_argument("--data-dir", help="control plane data dir to find both in (or LLMGW_DATA_DIR)")
    p.set_defaults(handler=cmd_model_plan)


def plan_query(args: argparse.Namespace) -> dict[str, str]:
    """``GET /api/v1/plan``'s query for the command's options."""
    query: dict[str, str] = {"source": args.source}
    for name in ("context", "slots", "gpus", "cpu_cores", "engine", "nodes"):
        value = getattr(args, name, None)
        if value is not None:
            query[name] = str(value)
    if getattr(args, "allow_pickle", False):
        query["allow_pickle"] = "true"
    return query


def cmd_model_plan(args: argparse.Namespace) -> int:
    from llmgw.client.admin import resolve

    client = resolve(args.server, args.token, Path(args.data_dir) if args.data_dir else None)
    # Reading a header from the hub can take longer than a plain admin call.
    client = type(client)(client.base_url, client.token, timeout=120.0)
    result = client.plan(plan_query(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(plan_text(result))
    return 0


def _gib(value: object) -> str:
    if not isinstance(value, int | float):
        return DASH
    return f"{value / GIB:.1f} GiB"


def _num(value: object) -> str:
    if not isinstance(value, int | float):
        return DASH
    if isinstance(value, int) and value >= 10_000_000:
        return f"{value / 1e9:.2f} B"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def plan_text(plan: PlanJson) -> str:
    """The plan as an operator reads it."""
    shape = plan["shape"]
    lines = [f"{plan.get('source')}  ({plan.get('format')}, {_gib(plan.get('weight_bytes'))})"]
    facts = [
        ("architecture", shape.get("architecture")),
        ("parameters", _num(shape.get("parameters"))),
        ("quantisation", shape.get("quantisation")),
        ("layers", shape.get("layers")),
        ("heads / KV heads", f"{shape.get('heads') or DASH} / {shape.get('kv_heads') or DASH}"),
        ("head size", shape.get("head_size")),
        ("trained context", _num(shape.get("trained_context"))),
    ]
    if shape.get("experts"):
        facts.append(("experts", f"{shape.get('experts_used')} of {shape.get('experts')}"))
    for label, value in facts:
        lines.append(f"  {label + ':':<18}{value if value is not None else DASH}")
    memory = plan["memory"]
    cards = memory["cards"] or 1
    spans = plan.get("spans")
    spread = plan.get("replica_nodes", 1)
    across = f", spanning {spread} nodes (layers split over them)" if spread > 1 else ""
    lines += [
        "",
        f"Replica: engine {plan.get('engine')}, context {_num(plan.get('context'))} "
        f"({plan.get('context_basis')}) x {plan.get('slots')} slot(s){across}",
        f"  weights {_gib(memory.get('weights'))} + KV cache {_gib(memory.get('kv_cache'))} "
        f"+ overhead {_gib(memory.get('overhead'))} = {_gib(memory.get('total'))}",
    ]
    if cards > 1:
        per_card = ", ".join(_gib(b) for b in memory["per_card"])
        where = f", {cards // spread} on each node" if spread > 1 else ""
        lines.append(f"  on {cards} cards{where} ({memory.get('split')} split): {per_card}")
    cpu_memory = plan["memory_cpu"]
    if spread > 1:
        shares = ", ".join(_gib(b) for b in cpu_memory["per_card"])
        lines.append(f"  on the CPUs: {shares} of host memory, one share a node")
    else:
        lines.append(f"  on the CPU: {_gib(cpu_memory['total'])} of host memory")
    rows = []
    speed_warnings: list[str] = []
    for node in plan["nodes"]:
        cpu = node["cpu"]
        gpu = node["gpu"]
        if node["where"] == "cards" and gpu is not None:
            verdict = "fits on " + ", ".join(
                f"card {c['index']} ({_gib(c['free'])} free)" for c in gpu["cards"]
            )
        elif node["where"] == "cpu":
            verdict = f"fits on the CPU ({_gib(cpu['available'])} available)"
        else:
            verdict = "no: " + "; ".join(node["reasons"])
        tps = cpu["tokens_per_second"]
        speed = f"{tps:.1f}" if isinstance(tps, int | float) else DASH
        rate = cpu["memory_read_gbs"]
        rows.append(
            [
                node["node"],
                node["state"],
                _num(node["max_context"]),
                f"{rate:g}" if isinstance(rate, int | float) else DASH,
                speed,
                verdict,
            ]
        )
        if cpu["warning"]:
            speed_warnings.append(f"{node['node']}: on the CPU, {cpu['warning']}")
    lines.append("")
    if rows:
        lines.append(
            render(["NODE", "STATE", "MAX CONTEXT", "MEM GB/S", "CPU TOK/S", "VERDICT"], rows)
        )
    else:
        lines.append("No nodes.")
    fits = plan["fits_on"]
    lines.append("")
    if spans is not None:
        lines.append(f"One replica spans {spread} nodes; the sets it could go to, best first:")
        lines += [f"  {span_line(s)}" for s in spans] or ["  no node fits its share"]
        lines.append("")
        lines.append(
            f"Fits now on: {', '.join(fits)} (one replica across them)"
            if fits
            else f"Fits now on: no set of {spread} nodes (reasons above)"
        )
    else:
        lines.append(
            f"Fits now on: {', '.join(fits)}" if fits else "Fits now on: no node (reasons above)"
        )
    for warning in [*plan["warnings"], *speed_warnings]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
