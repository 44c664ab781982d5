"""``llmgw ctl nodes|status|replicas|logs|weights|shard``: the cluster's nodes and what
runs on them, looked at and steered one node at a time."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from llmgw.client import Client, Subcommands, UsageError
from llmgw.client.tables import (
    collect_text,
    nodes_table,
    replicas_table,
    status_text,
    weights_table,
)


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def nodes(args: argparse.Namespace) -> int:
        found = client(args).nodes()
        if args.json:
            _print_json(found)
        else:
            print(nodes_table(found))
        return 0

    def status(args: argparse.Namespace) -> int:
        status = client(args).status()
        if args.json:
            _print_json(status)
        else:
            print(status_text(status))
        return 0

    def replicas(args: argparse.Namespace) -> int:
        rows = client(args).replicas()
        if args.json:
            _print_json(rows)
        else:
            print(replicas_table(rows))
        return 0

    def logs(args: argparse.Namespace) -> int:
        admin = client(args)
        if not args.follow:
            for line in admin.logs(args.node, args.source, args.lines):
                print(line)
            return 0
        for batch in admin.follow_logs(args.node, args.source, args.lines):
            if isinstance(batch, dict):
                raise UsageError(str(batch["error"]))
            for line in batch:
                print(line, flush=True)
        return 0

    def shard_start(args: argparse.Namespace) -> int:
        body: dict[str, object] = {
            "replica_id": args.replica,
            "engine": args.engine,
            "source": args.source,
            "port": args.port,
            "args": args.arg or [],
            "cards": args.card or [],
            "allow_pickle": args.allow_pickle,
        }
        if args.model:
            body["model"] = args.model
        if args.cpu_cores:
            body["cpu_cores"] = args.cpu_cores
        answer = client(args).start_shard(args.node, body)
        if args.json:
            _print_json(answer)
        else:
            print(f"asked {args.node} to start {args.replica}; see `llmgw ctl replicas`")
        return 0

    def shard_stop(args: argparse.Namespace) -> int:
        answer = client(args).stop_shard(args.node, args.replica)
        if args.json:
            _print_json(answer)
        else:
            print(f"asked {args.node} to stop {args.replica}")
        return 0

    def weights(args: argparse.Namespace) -> int:
        admin = client(args)
        if args.collect:
            result = admin.collect(args.node)
            if args.json:
                _print_json(result)
            else:
                print(collect_text(result))
            return 0
        rows = admin.weights(args.node)
        if args.json:
            _print_json(rows)
        else:
            print(weights_table(rows))
        return 0

    p = ctl_cmds.add_parser("nodes", help="every node, its state and hardware")
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=nodes)
    p = ctl_cmds.add_parser("status", help="the control plane and a count of nodes")
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=status)

    p = ctl_cmds.add_parser(
        "replicas", help="every shard the nodes run: state, port, pid, compute, download progress"
    )
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=replicas)
    p = ctl_cmds.add_parser("logs", help="a node's agent log, or one of its engines'")
    p.add_argument("node")
    p.add_argument("--source", default="agent", help="'agent' (default) or a replica id")
    p.add_argument("-n", dest="lines", type=int, default=100, help="lines (default 100)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    client_options(p)
    p.set_defaults(handler=logs)
    p = ctl_cmds.add_parser(
        "weights",
        help="what weights each node holds, and which no shard uses; --collect removes those",
    )
    p.add_argument("node", nargs="?")
    p.add_argument(
        "--collect", action="store_true", help="ask the nodes to delete weights no shard uses"
    )
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=weights)
    shard = ctl_cmds.add_parser("shard", help="start or stop one shard on a node directly")
    shard_cmds = shard.add_subparsers(dest="shard_command", metavar="ACTION")
    p = shard_cmds.add_parser("start", help="start a shard on NODE")
    p.add_argument("node")
    p.add_argument("replica", help="the replica id")
    p.add_argument(
        "--source",
        required=True,
        help="weights: hf:ORG/REPO[:QUANT|:FILE], https://..., or a path on the node",
    )
    p.add_argument("--engine", default="llama.cpp")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", help="the name the engine serves it as")
    p.add_argument("--cpu-cores", type=int)
    p.add_argument("--card", action="append", help="a card's UUID (repeat)")
    p.add_argument("--arg", action="append", help="an engine argument (repeat)")
    p.add_argument("--allow-pickle", action="store_true")
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=shard_start)
    p = shard_cmds.add_parser("stop", help="stop a shard on NODE")
    p.add_argument("node")
    p.add_argument("replica")
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=shard_stop)
