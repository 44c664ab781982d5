"""``llmgw version [--cluster] [--json]``: this llmgw's version, or every process of the
cluster with the llmgw it runs (each control plane, then each agent)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from llmgw import __version__
from llmgw.client import Client, Subcommands
from llmgw.client.tables import render
from llmgw.wire.admin import VersionsJson

DASH = "-"


def versions_text(answer: VersionsJson) -> str:
    """Two tables (control planes, agents) and, when they differ, which versions run."""
    planes = [
        [
            s["name"] + (" *" if s["this"] else ""),
            s["role"] or "not answering",
            s["version"] or DASH,
            "yes" if s["answers"] else "no",
        ]
        for s in answer["servers"]
    ]
    out = render(["CONTROL PLANE", "ROLE", "VERSION", "ANSWERS"], planes)
    if answer["nodes"]:
        agents = [
            [n["id"], n["version"] or DASH, "yes" if n["connected"] else "no"]
            for n in answer["nodes"]
        ]
        out += "\n\n" + render(["NODE", "VERSION", "CONNECTED"], agents)
    else:
        out += "\n\nNo nodes yet."
    out += "\n(* the control plane that answered)"
    running: dict[str, list[str]] = {}
    for s in answer["servers"]:
        if s["version"]:
            running.setdefault(s["version"], []).append(s["name"])
    for n in answer["nodes"]:
        if n["version"] and n["connected"]:
            running.setdefault(n["version"], []).append(n["id"])
    if len(running) > 1:
        said = "; ".join(f"{v}: {', '.join(names)}" for v, names in sorted(running.items()))
        out += f"\n{len(running)} versions run: {said}"
    return out


def add_parsers(
    roles: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def version(args: argparse.Namespace) -> int:
        if not args.cluster:
            print(json.dumps({"version": __version__}) if args.json else f"llmgw {__version__}")
            return 0
        answer = client(args).versions()
        print(json.dumps(answer, indent=2) if args.json else versions_text(answer))
        return 0

    p = roles.add_parser(
        "version", help="this llmgw's version (--cluster: every control plane's and agent's)"
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="ask the control plane for every control plane's and agent's version",
    )
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=version)
