"""``llmgw ctl upgrade VERSION``: move the cluster to another llmgw release, and follow
the run to its end; ``llmgw ctl upgrade status``: the run as it stands.

The control plane checks everything before it changes anything (``/api/v1/upgrade``),
then upgrades itself first: while it starts again, the connection is refused or reset
for a moment, and this command asks again for up to a minute."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import replace

from llmgw.client import Client, Subcommands
from llmgw.client.adminbase import AdminError
from llmgw.client.ctl_engines import json_and_client_options
from llmgw.client.tables import DASH, render
from llmgw.wire.admin import UpgradeJson

POLL = 1.0
# How long the control plane may be away while it starts again on the new version.
AWAY = 60.0
# Starting fetches and checks this control plane's zipapp (a fetch may take 10 minutes).
START_TIMEOUT = 660.0


def shown(run: UpgradeJson) -> str:
    head = f"Upgrade to {run['version']} from {run['source']} (by {run['by']}): {run['state']}"
    rows = [[s["kind"], s["target"], s["state"], s["detail"] or DASH] for s in run["steps"]]
    out = [head, render(["KIND", "NAME", "STATE", "DETAIL"], rows)]
    if run["error"]:
        out.append(f"Stopped: {run['error']}")
    return "\n\n".join(out)


def follow(
    status: Callable[[], UpgradeJson],
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
    away: float = AWAY,
) -> UpgradeJson:
    """Ask for the run until it ends, saying each step as it changes; the control plane
    out of reach (starting again) is asked again for up to ``away`` seconds."""
    said: dict[str, tuple[str, str]] = {}
    lost: float | None = None
    while True:
        try:
            run = status()
        except AdminError as exc:
            if exc.status is not None:
                raise
            now = clock()
            if lost is None:
                lost = now
                say("the control plane is starting again; waiting for it")
            elif now - lost > away:
                raise AdminError(f"{exc} (for {away:g} s, while it started again)") from exc
            pause(POLL)
            continue
        lost = None
        for step in run["steps"]:
            key = f"{step['kind']} {step['target']}"
            now_said = (step["state"], step["detail"])
            if step["state"] != "pending" and said.get(key) != now_said:
                say(f"{key}: {step['state']}: {step['detail']}")
                said[key] = now_said
        if run["state"] != "running":
            return run
        pause(POLL)


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def ended(args: argparse.Namespace, run: UpgradeJson) -> int:
        if args.json:
            print(json.dumps(run, indent=2))
        if run["state"] == "failed":
            raise SystemExit(f"the upgrade to {run['version']} stopped: {run['error']}")
        if run["state"] == "done" and not args.json:
            print(f"every process is on {run['version']}")
        return 0

    def upgrade(args: argparse.Namespace) -> int:
        api = client(args)
        if args.version == "status":
            run = api.upgrade_status()
            print(json.dumps(run, indent=2) if args.json else shown(run))
            return 0
        body: dict[str, object] = {"version": args.version, "downgrade": args.downgrade}
        if args.source:
            body["source"] = args.source
        if args.node_timeout is not None:
            body["node_timeout"] = args.node_timeout
        run = replace(api, timeout=START_TIMEOUT).upgrade(body)
        if args.no_wait:
            print(json.dumps(run, indent=2) if args.json else shown(run))
            return 0
        if not args.json:
            print(f"upgrading to {run['version']} from {run['source']}")
        say: Callable[[str], None] = (lambda line: None) if args.json else print
        return ended(args, follow(api.upgrade_status, say))

    p = ctl_cmds.add_parser(
        "upgrade",
        help="move the cluster to another llmgw release (`ctl upgrade status`: the run)",
        description="Upgrade this control plane, then the standbys, then node by node, "
        "to a signed llmgw release; nodes already on it are skipped, so the same version "
        "again resumes a run that stopped. `llmgw ctl upgrade status` shows the run.",
    )
    p.add_argument("version", metavar="VERSION", help="the version (or `status`)")
    p.add_argument(
        "--source",
        metavar="URL",
        help="the release source (default: server.yaml's, or the control plane's mirror)",
    )
    p.add_argument(
        "--downgrade", action="store_true", help="allow a version older than the cluster's"
    )
    p.add_argument(
        "--node-timeout",
        type=float,
        metavar="S",
        help="seconds each node and control plane may take to come back (300)",
    )
    p.add_argument("--no-wait", action="store_true", help="start it and return")
    json_and_client_options(p, client_options, action=False)
    p.set_defaults(handler=upgrade)
