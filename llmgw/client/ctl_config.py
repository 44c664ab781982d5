"""``llmgw ctl config get|set|unset|history``: the agents' settings the cluster decides
(``agents.default`` and ``agents.nodes.<id>``; docs/configuration.md)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import yaml

from llmgw.client.tables import render, when

Client = Callable[[argparse.Namespace], Any]


def document_text(doc: dict[str, Any]) -> str:
    """The settings as agent.yaml would say them: the default, then each node's."""
    shown = {"agents": {"default": doc.get("default") or {}, "nodes": doc.get("nodes") or {}}}
    return yaml.safe_dump(shown, sort_keys=True, default_flow_style=False).rstrip()


def history_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "No agent setting has been changed yet."
    body = [
        [
            when(r.get("at")),
            str(r.get("actor") or "-"),
            str(r.get("layer") or "-"),
            ("unset " if r.get("action") == "agents.unset" else "") + str(r.get("change") or ""),
        ]
        for r in rows
    ]
    return render(["WHEN (UTC)", "WHO", "LAYER", "CHANGE"], body)


def add_parsers(
    ctl_cmds: Any, client: Client, client_options: Callable[[argparse.ArgumentParser], None]
) -> None:
    def get(args: argparse.Namespace) -> int:
        asked = {k: v for k, v in (("key", args.key), ("node", args.node)) if v}
        answer = client(args).get("/api/v1/config" + (f"?{urlencode(asked)}" if asked else ""))
        if args.json:
            print(json.dumps(answer, indent=2))
        elif args.key:
            value = answer["value"]
            print(
                "(unset)" if value is None else yaml.safe_dump(value).rstrip().removesuffix("\n...")
            )
        elif args.node:
            print(yaml.safe_dump(answer["settings"], sort_keys=True).rstrip() or "{}")
        else:
            print(document_text(answer))
        return 0

    def change(unset: bool) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            body: dict[str, Any] = {"key": args.key, "unset": unset}
            if not unset:
                body["value"] = args.value
            if args.node:
                body["node"] = args.node
            answer = client(args).post("/api/v1/config", body)
            if args.json:
                print(json.dumps(answer, indent=2))
            else:
                layer = f"node {args.node}" if args.node else "every node"
                print(f"{args.key} {'unset' if unset else 'set'} for {layer}")
            return 0

        return run

    def history(args: argparse.Namespace) -> int:
        rows = client(args).get("/api/v1/config/history")
        print(json.dumps(rows, indent=2) if args.json else history_table(rows))
        return 0

    config = ctl_cmds.add_parser("config", help="the agents' settings, for every node or one")
    sub = config.add_subparsers(dest="config_command", metavar="ACTION")

    def leaf(name: str, run: Callable[[argparse.Namespace], int], text: str) -> Any:
        p = sub.add_parser(name, help=text)
        p.add_argument("--json", action="store_true", help="print the API's JSON")
        client_options(p)
        p.set_defaults(handler=run)
        return p

    p = leaf("get", get, "the settings (or one key's value); --node: what that node is given")
    p.add_argument("key", nargs="?", help="a setting, dotted (discovery.slow_interval)")
    p.add_argument("--node", help="that node's layer (with KEY) or its merged settings")
    p = leaf("set", change(False), "set a setting for every node, or one (--node)")
    p.add_argument("key", help="a setting, dotted (discovery.slow_interval)")
    p.add_argument("value", help="its value, as YAML: 10, true, [a, b], {llama.cpp: /opt/x}")
    p.add_argument("--node", help="this node only; its value wins there")
    p = leaf("unset", change(True), "remove a setting from every node's layer, or one's")
    p.add_argument("key")
    p.add_argument("--node")
    leaf("history", history, "every change: when, who, which layer, what")
