"""``llmgw server token|join|promote|remove`` and ``llmgw ctl servers``: the cluster's
control planes."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable

from llmgw.client import Client, Subcommands, parse_duration
from llmgw.client.tables import render
from llmgw.client.zipappsource import release_options
from llmgw.wire.admin import ServerJson

Handler = Callable[[argparse.Namespace], int]
DASH = "-"


def _ago(ts: object, now: float) -> str:
    if not isinstance(ts, int | float):
        return DASH
    return f"{max(0.0, now - ts):.0f}s ago"


def servers_table(servers: list[ServerJson], now: float | None = None) -> str:
    if not servers:
        return "No control planes recorded yet (the leader writes its own when it starts)."
    now = now if now is not None else dt.datetime.now(dt.UTC).timestamp()
    rows = []
    for s in servers:
        role = s["role"] or ("not answering" if s["removed_at"] is None else "removed")
        lag = s.get("lag_seconds")
        rows.append(
            [
                s["name"] + (" *" if s.get("this") else ""),
                role,
                str(s["term"]) if s.get("term") is not None else DASH,
                s["api_address"],
                s["agent_address"],
                s["peer_address"],
                _ago(s.get("last_contact"), now),
                f"{lag:.1f}s" if isinstance(lag, int | float) else DASH,
                s.get("problem") or "",
            ]
        )
    head = ["NAME", "ROLE", "TERM", "API", "AGENTS", "PEERS", "CONTACT", "LAG", "PROBLEM"]
    return render(head, rows) + "\n(* the control plane that answered)"


def add_parsers(
    server_cmds: Subcommands,
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
    local: Handler,
) -> None:
    """``local`` runs ``server join`` and ``server promote`` on this machine's data dir."""

    def token(args: argparse.Namespace) -> int:
        answer = client(args).server_token(args.ttl)
        print(json.dumps(answer, indent=2) if args.json else answer["token"])
        return 0

    def remove(args: argparse.Namespace) -> int:
        done = client(args).remove_server(args.name)
        if args.json:
            print(json.dumps(done, indent=2))
        elif done["removed"]:
            print(f"control plane {done['name']} removed: its certificate is refused from now on")
        else:
            print(f"control plane {done['name']} was already removed")
        return 0

    def listing(args: argparse.Namespace) -> int:
        servers = client(args).servers()
        print(json.dumps(servers, indent=2) if args.json else servers_table(servers))
        return 0

    p = server_cmds.add_parser("token", help="print a token for a new control plane")
    p.add_argument("--ttl", type=parse_duration, default=3600, help="how long it is valid (1h)")
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=token)

    def add(args: argparse.Namespace) -> int:
        from llmgw.client.serveradd import add_server

        return add_server(args, client(args))

    p = server_cmds.add_parser("add", help="make HOST a standby control plane over ssh")
    p.add_argument("host", help="the machine, as ssh reaches it")
    p.add_argument("--user", help="ssh user (default: yours)")
    p.add_argument("--ssh-port", type=int, default=22)
    p.add_argument("--ssh-key", help="ssh identity file")
    p.add_argument(
        "--ssh-option", action="append", metavar="OPTION", help="extra ssh -o OPTION (repeat)"
    )
    p.add_argument("--name", help="its control plane name (default: its hostname)")
    p.add_argument("--prefix", default="/opt/llmgw", help="where to install there (/opt/llmgw)")
    release_options(p)
    p.add_argument("--leader", help="HOST:PORT it reaches the leader at (default: --server's)")
    p.add_argument("--listen", default="0.0.0.0:8080", help="its HTTP listener (0.0.0.0:8080)")
    p.add_argument("--agent-port", type=int, default=8443, help="its agents' port (8443)")
    p.add_argument("--peer-port", type=int, default=8444, help="its control planes' link (8444)")
    p.add_argument("--advertise", action="append", metavar="ADDRESS", help="(default: HOST)")
    p.add_argument("--vip", metavar="ADDR/PREFIX", help="an address keepalived keeps on the leader")
    p.add_argument("--interface", metavar="IF", help="with --vip: the interface it goes on")
    p.add_argument("--vrid", type=int, help="with --vip: the VRRP router id (default: from it)")
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for it to answer")
    client_options(p)
    p.set_defaults(handler=add)

    p = server_cmds.add_parser("join", help="make this machine a standby control plane")
    p.add_argument("--server", required=True, help="the leader's HTTP address, HOST:PORT")
    p.add_argument("--token", required=True, help="from `llmgw server token` on the leader")
    p.add_argument("--data-dir", help="where to keep state (or LLMGW_DATA_DIR)")
    p.add_argument("--name", help="this control plane's name (default: the hostname)")
    p.add_argument("--listen", help="HTTP listener of /v1 and /api/v1 (default 0.0.0.0:8080)")
    p.add_argument("--agent-port", type=int, help="the agents' port (default 8443)")
    p.add_argument("--peer-port", type=int, help="the control planes' link (default 8444)")
    p.add_argument("--advertise", action="append", metavar="ADDRESS", help="(repeat)")
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.set_defaults(handler=local, local="join")

    p = server_cmds.add_parser("promote", help="make this standby the leader (a new term)")
    p.add_argument("--data-dir", help="the standby's data dir (or LLMGW_DATA_DIR)")
    p.add_argument(
        "--force", action="store_true", help="even while the old leader still answers as leader"
    )
    p.set_defaults(handler=local, local="promote")

    p = server_cmds.add_parser("remove", help="remove a control plane from the cluster")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=remove)

    p = ctl_cmds.add_parser("servers", help="every control plane: role, term, lag")
    p.add_argument("--json", action="store_true")
    client_options(p)
    p.set_defaults(handler=listing)
