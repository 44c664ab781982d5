"""``llmgw ctl model adapter add|remove|list``: a model's LoRA adapters, each a thin
call of ``/api/v1/models/{name}/adapters`` with ``--json``.

Every command answers the model's adapters as they now are; ``--json`` prints them as
the API gives them, a stable list of ``{name, source, scale}`` in the order the
replicas load them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from llmgw.client import Client, Subcommands
from llmgw.client.tables import render
from llmgw.wire.admin import AdapterJson


def adapters_table(model: str, adapters: list[AdapterJson]) -> str:
    if not adapters:
        return (
            f"{model} has no LoRA adapters. Add one with "
            f"`llmgw ctl model adapter add {model} NAME SOURCE`."
        )
    rows = [[a["name"], f"{a['scale']:g}", a["source"]] for a in adapters]
    table = render(["NAME", "SCALE", "SOURCE"], rows)
    return f"{table}\n\nAsk for one as {model}:NAME or NAME (`llmgw ctl model adapter --help`)."


def commands(client: Client) -> dict[str, Callable[[argparse.Namespace], int]]:
    def show(args: argparse.Namespace, adapters: list[AdapterJson], said: str = "") -> int:
        if args.json:
            print(json.dumps(adapters, indent=2))
            return 0
        if said:
            print(said)
        print(adapters_table(args.model, adapters))
        return 0

    def add(args: argparse.Namespace) -> int:
        # No source: the adapter a fine-tune of that name made, kept by the control plane.
        source = args.source if args.source is not None else f"finetune:{args.name}"
        body: dict[str, object] = {"name": args.name, "source": source}
        if args.scale is not None:
            body["scale"] = args.scale
        adapters = client(args).add_adapter(args.model, body)
        said = (
            f"added {args.name} to {args.model}; its replicas are replaced with it one by "
            "one (`llmgw ctl replicas`)\n"
        )
        return show(args, adapters, said)

    def remove(args: argparse.Namespace) -> int:
        adapters = client(args).remove_adapter(args.model, args.name)
        said = (
            f"removed {args.name} from {args.model}; its replicas are replaced without it "
            "one by one\n"
        )
        return show(args, adapters, said)

    def list_adapters(args: argparse.Namespace) -> int:
        return show(args, client(args).adapters(args.model))

    return {"add": add, "remove": remove, "list": list_adapters}


def add_adapter_parsers(
    model_sub: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """``ctl model adapter ...`` under ``ctl model``'s subparsers."""
    run = commands(client)
    adapter = model_sub.add_parser(
        "adapter",
        help="a model's LoRA adapters: clients ask for MODEL:NAME or NAME",
        description="LoRA adapters every replica of a model loads, unapplied; a request "
        "whose model is MODEL:NAME (or NAME) applies one. Adding or removing one replaces "
        "the replicas, one by one.",
    )
    sub = adapter.add_subparsers(dest="adapter_command", metavar="ACTION")

    def leaf(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print the API's JSON")
        client_options(p)
        p.set_defaults(handler=run[name])
        p.add_argument("model")
        return p

    p = leaf("add", "add a LoRA adapter to a model")
    p.add_argument("name", help="the name clients ask for (one namespace with the models)")
    p.add_argument(
        "source",
        nargs="?",
        help="hf:ORG/REPO[:FILE], https://..., or a path on the nodes (llama.cpp: a LoRA "
        "GGUF; vLLM: a PEFT directory); left out: the adapter `llmgw ctl finetune` made "
        "under NAME (finetune:NAME)",
    )
    p.add_argument(
        "--scale", type=float, help="how strongly llama.cpp applies it (default 1; vLLM ignores)"
    )
    p = leaf("remove", "remove a LoRA adapter from a model")
    p.add_argument("name")
    leaf("list", "a model's LoRA adapters")
