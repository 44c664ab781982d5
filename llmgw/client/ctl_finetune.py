"""``llmgw ctl finetune create|list|show|cancel``: fine-tune jobs, each a thin call of
``/api/v1/finetunes``; ``--json`` prints the API's JSON (``FinetuneJson``).

``create`` reads the pairs file here and sends it whole (JSONL: ``{"prompt",
"completion"}`` or ``{"messages": [...]}`` a line, at most 32 MiB): the control plane
judges it, naming a bad line, before anything goes to a node. The result is served with
``llmgw ctl model adapter add MODEL NAME`` (no source: the stored fine-tune).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from llmgw.client import Client, Subcommands
from llmgw.client.ctl_engines import json_and_client_options
from llmgw.client.tables import render, when
from llmgw.wire.admin import FinetuneJson

# Read no further than the control plane takes (32 MiB), and a little past it, so a
# larger file is refused with the control plane's words, not read whole.
READ_CAP = 32 * 1024 * 1024 + 1


def _loss(job: FinetuneJson) -> str:
    loss = job["loss"]
    if not loss:
        return "-"
    return f"{loss[0]:.3f} -> {loss[-1]:.3f}" if len(loss) > 1 else f"{loss[0]:.3f}"


def _step(job: FinetuneJson) -> str:
    if job["step"] is None:
        return "-"
    return f"{job['step']}/{job['steps']}" if job["steps"] else str(job["step"])


def jobs_table(jobs: list[FinetuneJson]) -> str:
    if not jobs:
        return (
            "No fine-tunes. Start one with `llmgw ctl finetune create --model M --data "
            "pairs.jsonl --name ADAPTER`."
        )
    rows = [
        [
            j["id"],
            j["name"],
            j["model"],
            j["node"] or "-",
            j["state"],
            _step(j),
            _loss(j),
            when(j["created"]),
        ]
        for j in jobs
    ]
    return render(["ID", "ADAPTER", "MODEL", "NODE", "STATE", "STEP", "LOSS", "CREATED"], rows)


def job_text(j: FinetuneJson) -> str:
    peak = "-" if j["peak_mib"] is None else f"{j['peak_mib']:,.0f} MiB"
    size = "-" if j["adapter_bytes"] is None else f"{j['adapter_bytes']:,} bytes"
    lines = [
        f"fine-tune: {j['id']} ({j['state']})",
        f"adapter:   {j['name']} of {j['model']}",
        f"base:      {j['base']}",
        f"node:      {j['node'] or '-'} ({j['device'] or '-'}; {j['mib']:,} MiB asked)",
        f"pairs:     {j['pairs']:,}; {j['epochs']} epoch(s), rank {j['rank']}",
        f"step:      {_step(j)}; loss {_loss(j)}; peak {peak}",
        f"result:    {size}",
        f"created:   {when(j['created'])}; updated {when(j['updated'])}",
    ]
    if j["doing"]:
        lines.append(f"doing:     {j['doing']}")
    if j["error"]:
        lines.append(f"error:     {j['error']}")
    if j["state"] == "succeeded":
        lines.append(
            f"\nServe it: `llmgw ctl model adapter add {j['model']} {j['name']}`, then ask for "
            f"{j['model']}:{j['name']}."
        )
    return "\n".join(lines)


def read_pairs(path: str) -> str:
    try:
        with Path(path).open("rb") as f:
            data = f.read(READ_CAP)
    except OSError as exc:
        raise SystemExit(f"--data {path}: {exc.strerror or exc}") from None
    if len(data) >= READ_CAP:
        raise SystemExit(f"--data {path}: larger than 32 MiB; train on a sample of it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SystemExit(f"--data {path}: line {line} is not UTF-8 text") from None


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def printed(job: FinetuneJson, args: argparse.Namespace) -> int:
        print(json.dumps(job, indent=2) if args.json else job_text(job))
        return 0

    def listed(args: argparse.Namespace) -> int:
        jobs = client(args).finetunes()
        print(json.dumps(jobs, indent=2) if args.json else jobs_table(jobs))
        return 0

    def show(args: argparse.Namespace) -> int:
        return printed(client(args).finetune(args.id), args)

    def create(args: argparse.Namespace) -> int:
        body: dict[str, object] = {
            "model": args.model,
            "name": args.name,
            "data": read_pairs(args.data),
        }
        for key in ("node", "mib", "epochs", "rank", "base"):
            if getattr(args, key) is not None:
                body[key] = getattr(args, key)
        job = client(args).create_finetune(body)
        if not args.json and job["state"] != "failed":
            print(
                f"fine-tune {job['id']} sent to {job['node']}; follow it with "
                f"`llmgw ctl finetune show {job['id']}`\n"
            )
        printed(job, args)
        return 1 if job["state"] == "failed" else 0

    def cancel(args: argparse.Namespace) -> int:
        return printed(client(args).cancel_finetune(args.id), args)

    def options(p: argparse.ArgumentParser, action: bool = True) -> None:
        json_and_client_options(p, client_options, action)

    ft = ctl_cmds.add_parser(
        "finetune",
        help="fine-tune jobs: a LoRA adapter of a model trained on your pairs",
        description="Train a LoRA adapter of a model on prompt/completion pairs on a node "
        "with the memory free (a card, or the CPU where a node has none), then serve it with "
        "`llmgw ctl model adapter add MODEL NAME`.",
    )
    options(ft, action=False)
    ft.set_defaults(handler=listed)
    sub = ft.add_subparsers(dest="finetune_command", metavar="ACTION")
    p = sub.add_parser("create", help="train an adapter: the pairs are checked first")
    p.add_argument("--model", required=True, help="the model the adapter is for")
    p.add_argument(
        "--data",
        required=True,
        metavar="PAIRS.jsonl",
        help='JSONL, a line each: {"prompt": ..., "completion": ...} or {"messages": [...]}; '
        "at most 32 MiB and 100,000 lines",
    )
    p.add_argument(
        "--name", required=True, help="the adapter's name (one namespace with the models)"
    )
    p.add_argument("--node", help="train on this node (default: one with the memory free)")
    p.add_argument(
        "--mib", type=int, help="MiB the training needs: a card's free memory, or RAM (8000)"
    )
    p.add_argument("--epochs", type=int, help="passes over the pairs (3)")
    p.add_argument("--rank", type=int, help="the LoRA's rank (16)")
    p.add_argument(
        "--base",
        metavar="SOURCE",
        help="the HF safetensors checkpoint to train on (hf:ORG/REPO, https://, a path on "
        "the node); needed for a GGUF model; default: the model's own source",
    )
    options(p)
    p.set_defaults(handler=create)
    p = sub.add_parser("list", help="every fine-tune: state, step, loss")
    options(p)
    p.set_defaults(handler=listed)
    p = sub.add_parser("show", help="one fine-tune: its progress, loss, peak memory, error")
    p.add_argument("id")
    options(p)
    p.set_defaults(handler=show)
    p = sub.add_parser("cancel", help="stop a fine-tune (its trainer is killed)")
    p.add_argument("id")
    options(p)
    p.set_defaults(handler=cancel)
