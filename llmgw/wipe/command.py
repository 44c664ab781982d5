"""``llmgw wipe``'s command line: list what goes, have the machine's name typed (or
named in ``--yes-i-mean-HOSTNAME``), remove it, say what was removed and what failed."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from llmgw.wipe.finding import Choice, Item, find, kept, places
from llmgw.wipe.machine import HostMachine, Machine, ScratchMachine
from llmgw.wipe.removal import Outcome, remove

CONFIRM_FLAG = "--yes-i-mean-"
HEADINGS = {
    "unit": "systemd units (stopped and disabled)",
    "process": "processes llmgw started (TERM, then KILL after 10 s)",
    "firewall": "firewall",
    "file": "files",
    "directory": "directories (with all in them; links inside are removed, not followed)",
}

DESCRIPTION = """\
Take llmgw off this machine. First it lists exactly what goes: llmgw's systemd units
(and the Slurm/munge units its agent runs through a drop-in), the processes llmgw
started (engines, Slurm daemons, agents, control planes), its nftables table (inet
llmgw), /etc/llmgw, the agents' state dirs, the install prefix /opt/llmgw and
keepalived's configuration where server add wrote it. Then it asks for this machine's
name, and removes that and nothing else.

Model weights go only with --models. The control plane's data dir (its SQLite store,
cluster key and CA; /var/lib/llmgw, /opt/llmgw/data) goes only with --store: without
it the data dir stays whole. A PostgreSQL or Patroni store elsewhere is never touched.
llmgw never puts its CA in the system's trust store, so nothing is taken from there.
"""


def confirm_spelling(argv: Sequence[str]) -> list[str]:
    """``wipe --yes-i-mean-node7`` as argparse can read it (``--yes-i-mean=node7``)."""
    args = list(argv)
    if not args or args[0] != "wipe":
        return args
    return [
        f"--yes-i-mean={a[len(CONFIRM_FLAG) :]}" if a.startswith(CONFIRM_FLAG) else a for a in args
    ]


def add_parsers(roles: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = roles.add_parser(
        "wipe",
        help="take llmgw off this machine (lists what goes, then asks)",
        usage="llmgw wipe [--models] [--store] [--all] [--root DIR] "
        "[--yes-i-mean-HOSTNAME] [--json]",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", action="store_true", help="the model weights go too")
    p.add_argument(
        "--store",
        action="store_true",
        help="the control plane's data dir goes too (its store, cluster key and CA)",
    )
    p.add_argument("--all", action="store_true", help="both: --models --store")
    p.add_argument(
        "--root",
        metavar="DIR",
        help="treat DIR as the filesystem root: only files under it are looked at and "
        "removed, and no systemctl or nft is run (a scratch copy of a machine)",
    )
    p.add_argument(
        "--yes-i-mean",
        metavar="HOSTNAME",
        dest="yes_i_mean",
        help="written --yes-i-mean-HOSTNAME: remove without asking; HOSTNAME must be this "
        "machine's name",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print what would go as JSON and change nothing; with --yes-i-mean-HOSTNAME, "
        "remove it and print each with removed/error",
    )
    p.set_defaults(handler=cmd_wipe)


def cmd_wipe(args: argparse.Namespace) -> int:
    host = socket.gethostname()
    if args.yes_i_mean is not None and args.yes_i_mean != host:
        print(
            f"llmgw wipe: --yes-i-mean-{args.yes_i_mean} names another machine: this one is "
            f"{host} (--yes-i-mean-{host}); nothing was changed",
            file=sys.stderr,
        )
        return 1
    machine: Machine
    if args.root:
        root = Path(args.root)
        if not root.is_dir():
            print(f"llmgw wipe: --root {args.root}: not a directory", file=sys.stderr)
            return 1
        machine = ScratchMachine(root)
    else:
        root = Path("/")
        machine = HostMachine()
    choice = Choice(models=args.models or args.all, store=args.store or args.all)
    where = places(root, on_host=not args.root)
    items = find(where, machine, choice)
    confirmed = args.yes_i_mean is not None
    if args.json and not confirmed:
        print(json.dumps([item.as_json() for item in items], indent=2))
        return 0
    if not items:
        if args.json:
            print("[]")
        else:
            print(f"Nothing of llmgw's was found on {host}{_under(args.root)}.")
        return 0
    if not args.json:
        print(listing(items, host, args.root))
        stays = [k for k in kept(where, choice) if where.real(k.path).exists()]
        if stays:
            print("\nStays (name the flag to take it too):")
            print("\n".join(f"  {k.path}  {k.reason} ({k.flag})" for k in stays))
    if not confirmed and not _asked(host):
        return 1
    outcomes = remove(where, machine, items)
    if args.json:
        print(json.dumps([o.as_json() for o in outcomes], indent=2))
    else:
        print(report(outcomes))
    return 1 if any(o.error is not None for o in outcomes) else 0


def _under(root: str | None) -> str:
    return f" (under {root})" if root else ""


def listing(items: list[Item], host: str, root: str | None) -> str:
    lines = [f"llmgw wipe removes this from {host}{_under(root)}:"]
    for kind, heading in HEADINGS.items():
        group = [i for i in items if i.kind == kind]
        if not group:
            continue
        lines.append(f"\n  {heading}:")
        for item in group:
            name = f"{item.name} (pid {item.pid})" if item.pid is not None else item.name
            lines.append(f"    {name}  {item.reason}")
    return "\n".join(lines)


def _asked(host: str) -> bool:
    print(f"\nType this machine's name ({host}) to remove all of the above: ", end="")
    sys.stdout.flush()
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        print()  # the answer came from a pipe: end the prompt's line
    if not answer:
        print(
            f"llmgw wipe: no answer: nothing was changed ({CONFIRM_FLAG}{host} to skip asking)",
            file=sys.stderr,
        )
        return False
    if answer.strip() != host:
        print(f"llmgw wipe: {answer.strip()!r} is not {host}: nothing was changed", file=sys.stderr)
        return False
    return True


def report(outcomes: list[Outcome]) -> str:
    done = [o for o in outcomes if o.error is None]
    failed = [o for o in outcomes if o.error is not None]
    lines = [f"Removed {len(done)} of {len(outcomes)}:"]
    lines += [f"  {o.item.kind} {o.item.name}" for o in done]
    if failed:
        lines.append(f"Failed ({len(failed)}):")
        lines += [f"  {o.item.kind} {o.item.name}: {o.error}" for o in failed]
    return "\n".join(lines)
