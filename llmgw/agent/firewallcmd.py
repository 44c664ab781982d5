"""``llmgw firewall status|sync``: this node's llmgw table (``inet llmgw``) by hand.

The agent keeps the table as the control plane says; these read it, and load the last
plan the control plane sent (``STATE_DIR/firewall.json``) without the cluster: after a
reboot before the agent starts, or after someone flushed the ruleset.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw.cliargs import UsageError

if TYPE_CHECKING:
    from llmgw.agent.firewall import FirewallStatus


def state_dir(args: argparse.Namespace) -> Path:
    """--state-dir, else the ``state_dir`` of the usual agent.yaml, else the usual dir:
    where ``llmgw agent run`` would keep its state."""
    from llmgw.config import AgentConfig, default_state_dir, load

    if args.state_dir:
        return Path(args.state_dir)
    default = default_state_dir()
    config_path = default / "agent.yaml"
    if config_path.exists():
        config = load(AgentConfig, config_path)
        if config.state_dir:
            return Path(config.state_dir)
    return default


def _why_not() -> str | None:
    """Why this machine keeps no table, None when it can."""
    import os
    import shutil

    from llmgw.agent.firewall import ROOT_NOTE

    if shutil.which("nft") is None:
        return "nft is not installed (Debian: apt install nftables); no table can be kept"
    if os.geteuid() != 0:
        return f"not root: {ROOT_NOTE}; run this as root"
    return None


def status_text(status: FirewallStatus, plan_path: Path) -> str:
    """For a person: is the table there, does it match the plan, and what it holds."""
    if status["in_sync"] is None and status["problem"]:  # nft missing, or not root
        return f"llmgw's table cannot be read: {status['problem']}"
    head = "llmgw's table (inet llmgw) is loaded" if status["present"] else "No llmgw table"
    if status["plan"] is None:
        match = f"no plan from the control plane is saved ({plan_path})"
    elif not status["plan"]["enabled"]:
        match = "the control plane's plan says the firewall is off"
    else:
        match = "the control plane's plan asks for it"
    if status["in_sync"] is True:
        match += "; it matches"
    lines = [f"{head}; {match}."]
    if status["problem"]:
        lines.append(f"Problem: {status['problem']}")
        if status["plan"] is not None:
            lines.append("Fix: `llmgw firewall sync` loads the saved plan again")
    lines += ["", *status["rules"]] if status["rules"] else []
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    from llmgw.agent.firewall import STATE_FILE, FirewallError, Nft, load_plan

    where = state_dir(args)
    try:
        plan = load_plan(where)
    except FirewallError as exc:
        raise UsageError(str(exc)) from None
    status = Nft().status(plan)
    status["plan"] = plan.to_map() if plan else None
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        print(status_text(status, where / STATE_FILE))
    return 1 if status["problem"] else 0


def cmd_sync(args: argparse.Namespace) -> int:
    from llmgw.agent.firewall import STATE_FILE, FirewallError, Nft, load_plan

    if why := _why_not():
        raise UsageError(why)
    where = state_dir(args)
    try:
        plan = load_plan(where)
        if plan is None:
            raise UsageError(
                f"no plan saved in {where / STATE_FILE}: the control plane has sent none "
                "to this node; nothing was changed"
            )
        nft = Nft()
        if plan.enabled:
            nft.apply(plan)
            print("llmgw's table (inet llmgw) loaded as the control plane's plan says")
        elif nft.remove():
            print("the plan says the firewall is off: llmgw's table removed")
        else:
            print("the plan says the firewall is off; there was no llmgw table")
    except FirewallError as exc:
        raise UsageError(str(exc)) from None
    return 0


def add_parsers(roles: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``firewall status`` and ``firewall sync``, under the top-level subparsers."""
    firewall = roles.add_parser("firewall", help="this node's llmgw nftables table")
    sub = firewall.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    p = sub.add_parser("status", help="is the table loaded, and is it the control plane's plan")
    p.add_argument("--state-dir", help="agent state dir (default: the usual one)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(handler=cmd_status)
    p = sub.add_parser("sync", help="load the plan the control plane last sent (needs root)")
    p.add_argument("--state-dir", help="agent state dir (default: the usual one)")
    p.set_defaults(handler=cmd_sync)
