"""``llmgw ctl config get|set|unset|history``: the agents' settings the cluster decides
(``agents.default`` and ``agents.nodes.<id>``; docs/configuration.md)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import yaml

from llmgw.client import Client, Subcommands
from llmgw.client.tables import render, when
from llmgw.wire.admin import SettingsChangeJson, SettingsJson

# The keys that set the control plane, not the agents (server/fleet/agentsettings.py).
CONTROL_PLANE_KEYS = ("metrics.fleet_detail",)


def document_text(doc: SettingsJson) -> str:
    """The settings as agent.yaml would say them: the default, then each node's."""
    shown: dict[str, object] = {
        "agents": {"default": doc.get("default") or {}, "nodes": doc.get("nodes") or {}}
    }
    if doc.get("cluster"):
        shown["cluster"] = doc["cluster"]
    return yaml.safe_dump(shown, sort_keys=True, default_flow_style=False).rstrip()


def history_table(rows: list[SettingsChangeJson]) -> str:
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
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def get(args: argparse.Namespace) -> int:
        admin = client(args)
        if args.key:
            value = admin.setting(args.key, args.node)
            if args.json:
                print(json.dumps(value, indent=2))
            elif value["value"] is None:
                print("(unset)")
            else:
                print(yaml.safe_dump(value["value"]).rstrip().removesuffix("\n..."))
        elif args.node:
            settings = admin.node_settings(args.node)
            if args.json:
                print(json.dumps(settings, indent=2))
            else:
                print(yaml.safe_dump(settings["settings"], sort_keys=True).rstrip() or "{}")
        else:
            doc = admin.settings()
            print(json.dumps(doc, indent=2) if args.json else document_text(doc))
        return 0

    def change(unset: bool) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            body: dict[str, object] = {"key": args.key, "unset": unset}
            if not unset:
                body["value"] = args.value
            if args.node:
                body["node"] = args.node
            answer = client(args).set_setting(body)
            if args.json:
                print(json.dumps(answer, indent=2))
            else:
                layer = (
                    f"node {args.node}"
                    if args.node
                    else "the control plane"
                    if args.key in CONTROL_PLANE_KEYS
                    else "every node"
                )
                print(f"{args.key} {'unset' if unset else 'set'} for {layer}")
            return 0

        return run

    def history(args: argparse.Namespace) -> int:
        rows = client(args).settings_history()
        print(json.dumps(rows, indent=2) if args.json else history_table(rows))
        return 0

    config = ctl_cmds.add_parser(
        "config",
        help="the agents' settings, for every node or one, and the control plane's "
        "metrics.fleet_detail",
    )
    sub = config.add_subparsers(dest="config_command", metavar="ACTION")

    def leaf(
        name: str, run: Callable[[argparse.Namespace], int], text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text)
        p.add_argument("--json", action="store_true", help="print the API's JSON")
        client_options(p)
        p.set_defaults(handler=run)
        return p

    p = leaf("get", get, "the settings (or one key's value); --node: what that node is given")
    p.add_argument("key", nargs="?", help="a setting, dotted (discovery.slow_interval)")
    p.add_argument("--node", help="that node's layer (with KEY) or its merged settings")
    p = leaf("set", change(False), "set a setting for every node, or one (--node)")
    p.add_argument(
        "key",
        help="a setting, dotted (discovery.slow_interval); metrics.fleet_detail "
        "(on, off, auto) sets the control plane",
    )
    p.add_argument("value", help="its value, as YAML: 10, true, [a, b], {llama.cpp: /opt/x}")
    p.add_argument("--node", help="this node only; its value wins there")
    p = leaf("unset", change(True), "remove a setting from every node's layer, or one's")
    p.add_argument("key")
    p.add_argument("--node")
    leaf("history", history, "every change: when, who, which layer, what")
