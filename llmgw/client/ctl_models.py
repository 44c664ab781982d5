"""``llmgw ctl models``, ``ctl model ...``, ``ctl explain`` and ``ctl node ...``: the
catalog and scheduling commands, each a thin call of the admin API with ``--json``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from llmgw.client import Client, Subcommands, UsageError
from llmgw.client.tables import binary, count, render, span_line
from llmgw.wire.admin import ExplainJson, ModelJson, NodeJson, ProfileStatusJson

Shown = TypeVar("Shown")
# A profile the reconciler has not counted yet: nothing ready, nothing to say.
NO_STATUS: ProfileStatusJson = {
    "desired": 0,
    "ready": 0,
    "starting": 0,
    "stale": 0,
    "replacing": 0,
    "note": "",
}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'8GiB', '8G', '512MiB', '1.5T' or plain bytes."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (like 8GiB, 512MiB)")
    power = " KMGT".index(m.group(2).upper() or " ")
    return int(float(m.group(1)) * 1024**power)


def _label(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    key, value = text.split("=", 1)
    return key, value


def _print(value: object) -> None:
    print(json.dumps(value, indent=2))


# ------------------------------------------------------------------------- showing


def models_table(models: list[ModelJson]) -> str:
    if not models:
        return "No models. Serve one with `llmgw ctl model serve SOURCE`."
    rows = []
    for m in models:
        profiles = ", ".join(
            f"{p['name']} {(p.get('status') or NO_STATUS)['ready']}/{p['replicas']}"
            + (f" ({p['cards']} card)" if p["cards"] == 1 else "")
            + (f" ({p['cards']} cards)" if p["cards"] > 1 else "")
            for p in m["profiles"]
        )
        notes = [(p.get("status") or NO_STATUS)["note"] for p in m["profiles"]]
        note = m.get("parked") or "; ".join(n for n in notes if n)
        rows.append(
            [
                m["name"],
                m["state"],
                f"{m['ready']}/{m['desired']}",
                m["engine"],
                str(m["context"]),
                profiles,
                note[:100],
            ]
        )
    return render(["NAME", "STATE", "READY", "ENGINE", "CONTEXT", "PROFILES", "NOTE"], rows)


def model_text(m: ModelJson) -> str:
    if m.get("external"):
        return external_text(m)
    shape = m.get("shape") or {}
    lines = [
        f"{m['name']}: {m['state']}, {m['ready']} of {m['desired']} ready",
        f"  source:      {m['source']}",
        f"  engine:      {m['engine']}",
        f"  context:     {m['context']} tokens x {m['slots']} slot(s)"
        + (f", longest answer {m['max_output']}" if m.get("max_output") else ""),
    ]
    if shape:
        params = shape.get("parameters")
        lines.append(
            "  shape:       "
            + ", ".join(
                x
                for x in (
                    shape.get("architecture"),
                    f"{count(params)} parameters" if params else None,
                    f"{shape['layers']} layers" if shape.get("layers") else None,
                    f"{shape['kv_heads']} KV heads" if shape.get("kv_heads") else None,
                    f"trained for {shape['trained_context']}"
                    if shape.get("trained_context")
                    else None,
                    f"{binary(m['weight_bytes'])} of weights" if m.get("weight_bytes") else None,
                )
                if x
            )
        )
    if m.get("on_demand"):
        lines.append("  on demand:   yes (started by the first request, back to zero when idle)")
    if m.get("parked"):
        lines.append(f"  parked:      {m['parked']} (`llmgw ctl model start {m['name']}`)")
    if m.get("kv_events"):
        lines.append("  routing:     by vLLM's KV-cache events (where each prompt is cached)")
    if m.get("vision"):
        urls = "data: and http(s) URLs" if m.get("allow_image_urls") else "data: URLs"
        lines.append(f"  images:      takes images in chat requests ({urls})")
    if m.get("adapters"):
        names = ", ".join(a["name"] for a in m["adapters"])
        lines.append(f"  adapters:    {names} (ask for {m['name']}:NAME or NAME)")
    lines.append("  profiles:")
    for p in m["profiles"]:
        status = p.get("status") or NO_STATUS
        where = f"{p['cards']} card(s), {binary(p['card_memory'])} each" if p["cards"] else "CPU"
        if p.get("nodes", 1) > 1:
            where += f" on each of {p['nodes']} nodes (one replica spans them)"
        lines.append(
            f"    {p['name']}: {status['ready']}/{p['replicas']} ready, {p['engine']} on "
            f"{where}, {binary(p['memory'])} memory"
            + (f", {p['cpu_cores']:g} cores" if p["cpu_cores"] else "")
            + f", priority {p['priority']}"
            + (
                f", ~{p['cpu_tokens_per_second']:.1f} tokens/s a reply"
                if isinstance(p.get("cpu_tokens_per_second"), int | float)
                else ""
            )
        )
        if p.get("args"):
            lines.append(f"      args: {' '.join(p['args'])}")
        if p.get("selector"):
            lines.append(
                "      on nodes with: " + ", ".join(f"{k}={v}" for k, v in p["selector"].items())
            )
        if p.get("env"):
            lines.append("      env: " + " ".join(f"{k}={v}" for k, v in p["env"].items()))
        if p.get("card_class"):
            lines.append(f"      on cards of class: {p['card_class']}")
        if status["note"]:
            lines.append(f"      {status['note']}")
    return "\n".join(lines)


def external_text(m: ModelJson) -> str:
    ext = m.get("external")
    base_url = ext["base_url"] if ext else None
    lines = [f"{m['name']}: {m['state']}, external provider {base_url}"]
    if ext and ext["upstream_model"]:
        lines.append(f"  asked for as: {ext['upstream_model']}")
    for e in ext["endpoints"] if ext else []:
        problem = f" ({e['problem']})" if e.get("problem") else ""
        lines.append(f"  {e['name']}: weight {e['weight']:g}, {e['state']}{problem}")
    return "\n".join(lines)


def explain_text(profiles: list[ExplainJson]) -> str:
    out = []
    for p in profiles:
        need = [f"{binary(p['memory'])} memory"]
        if p["cards"]:
            need.append(f"{p['cards']} card(s) with {binary(p['card_memory'])} free")
        if p["cpu_cores"]:
            need.append(f"{p['cpu_cores']:g} cores")
        if p["disk"]:
            need.append(f"{binary(p['disk'])} disk unless the weights are there")
        out.append(
            f"{p['model']} / {p['profile']} ({p['engine']}): {p['desired']} wanted, "
            f"running on {', '.join(p['running_on']) or 'no node'}; a replica needs "
            + ", ".join(need)
        )
        if p.get("note"):
            out.append(f"  {p['note']}")
        if p.get("avoid"):
            out.append(f"  failed recently on: {', '.join(p['avoid'])}")
        spans = p.get("spans")
        if spans is not None:
            out.append(
                f"  one replica spans {p['nodes']} nodes; the sets it could go to, best first:"
            )
            out += [f"  {span_line(s)}" for s in spans] or ["  no node fits its share"]
        rows = []
        for v in sorted(p["verdicts"], key=lambda v: (v["rank"] is None, v["rank"], v["node"])):
            verdict = f"fits (#{v['rank']})" if v["ok"] else "no"
            why = "; ".join(v["reasons"] or v["notes"])
            cards = ", ".join(v["cards"])
            rows.append([v["node"], verdict, cards, why])
        out.append(render(["NODE", "VERDICT", "CARDS", "WHY"], rows) if rows else "  no nodes")
        out.append("")
    return "\n".join(out).rstrip()


# ------------------------------------------------------------------------ commands


def commands(client: Client) -> dict[str, Callable[[argparse.Namespace], int]]:
    def show(args: argparse.Namespace, value: Shown, text: Callable[[Shown], str]) -> int:
        if args.json:
            _print(value)
        else:
            print(text(value))
        return 0

    def models(args: argparse.Namespace) -> int:
        return show(args, client(args).models(), models_table)

    def serve(args: argparse.Namespace) -> int:
        body: dict[str, object] = {"source": args.source, "replicas": args.replicas}
        for key in ("name", "engine", "context", "slots", "gpus", "cpu_cores", "memory"):
            if getattr(args, key) is not None:
                body[key] = getattr(args, key)
        for key in ("max_output", "profile", "priority", "role", "card_class", "nodes"):
            if getattr(args, key) is not None:
                body[key] = getattr(args, key)
        body["on_demand"] = args.on_demand
        if args.kv_events:
            body["kv_events"] = True
        if args.allow_image_urls:
            body["allow_image_urls"] = True
        body["allow_pickle"] = args.allow_pickle
        if args.arg:
            body["args"] = args.arg
        if args.selector:
            body["selector"] = dict(args.selector)
        if args.env:
            body["env"] = dict(args.env)
        admin = client(args)
        model = admin.serve(body)
        job = model.get("job")
        follow = f"`llmgw ctl jobs --follow {job}`" if job else "`llmgw ctl replicas`"
        shown = show(
            args,
            model,
            lambda m: (
                model_text(m) + f"\n\nFollow it with {follow}; why it goes where it goes: "
                f"`llmgw ctl explain {m['name']}`."
            ),
        )
        if not args.wait or not job:
            return shown
        from llmgw.client.ctl_jobs import follow_job

        # With --json, stdout keeps the model's JSON alone; the steps go to stderr.
        return follow_job(admin, job, args.timeout, out=sys.stderr if args.json else sys.stdout)

    def model_show(args: argparse.Namespace) -> int:
        return show(args, client(args).model(args.model), model_text)

    def action(verb: str) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            body: dict[str, object] = {}
            if getattr(args, "in_place", False):
                body["in_place"] = True
            m = client(args).change_model(args.model, verb, body)
            return show(args, m, model_text)

        return run

    def remove(args: argparse.Namespace) -> int:
        answer = client(args).remove_model(args.model, args.with_files)
        files = " and its files once its replicas stop" if args.with_files else ""
        return show(args, answer, lambda a: f"removed {a['name']}{files}")

    def context(args: argparse.Namespace) -> int:
        body: dict[str, object] = {"in_place": args.in_place}
        if args.tokens is not None:
            body["context"] = args.tokens
        if args.slots is not None:
            body["slots"] = args.slots
        if args.max_output is not None:
            body["max_output"] = args.max_output
        return show(args, client(args).change_model(args.model, "context", body), model_text)

    def gpus(args: argparse.Namespace) -> int:
        body: dict[str, object] = {"gpus": args.count, "in_place": args.in_place}
        if args.profile:
            body["profile"] = args.profile
        return show(args, client(args).change_model(args.model, "gpus", body), model_text)

    def replicas(args: argparse.Namespace) -> int:
        body: dict[str, object] = {"replicas": args.count}
        if args.profile:
            body["profile"] = args.profile
        return show(args, client(args).change_model(args.model, "replicas", body), model_text)

    def external(args: argparse.Namespace) -> int:
        keys = []
        for option in args.key_file:
            path, weight = option, 1.0
            head, _, tail = option.rpartition(":")
            if head and tail.replace(".", "", 1).isdigit():
                path, weight = head, float(tail)
            try:
                secret = Path(path).read_text().strip()
            except OSError as exc:
                raise UsageError(f"--key-file {path}: {exc.strerror}") from None
            if not secret:
                raise UsageError(f"--key-file {path} is empty: it should hold one API key")
            keys.append({"key": secret, "weight": weight})
        body: dict[str, object] = {"name": args.name, "base_url": args.base_url, "keys": keys}
        if args.upstream_model:
            body["upstream_model"] = args.upstream_model
        if args.max_output:
            body["max_output"] = args.max_output
        return show(args, client(args).add_external(body), external_text)

    def explain(args: argparse.Namespace) -> int:
        return show(args, client(args).explain(args.model), explain_text)

    def node(verb: str) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            body: dict[str, object] = {}
            if verb == "labels":
                body = {
                    "set": dict(_label(x) for x in args.labels if not x.endswith("-")),
                    "remove": [x[:-1] for x in args.labels if x.endswith("-")],
                }
            view = client(args).mark(args.node, verb, body)

            def text(v: NodeJson) -> str:
                state = "draining" if v["draining"] else "cordoned" if v["cordoned"] else "open"
                labels = ", ".join(f"{k}={x}" for k, x in sorted(v["labels"].items()))
                return f"{v['id']}: {state} for new replicas; labels: {labels or 'none'}"

            return show(args, view, text)

        return run

    return {
        "models": models,
        "serve": serve,
        "show": model_show,
        "stop": action("stop"),
        "start": action("start"),
        "restart": action("restart"),
        "remove": remove,
        "context": context,
        "gpus": gpus,
        "replicas": replicas,
        "explain": explain,
        "external": external,
        "cordon": node("cordon"),
        "uncordon": node("uncordon"),
        "drain": node("drain"),
        "label": node("labels"),
    }


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> Subcommands:
    """Add the catalog's commands under ``llmgw ctl``; returns ``ctl model``'s
    subparsers so more can be added there."""
    run = commands(client)

    def leaf(sub: Subcommands, name: str, handler: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print the API's JSON")
        client_options(p)
        p.set_defaults(handler=run[handler])
        return p

    p = leaf(ctl_cmds, "models", "models", "every model in the catalog, its state and replicas")
    from llmgw.client.ctl_explore import add_explore_parser

    add_explore_parser(p, client_options)
    p = leaf(ctl_cmds, "explain", "explain", "every node's verdict for a model's replicas, and why")
    p.add_argument("model")

    model = ctl_cmds.add_parser("model", help="serve, change and remove models")
    sub = model.add_subparsers(dest="model_command", metavar="ACTION")
    p = leaf(sub, "serve", "serve", "add a model to the catalog and run it")
    p.add_argument("source", help="hf:ORG/REPO[:QUANT|:FILE], https://..., or a path on the nodes")
    p.add_argument("--name", help="the name clients ask for (default: from the source)")
    p.add_argument(
        "--engine",
        help="llama.cpp (default for GGUF), vllm (default otherwise), sglang, freetoken, "
        "tensorrt-llm",
    )
    p.add_argument("--replicas", type=int, default=1, help="how many (default 1)")
    p.add_argument("--context", type=int, help="tokens per request (default: trained, cut to fit)")
    p.add_argument("--slots", type=int, help="requests served at once per replica (default 1)")
    p.add_argument("--max-output", type=int, help="longest answer in tokens")
    p.add_argument(
        "--gpus", type=int, help="cards per replica, per node with --nodes (default 0: the CPU)"
    )
    p.add_argument("--cpu-cores", type=float, help="cores reserved per replica")
    p.add_argument("--memory", type=parse_size, help="memory per replica (default: estimated)")
    p.add_argument(
        "--nodes",
        type=int,
        help="nodes one replica spans (default 1): in one NVLink domain, else one "
        "InfiniBand fabric; `ctl explain` says which set and why",
    )
    p.add_argument("--on-demand", action="store_true", help="start on the first request")
    p.add_argument(
        "--kv-events",
        action="store_true",
        help="vLLM: route each request to the replica whose KV cache holds most of its prompt",
    )
    p.add_argument(
        "--arg", action="append", help="an engine argument (repeat; --arg=--flag for a flag)"
    )
    p.add_argument("--allow-pickle", action="store_true", help="allow pickled weights")
    p.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="a vision model: the gateway fetches http(s) image URLs in chat requests "
        "(public addresses only; default: data: URLs only)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for its serve job to end, printing each step: exit 0 when ready, 1 "
        "naming the step that failed and why",
    )
    p.add_argument(
        "--timeout", type=float, help="with --wait: give up after this many seconds (exit 1)"
    )
    p.add_argument("--profile", help="the profile's name (default 'default')")
    p.add_argument("--priority", type=int, help="higher profiles are used first")
    p.add_argument("--selector", action="append", type=_label, help="KEY=VALUE node label")
    p.add_argument(
        "--env",
        action="append",
        type=_label,
        metavar="NAME=VALUE",
        help="a variable in the engine's environment on every node (repeat; like "
        "NCCL_DEBUG=INFO); never LLMGW_*, loader variables or a path outside the replica",
    )
    p.add_argument("--role", help="run only on nodes labelled llmgw.role=ROLE")
    p.add_argument(
        "--card-class",
        help="only these cards: a product name ('NVIDIA H100 80GB HBM3') or a MIG class "
        "('a100-80g-mig-3g.40gb', one instance a replica); see `ctl nodes --json`",
    )
    p = leaf(sub, "external", "external", "an OpenAI-compatible provider as a model")
    p.add_argument("name")
    p.add_argument("--base-url", required=True, help="the provider's /v1 URL")
    p.add_argument(
        "--key-file",
        action="append",
        required=True,
        help="a file holding one API key, optionally :WEIGHT (repeat for several keys)",
    )
    p.add_argument("--upstream-model", help="the provider's name for the model")
    p.add_argument("--max-output", type=int, help="longest answer in tokens")
    from llmgw.client.ctl_plan import add_plan_parser

    add_plan_parser(sub)
    from llmgw.client.ctl_adapters import add_adapter_parsers

    add_adapter_parsers(sub, client, client_options)
    p = leaf(sub, "show", "show", "a model: shape, context, profiles and their replicas")
    p.add_argument("model")
    for verb, text in (
        ("stop", "stop every replica; the catalog keeps the model"),
        ("start", "start a stopped or parked model again"),
    ):
        leaf(sub, verb, verb, text).add_argument("model")
    p = leaf(sub, "restart", "restart", "replace every replica, one by one")
    p.add_argument("model")
    p.add_argument("--in-place", action="store_true", help="stop each before its replacement")
    p = leaf(sub, "remove", "remove", "take a model out of the catalog and stop its replicas")
    p.add_argument("model")
    p.add_argument("--with-files", action="store_true", help="also delete its weights on nodes")
    p = leaf(sub, "context", "context", "change the context (replicas restart one by one)")
    p.add_argument("model")
    p.add_argument("tokens", type=int, nargs="?", help="tokens per request")
    p.add_argument("--slots", type=int, help="requests served at once per replica")
    p.add_argument("--max-output", type=int, help="longest answer (alone: changes no replica)")
    p.add_argument("--in-place", action="store_true", help="stop each before its replacement")
    p = leaf(sub, "gpus", "gpus", "cards per replica of a profile")
    p.add_argument("model")
    p.add_argument("count", type=int)
    p.add_argument("--profile")
    p.add_argument("--in-place", action="store_true", help="stop each before its replacement")
    p = leaf(sub, "replicas", "replicas", "replicas of a profile (a new name adds a CPU profile)")
    p.add_argument("model")
    p.add_argument("count", type=int)
    p.add_argument("--profile")

    node = ctl_cmds.add_parser("node", help="cordon, drain, uncordon and label a node")
    node_sub = node.add_subparsers(dest="node_command", metavar="ACTION")
    for verb, text in (
        ("cordon", "take no new replicas; keep what runs"),
        ("drain", "take no new replicas and move what runs elsewhere"),
        ("uncordon", "take new replicas again"),
    ):
        leaf(node_sub, verb, verb, text).add_argument("node")
    p = leaf(node_sub, "label", "label", "set KEY=VALUE or remove KEY- labels")
    p.add_argument("node")
    p.add_argument("labels", nargs="+", help="KEY=VALUE to set, KEY- to remove")
    return sub
