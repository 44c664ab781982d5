"""``llmgw ctl engines [set|unset]`` and ``llmgw ctl engine-build NODE BUILD``: which
engines the fleet runs at which versions, and what every node has against that."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from llmgw.client import Client, Subcommands
from llmgw.client.tables import render, when
from llmgw.wire.admin import EnginesJson


def wanted_table(doc: EnginesJson) -> str:
    rows = [
        [
            str(e["engine"]),
            str(e["version"]),
            str(e.get("source") or "-"),
            ", ".join(sorted(e.get("sha256") or {})) or "-",
        ]
        for e in doc.get("engines") or []
    ]
    if not rows:
        return "The fleet names no engine: each node runs what it was given."
    return render(["ENGINE", "VERSION", "FROM", "SHA256 PINNED FOR"], rows)


def nodes_table(doc: EnginesJson) -> str:
    rows = [
        [
            str(r["node"]),
            str(r["engine"]),
            str(r["wanted"]),
            ", ".join(r.get("versions") or []) or "-",
            str(r["build"]),
            str(r["state"]),
            str(r.get("message") or ""),
        ]
        for r in doc.get("nodes") or []
    ]
    if not rows:
        return "No node has registered yet."
    return render(["NODE", "ENGINE", "WANTED", "HAS", "BUILD", "STATE", "WORDS"], rows)


def parse_pins(values: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for value in values:
        asset, sep, digest = value.partition("=")
        if not sep or not asset or not digest:
            raise SystemExit(
                f"--sha256 takes ASSET=HEX (llama-b6000-bin-ubuntu-x64.tar.gz=...), not {value!r}"
            )
        pins[asset] = digest
    return pins


def parse_packages(values: list[str]) -> dict[str, list[str]]:
    """``--package apt=libgomp1`` (repeated) as ``{apt: [libgomp1]}``."""
    packages: dict[str, list[str]] = {}
    for value in values:
        manager, sep, name = value.partition("=")
        if not sep or manager not in ("apt", "dnf") or not name:
            raise SystemExit(
                f"--package takes apt=NAME or dnf=NAME (apt=libgomp1, dnf=libgomp), not {value!r}"
            )
        packages.setdefault(manager, []).append(name)
    return packages


def keep_given(action: argparse.ArgumentParser) -> None:
    """An action's copies of ``engines``' own options (``--json``, ``--server``...) keep
    what was given before the action: argparse writes a subcommand's defaults over its
    parent's values, so theirs are left unset unless given after it."""
    for option in action._actions:
        if option.dest in ("json", "server", "token", "data_dir"):
            option.default = argparse.SUPPRESS


def json_and_client_options(
    p: argparse.ArgumentParser,
    client_options: Callable[[argparse.ArgumentParser], None],
    action: bool = True,
) -> None:
    """A command's ``--json`` and the client's options; on an ``action`` (a subcommand
    of a command that takes them too) they keep what was given before it."""
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    client_options(p)
    if action:
        keep_given(p)


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def show(args: argparse.Namespace) -> int:
        doc = client(args).engines()
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            print(wanted_table(doc))
            print()
            print(nodes_table(doc))
        return 0

    def change(unset: bool) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            body: dict[str, object] = {"engine": args.engine, "unset": unset}
            if not unset:
                body["version"] = args.version
                body["sha256"] = parse_pins(args.sha256 or [])
                if args.index_url:
                    body["index_url"] = args.index_url
                if args.package:
                    body["packages"] = parse_packages(args.package)
            doc = client(args).set_engine(body)
            if args.json:
                print(json.dumps(doc, indent=2))
            elif unset:
                print(f"the fleet no longer names {args.engine}; its installs stay where they are")
            else:
                print(
                    f"the fleet runs {args.engine} {args.version}: every node installs it in the "
                    "background, and replicas move to it one at a time "
                    "(`llmgw ctl engines` shows how far)"
                )
            return 0

        return run

    def history(args: argparse.Namespace) -> int:
        found = client(args).engines_history()
        if args.json:
            print(json.dumps(found, indent=2))
            return 0
        if not found:
            print("The fleet's engines have not been changed yet.")
            return 0
        table = [
            [when(r.get("at")), str(r.get("actor") or "-"), str(r.get("change") or "")]
            for r in found
        ]
        print(render(["WHEN (UTC)", "WHO", "CHANGE"], table))
        return 0

    def build(args: argparse.Namespace) -> int:
        doc = client(args).engine_build(args.node, args.build)
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            print(f"{args.node} installs the {args.build} build of its engines")
        return 0

    engines = ctl_cmds.add_parser(
        "engines", help="the engines the fleet runs, and every node's standing with them"
    )
    engines.add_argument("--json", action="store_true", help="print the API's JSON")
    client_options(engines)
    engines.set_defaults(handler=show)
    sub = engines.add_subparsers(dest="engines_command", metavar="ACTION")
    p = sub.add_parser("set", help="run ENGINE at VERSION across the fleet")
    p.add_argument("engine", help="llama.cpp, vllm, sglang, freetoken or tensorrt-llm")
    p.add_argument("version", help="b6000 for llama.cpp; 0.11.0 for vLLM")
    p.add_argument(
        "--sha256",
        action="append",
        metavar="ASSET=HEX",
        help="the digest a release archive must have (repeat per platform)",
    )
    p.add_argument("--index-url", help="the Python engines: the package index to install from")
    p.add_argument(
        "--package",
        action="append",
        metavar="MANAGER=NAME",
        help="an OS package the engine needs, for apt or dnf (apt=libgomp1; repeat): each "
        "node installs the missing ones from its own package sources",
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    client_options(p)
    keep_given(p)
    p.set_defaults(handler=change(False))
    p = sub.add_parser("history", help="every change: when, who, what")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    client_options(p)
    keep_given(p)
    p.set_defaults(handler=history)
    p = sub.add_parser("unset", help="stop naming ENGINE (nodes keep what they have)")
    p.add_argument("engine")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    client_options(p)
    keep_given(p)
    p.set_defaults(handler=change(True))

    p = ctl_cmds.add_parser(
        "engine-build", help="which build of the engines NODE installs (auto|cu13|cu129|cpu|none)"
    )
    p.add_argument("node")
    p.add_argument("build", choices=["auto", "cu13", "cu129", "cpu", "none"])
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    client_options(p)
    p.set_defaults(handler=build)
