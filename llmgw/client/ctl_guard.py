"""``llmgw ctl guard``: guard policies (``policy add|list|show|remove``), what they
decided lately (``decisions``) and whether their judges keep up (``judge check``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from llmgw.client import Client, Subcommands
from llmgw.client.ctl_engines import json_and_client_options
from llmgw.client.tables import render, when
from llmgw.wire.admin import GuardCheckJson, GuardPolicyJson


def policies_table(found: list[GuardPolicyJson]) -> str:
    if not found:
        return "No guard policies yet (`llmgw ctl guard policy add NAME`)."
    rows = [
        [
            p["name"],
            p["judge"] or "-",
            p["injection"],
            p["pii"],
            f"{p['wait_ms']} ms",
            p["fail"],
        ]
        for p in found
    ]
    table = render(["POLICY", "JUDGE", "INJECTION", "PII", "WAIT", "FAIL"], rows)
    notes = [f"{p['name']}: {w}" for p in found for w in p["warnings"]]
    return "\n".join([table, *notes])


def checks_text(found: list[GuardCheckJson]) -> str:
    if not found:
        return "No policy names a judge."
    lines = []
    for c in found:
        single = ", ".join(f"{t:g}" for t in c["single_ms"])
        rate = c["per_second"]
        lines.append(
            f"{c['policy']} ({c['judge']}, wait {c['wait_ms']} ms): {c['state'].upper()}\n"
            f"  one at a time: {single} ms; {c['burst']} at once: p50 {c['burst_p50_ms']:g} ms"
            + (f", about {rate:g} judgments a second" if rate is not None else "")
            + f"\n  {c['advice']}"
        )
    return "\n".join(lines)


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def out(args: argparse.Namespace, value: object, text: str) -> int:
        print(json.dumps(value, indent=2) if args.json else text)
        return 0

    def add(args: argparse.Namespace) -> int:
        body: dict[str, object] = {
            "name": args.name,
            "injection": args.injection,
            "pii": args.pii,
            "wait_ms": args.wait,
            "fail": args.fail,
        }
        if args.judge:
            body["judge"] = args.judge
        policy = client(args).add_guard_policy(body)
        return out(args, policy, policies_table([policy]))

    def listing(args: argparse.Namespace) -> int:
        found = client(args).guard_policies()
        return out(args, found, policies_table(found))

    def show(args: argparse.Namespace) -> int:
        policy = client(args).guard_policy(args.name)
        return out(args, policy, policies_table([policy]))

    def remove(args: argparse.Namespace) -> int:
        policy = client(args).remove_guard_policy(args.name)
        return out(args, policy, f"guard policy {policy['name']} removed")

    def decisions(args: argparse.Namespace) -> int:
        found = client(args).guard_decisions(args.policy)
        rows = [
            [when(d["at"]), d["policy"], d["verdict"], d["key"], d["where"], d["found"] or "-"]
            for d in found
        ]
        text = (
            render(["WHEN (UTC)", "POLICY", "VERDICT", "KEY", "WHERE", "FOUND"], rows)
            if rows
            else "No decisions on this control plane yet."
        )
        return out(args, found, text)

    def check(args: argparse.Namespace) -> int:
        found = client(args).guard_judge_check(args.policy)
        out(args, found, checks_text(found))
        return 1 if any(c["state"] in ("slow", "unavailable") for c in found) else 0

    def options(p: argparse.ArgumentParser, action: bool = True) -> None:
        json_and_client_options(p, client_options, action)

    guard = ctl_cmds.add_parser(
        "guard", help="guard policies: personal data and planted instructions in prompts"
    )
    options(guard, action=False)
    sub = guard.add_subparsers(dest="guard_command", metavar="ACTION", required=True)
    policy = sub.add_parser("policy", help="add, list, show or remove guard policies")
    options(policy)
    psub = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    p = psub.add_parser("add", help="add a policy (or replace one of its name)")
    p.add_argument("name", help="the policy's name (attach it to keys with --guard NAME)")
    p.add_argument("--judge", metavar="MODEL", help="a catalog model asked of each text")
    p.add_argument("--injection", choices=["block", "flag"], default="block")
    p.add_argument("--pii", choices=["redact", "block", "flag"], default="redact")
    p.add_argument(
        "--wait", type=int, default=2000, metavar="MS", help="how long a judgment may take"
    )
    p.add_argument(
        "--fail",
        choices=["closed", "open"],
        default="closed",
        help="a judgment past its wait: closed refuses, open lets through flagged",
    )
    options(p)
    p.set_defaults(handler=add)
    p = psub.add_parser("list", help="every policy")
    options(p)
    p.set_defaults(handler=listing)
    for verb, handler, text in (("show", show, "one policy"), ("remove", remove, "remove one")):
        p = psub.add_parser(verb, help=text)
        p.add_argument("name")
        options(p)
        p.set_defaults(handler=handler)
    p = sub.add_parser("decisions", help="this control plane's last decisions, newest first")
    p.add_argument("--policy", help="only this policy's")
    options(p)
    p.set_defaults(handler=decisions)
    judge = sub.add_parser("judge", help="the policies' judges")
    options(judge)
    jsub = judge.add_subparsers(dest="judge_command", metavar="ACTION", required=True)
    p = jsub.add_parser("check", help="time each judge against its policy's wait")
    p.add_argument("policy", nargs="?", help="only this policy's judge")
    options(p)
    p.set_defaults(handler=check)
