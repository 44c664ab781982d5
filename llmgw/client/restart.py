"""``llmgw restart``: every llmgw process of the cluster started again in place, engines
serving throughout (the control plane's ``server/restart.py`` does the work).

The command asks (``POST /api/v1/restart``), follows the run (``GET /api/v1/restart``)
as each agent and each other control plane comes back, then waits for the control plane
it asked to answer ``/api/v1/status`` with a later start, and says what restarted.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from llmgw.cliargs import UsageError
from llmgw.client import Client, Subcommands
from llmgw.client.admin import AdminClient
from llmgw.client.adminbase import AdminError
from llmgw.wire.admin import RestartAgentJson, RestartJson, RestartPlaneJson

POLL = 0.3


def _engines(row: RestartAgentJson) -> str:
    pids = [str(p) for p in row["engines"].values() if p is not None]
    if not pids:
        return "no engines"
    if row["engines_kept"]:
        return f"engines kept serving (pids {', '.join(pids)} unchanged)"
    return f"engines NOT kept (pids before: {', '.join(pids)})"


def agent_line(row: RestartAgentJson) -> str:
    if row["state"] == "back":
        return f"agent {row['node']}: back on {row['version']}, {_engines(row)}"
    return f"agent {row['node']}: {row['state']}" + (f" ({row['reason']})" if row["reason"] else "")


def plane_line(row: RestartPlaneJson, this: str) -> str:
    role = f"{row['role'] or 'role unknown'}{', this one' if row['name'] == this else ''}"
    line = f"control plane {row['name']} ({role}): {row['state']}"
    return line + (f" ({row['reason']})" if row["reason"] else "")


def plan_text(doc: RestartJson) -> str:
    asked = [r["node"] for r in doc["agents"] if r["state"] != "skipped"]
    skipped = [f"{r['node']} ({r['reason']})" for r in doc["agents"] if r["state"] == "skipped"]
    planes = [r["name"] for r in doc["control_planes"]]
    lines = [f"restarting {len(asked)} agent(s): {', '.join(asked) or 'none'}"]
    if skipped:
        lines.append(f"skipped: {'; '.join(skipped)}")
    lines.append(f"then control planes: {', '.join(planes)} ({doc['this']} last)")
    return "\n".join(lines)


class Follow:
    """The run as the control plane says it, each step printed once as it ends."""

    def __init__(self, api: AdminClient, plan: RestartJson, quiet: bool) -> None:
        self.api = api
        self.last = plan
        self.quiet = quiet
        self.said: set[str] = set()

    def say(self, doc: RestartJson) -> None:
        if self.quiet:
            return
        for a in doc["agents"]:
            if a["state"] in ("back", "failed") and f"a:{a['node']}" not in self.said:
                self.said.add(f"a:{a['node']}")
                print(agent_line(a), flush=True)
        for p in doc["control_planes"][:-1]:
            if p["state"] in ("back", "failed") and f"p:{p['name']}" not in self.said:
                self.said.add(f"p:{p['name']}")
                print(plane_line(p, doc["this"]), flush=True)

    def run(self, deadline: float) -> None:
        """Until the run reaches this control plane, fails, or this one is gone."""
        while time.monotonic() < deadline:
            try:
                doc = self.api.restart_status()
            except AdminError as exc:
                if exc.status is None:
                    return  # not answering: this one is starting again
                if exc.status < 500:
                    raise
                time.sleep(POLL)  # a passing failure of the control plane: ask again
                continue
            if doc["asked_at"] != self.last["asked_at"]:
                return  # a new process, which knows no run: this one started again
            self.last = doc
            self.say(doc)
            if doc["stage"] == "failed":
                raise UsageError(f"the restart stopped: {doc['error']}")
            if doc["stage"] in ("this", "done"):
                return
            time.sleep(POLL)
        raise UsageError(f"the restart did not reach this control plane in time: {self.last}")


def wait_started_after(api: AdminClient, asked_at: float, deadline: float) -> float:
    """When the control plane started again (epoch seconds, by its uptime), once it
    answers with a start after ``asked_at``."""
    while time.monotonic() < deadline:
        try:
            status = api.status()
        except AdminError as exc:
            if exc.status is not None and exc.status < 500:
                raise
        else:
            started = time.time() - float(status["uptime_seconds"])
            if started > asked_at:
                return started
        time.sleep(POLL)
    raise UsageError(f"{api.base_url} did not answer again with a later start in time")


def restart(args: argparse.Namespace, client: Client) -> int:
    api = client(args)
    deadline = time.monotonic() + args.timeout
    plan = api.restart()
    if not args.json:
        print(plan_text(plan), flush=True)
    follow = Follow(api, plan, quiet=args.json)
    follow.run(deadline)
    asked_at = plan["asked_at"] or 0.0
    started = wait_started_after(api, asked_at, deadline)
    done = follow.last
    this = done["control_planes"][-1]
    this["state"], this["started"] = "back", round(started, 3)
    done["stage"] = "done"
    if args.json:
        print(json.dumps(done, indent=2))
        return 0
    follow.say(done)
    print(plane_line(this, done["this"]))
    back = sum(1 for a in done["agents"] if a["state"] == "back")
    kept = all(a["engines_kept"] is not False for a in done["agents"])
    print(
        f"restarted {back} agent(s) and {len(done['control_planes'])} control plane(s); "
        + ("every engine kept serving" if kept else "some engines did not keep serving")
    )
    return 0


def add_parsers(
    roles: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    p = roles.add_parser(
        "restart",
        help="start every agent, then the other control planes, then this one again "
        "(engines keep serving)",
    )
    p.add_argument("--json", action="store_true", help="print the run as the API says it")
    p.add_argument(
        "--timeout", type=float, default=600, help="seconds to wait for it all (default 600)"
    )
    client_options(p)
    p.set_defaults(handler=lambda args: restart(args, client))
