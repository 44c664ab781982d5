"""``llmgw ctl firewall [set|unset|history]``: llmgw's firewall on every node, changed
live (every agent loads its table as it hears of the change)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from llmgw.client import Client, Subcommands
from llmgw.client.ctl_engines import json_and_client_options
from llmgw.client.tables import render, when
from llmgw.wire.admin import FirewallJson


def shown(doc: FirewallJson) -> str:
    source = doc.get("source") or {}
    networks = ", ".join(doc.get("networks") or []) or "any"
    rows = [
        ["enabled", "yes" if doc.get("enabled") else "no", str(source.get("enabled", "-"))],
        ["networks", networks, str(source.get("networks", "-"))],
    ]
    return render(["FIREWALL", "VALUE", "FROM"], rows)


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def show(args: argparse.Namespace) -> int:
        doc = client(args).firewall()
        print(json.dumps(doc, indent=2) if args.json else shown(doc))
        return 0

    def change(unset: bool) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            body: dict[str, object] = {"unset": unset}
            if not unset:
                if args.enabled is None and args.network is None and not args.any_network:
                    raise SystemExit("say --on, --off, --network CIDR or --any-network")
                if args.network and args.any_network:
                    raise SystemExit("--network and --any-network: give one or the other")
                if args.enabled is not None:
                    body["enabled"] = args.enabled
                if args.any_network:
                    body["networks"] = []
                elif args.network is not None:
                    body["networks"] = list(args.network)
            doc = client(args).set_firewall(body)
            if args.json:
                print(json.dumps(doc, indent=2))
            else:
                print(shown(doc))
                print("every agent loads its table now (`llmgw firewall status` on a node)")
            return 0

        return run

    def history(args: argparse.Namespace) -> int:
        found = client(args).firewall_history()
        if args.json:
            print(json.dumps(found, indent=2))
        elif not found:
            print("The firewall has not been changed yet.")
        else:
            rows = [[when(r.get("at")), str(r.get("actor") or "-"), r["change"]] for r in found]
            print(render(["WHEN (UTC)", "WHO", "CHANGE"], rows))
        return 0

    def options(p: argparse.ArgumentParser, action: bool = True) -> None:
        json_and_client_options(p, client_options, action)

    wall = ctl_cmds.add_parser(
        "firewall", help="llmgw's firewall on every node: on or off, the agents' networks"
    )
    options(wall, action=False)
    wall.set_defaults(handler=show)
    sub = wall.add_subparsers(dest="firewall_command", metavar="ACTION")
    p = sub.add_parser("set", help="turn it on or off, or name the agents' networks (live)")
    on_off = p.add_mutually_exclusive_group()
    on_off.add_argument(
        "--on",
        dest="enabled",
        action="store_const",
        const=True,
        default=None,
        help="keep llmgw's nftables table on every node",
    )
    on_off.add_argument(
        "--off",
        dest="enabled",
        action="store_const",
        const=False,
        help="take the table out on every node",
    )
    p.add_argument(
        "--network",
        action="append",
        metavar="CIDR",
        help="a network agents may reach a control plane's agents' port from (repeat)",
    )
    p.add_argument("--any-network", action="store_true", help="agents from any network")
    options(p)
    p.set_defaults(handler=change(False))
    p = sub.add_parser("unset", help="back to server.yaml's firewall")
    options(p)
    p.set_defaults(handler=change(True))
    p = sub.add_parser("history", help="every change: when, who, what")
    options(p)
    p.set_defaults(handler=history)
