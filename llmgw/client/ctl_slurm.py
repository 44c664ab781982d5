"""``llmgw ctl slurm [status|setup|lend|reclaim|off|policy|conf]``: Slurm beside llmgw,
nodes moved between serving models and running Slurm's jobs with one command."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from llmgw.cliargs import parse_duration
from llmgw.client import Client, Subcommands
from llmgw.client.ctl_engines import json_and_client_options
from llmgw.client.tables import DASH, render
from llmgw.wire.admin import SlurmJson, SlurmNodeJson

# How often `reclaim --wait` asks again.
POLL = 1.0


def _jobs(node: SlurmNodeJson) -> str:
    jobs = node["jobs"]
    if jobs is None:
        return DASH
    return ",".join(j["id"] for j in jobs) or "0"


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "off"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def shown(doc: SlurmJson) -> str:
    """The table of `ctl slurm status`, then the warnings and what the policy would do."""
    if not doc["enabled"]:
        return "Slurm is off. Turn it on: `llmgw ctl slurm setup [--controller NODE]`."
    head = (
        f"slurmctld on {doc['controller']} ({doc['conf_server'] or 'address not known yet'}), "
        f"partition {doc['partition']}"
    )
    rows = []
    for n in doc["nodes"]:
        state = n["state"] or DASH
        if n["admin_drain"]:
            state += " (an administrator's drain)"
        rows.append(
            [
                n["node"],
                n["part"],
                n["stage"],
                state,
                n["reason"] or DASH,
                _jobs(n),
                n["version"] or DASH,
                n["waiting_for"] or DASH,
            ]
        )
    heads = ["NODE", "PART", "STAGE", "SLURM STATE", "REASON", "JOBS", "VERSION", "WAITING FOR"]
    out = [head, render(heads, rows)]
    policy = doc["policy"]
    if policy["lend_idle_after"] is not None or policy["reclaim_when_queued"] is not None:
        out.append(
            f"Policy: lend after {_minutes(policy['lend_idle_after'])} idle, keep "
            f"{policy['keep_free_gpus']} card(s) free, reclaim when requests wait "
            f"{_minutes(policy['reclaim_when_queued'])}"
        )
    if doc["next"]:
        out.append("Lending by policy, next:\n" + "\n".join(f"  {n}" for n in doc["next"]))
    if doc["warnings"]:
        out.append("Warnings:\n" + "\n".join(doc["warnings"]))
    return "\n\n".join(out)


def wait_back(
    status: Callable[[], SlurmJson],
    nodes: list[str],
    timeout: float,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait until none of ``nodes`` is reclaiming, saying what each waits for when it
    changes; False when ``timeout`` passes first."""
    end = clock() + timeout
    said: dict[str, str] = {}
    while True:
        doc = status()
        stages = {n["node"]: n for n in doc["nodes"]}
        waiting = [n for n in nodes if n in stages and stages[n]["stage"] == "reclaiming"]
        for node_id in waiting:
            words = stages[node_id]["waiting_for"] or "the next pass"
            if said.get(node_id) != words:
                say(f"{node_id}: waiting for {words}")
                said[node_id] = words
        if not waiting:
            return True
        if clock() >= end:
            return False
        pause(POLL)


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def answered(args: argparse.Namespace, doc: SlurmJson) -> int:
        print(json.dumps(doc, indent=2) if args.json else shown(doc))
        return 0

    def status(args: argparse.Namespace) -> int:
        return answered(args, client(args).slurm())

    def setup(args: argparse.Namespace) -> int:
        body: dict[str, object] = {}
        for name in ("controller", "partition", "ctld_port", "slurmd_port", "root"):
            if getattr(args, name) is not None:
                body[name] = getattr(args, name)
        if args.nodes is not None:
            body["nodes"] = [n.strip() for n in args.nodes.split(",") if n.strip()]
        return answered(args, client(args).slurm_setup(body))

    def lend(args: argparse.Namespace) -> int:
        return answered(args, client(args).slurm_lend(list(args.nodes)))

    def reclaim(args: argparse.Namespace) -> int:
        api = client(args)
        doc = api.slurm_reclaim(list(args.nodes))
        if not args.wait:
            return answered(args, doc)
        say: Callable[[str], None] = (lambda line: None) if args.json else print
        back = wait_back(api.slurm, list(args.nodes), args.timeout, say)
        doc = api.slurm()
        if args.json:
            print(json.dumps(doc, indent=2))
        elif back:
            print(f"back in llmgw: {', '.join(args.nodes)}")
        if not back:
            raise SystemExit(
                f"still reclaiming after {args.timeout:g} s; `llmgw ctl slurm status` "
                "says what each node waits for"
            )
        return 0

    def off(args: argparse.Namespace) -> int:
        return answered(args, client(args).slurm_off(args.now))

    def policy(args: argparse.Namespace) -> int:
        body: dict[str, object] = {"off": args.off}
        if args.lend_idle_after is not None:
            body["lend_idle_after"] = args.lend_idle_after
        if args.keep_free_gpus is not None:
            body["keep_free_gpus"] = args.keep_free_gpus
        if args.reclaim_when_queued is not None:
            body["reclaim_when_queued"] = args.reclaim_when_queued
        return answered(args, client(args).slurm_policy(body))

    def conf(args: argparse.Namespace) -> int:
        files = client(args).slurm_conf()
        if args.json:
            print(json.dumps(files, indent=2))
        elif not files["slurm_conf"]:
            print("No files: Slurm is off, or its controller has not been heard from.")
        else:
            for name, text in (
                ("slurm.conf", files["slurm_conf"]),
                ("gres.conf", files["gres_conf"]),
                ("cgroup.conf", files["cgroup_conf"]),
            ):
                print(f"# ---- {name}\n{text.rstrip()}\n")
        return 0

    def options(p: argparse.ArgumentParser, action: bool = True) -> None:
        json_and_client_options(p, client_options, action)

    top = ctl_cmds.add_parser(
        "slurm", help="Slurm beside llmgw: lend nodes to Slurm and take them back"
    )
    options(top, action=False)
    top.set_defaults(handler=status)
    sub = top.add_subparsers(dest="slurm_command", metavar="ACTION")
    p = sub.add_parser("status", help="each node's part, stage, Slurm state, jobs, version")
    options(p)
    p.set_defaults(handler=status)
    p = sub.add_parser("setup", help="turn Slurm on (again: change what is named)")
    p.add_argument("--controller", metavar="NODE", help="the node that runs slurmctld")
    p.add_argument("--partition", metavar="NAME", help="the lent nodes' partition (llmgw)")
    p.add_argument("--nodes", metavar="N1,N2...", help="the nodes Slurm may be lent (all)")
    p.add_argument("--ctld-port", type=int, metavar="P", help="slurmctld's port (6817)")
    p.add_argument("--slurmd-port", type=int, metavar="P", help="slurmd's port (6818)")
    p.add_argument("--root", metavar="DIR", help="Slurm's state, spool and logs under DIR")
    options(p)
    p.set_defaults(handler=setup)
    p = sub.add_parser("lend", help="lend nodes to Slurm (their replicas moved away first)")
    p.add_argument("nodes", nargs="+", metavar="NODE")
    options(p)
    p.set_defaults(handler=lend)
    p = sub.add_parser("reclaim", help="take nodes back (once their last job step ends)")
    p.add_argument("nodes", nargs="+", metavar="NODE")
    p.add_argument("--wait", action="store_true", help="wait until each is back in llmgw")
    p.add_argument(
        "--timeout", type=float, default=3600, metavar="S", help="seconds to wait (3600)"
    )
    options(p)
    p.set_defaults(handler=reclaim)
    p = sub.add_parser("off", help="reclaim every lent node, then turn Slurm off")
    p.add_argument(
        "--now", action="store_true", help="at once, whatever Slurm runs on the lent nodes"
    )
    options(p)
    p.set_defaults(handler=off)
    p = sub.add_parser("policy", help="lend idle nodes and take them back by policy")
    p.add_argument(
        "--lend-idle-after",
        type=parse_duration,
        metavar="30m",
        help="lend a node whose cards served nothing this long",
    )
    p.add_argument(
        "--keep-free-gpus", type=int, metavar="N", help="cards kept out of Slurm for llmgw"
    )
    p.add_argument(
        "--reclaim-when-queued",
        type=parse_duration,
        metavar="60s",
        help="take a lent node back when a model's requests wait this long",
    )
    p.add_argument("--off", action="store_true", help="turn lending by policy off")
    options(p)
    p.set_defaults(handler=policy)
    p = sub.add_parser("conf", help="print the slurm.conf, gres.conf and cgroup.conf written")
    options(p)
    p.set_defaults(handler=conf)
