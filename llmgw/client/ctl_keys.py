"""``llmgw ctl keys ...``, ``llmgw ctl admin-token rotate`` and ``llmgw
stop|start|status``: gateway keys, the admin token and the serving switch, thin calls
of the admin API with ``--json``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable
from typing import Literal, TypeVar

from llmgw.client import Client, Subcommands
from llmgw.client.limitsflags import add_limit_flags, limits_body, set_text, tools_cell
from llmgw.client.tables import render, store_line
from llmgw.wire.admin import (
    EnergyJson,
    KeyJson,
    RotatedTokenJson,
    StatusJson,
    UsageJson,
    UsageSumJson,
)

Shown = TypeVar("Shown")
# The usage rows' fields a table may sum by.
UsageBy = Literal["key_name", "model", "replica", "day"]
DASH = "-"
# What the server sums usage by: whose the keys are.
OWNERS = ("org", "team", "project", "person")
PRIORITY_HELP = (
    "when a model's replicas are all busy, waiting requests of higher-priority keys go "
    "first; keys of one priority take turns"
)


def _when(ts: object) -> str:
    if not isinstance(ts, int | float):
        return DASH
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M")


def keys_table(keys: list[KeyJson]) -> str:
    if not keys:
        return "No keys. Make one with `llmgw ctl keys create --name NAME`."
    rows = [
        [
            k["id"],
            k["name"],
            k["state"],
            ",".join(k["models"]) or "all",
            str(k["rpm"]) if k["rpm"] else DASH,
            str(k["tpm"]) if k["tpm"] else DASH,
            str(k["budget"]) if k["budget"] else DASH,
            str(k.get("priority") or 0),
            tools_cell(k["tools"]),
            ",".join(k["guard"]) or DASH,
            _when(k["expires_at"]),
        ]
        for k in keys
    ]
    heads = [
        "ID",
        "NAME",
        "STATE",
        "MODELS",
        "RPM",
        "TPM",
        "BUDGET",
        "PRIORITY",
        "TOOLS",
        "GUARD",
        "EXPIRES",
    ]
    return render(heads, rows)


def usage_table(rows: list[UsageJson], by: str, energy: list[EnergyJson] | None = None) -> str:
    """Usage summed by key, model, replica or day. By model, ``energy`` (from
    ``/api/v1/energy``) adds J/token where the cards' power is read."""
    if not rows:
        return "No usage yet."
    fields: dict[str, UsageBy] = {
        "key": "key_name",
        "model": "model",
        "replica": "replica",
        "day": "day",
    }
    field = fields[by]
    totals: dict[str, list[int]] = {}
    for row in rows:
        name = str(row.get(field) or row.get("key_id") or DASH)
        entry = totals.setdefault(name, [0, 0, 0])
        entry[0] += row["requests"]
        entry[1] += row["prompt_tokens"]
        entry[2] += row["completion_tokens"]
    table = [
        [name, str(n), str(p), str(c), str(p + c)] for name, (n, p, c) in sorted(totals.items())
    ]
    heads = [by.upper(), "REQUESTS", "PROMPT", "COMPLETION", "TOKENS"]
    if by == "model" and energy:  # where some card's power is read
        joules: dict[str, list[float]] = {}
        for e in energy:
            entry_j = joules.setdefault(str(e["model"]), [0.0, 0.0])
            entry_j[0] += float(e["joules"])
            entry_j[1] += float(e["tokens"])
        for line in table:
            j, n = joules.get(line[0], (0.0, 0.0))
            line.append(f"{j / n:.3g}" if j and n else DASH)
        heads.append("J/TOKEN")
    return render(heads, table)


def sums_table(rows: list[UsageSumJson], by: str) -> str:
    """Usage summed by the server per organisation, team, project or person."""
    if not rows:
        return "No usage yet."
    table = [
        [
            str(r["name"] or r["id"] or f"(no {by})"),
            str(r["requests"]),
            str(r["prompt_tokens"]),
            str(r["completion_tokens"]),
            str(r["prompt_tokens"] + r["completion_tokens"]),
        ]
        for r in rows
    ]
    return render([by.upper(), "REQUESTS", "PROMPT", "COMPLETION", "TOKENS"], table)


def rotated_text(answer: RotatedTokenJson) -> str:
    """What ``ctl admin-token rotate`` says beside the new token, shown this once."""
    kept = answer["token_file"]
    where = (
        f"It was written to {kept} on the leader's machine, so ctl there goes on working."
        if kept
        else "The leader's admin.token could not be rewritten (its log says why)."
    )
    return (
        f"{answer['token']}\n\n"
        "The new admin token, shown this once (kept only as a hash). The old one is refused "
        "on every control plane from now on (standbys within 2 s), and every page session "
        f"opened with it has ended. {where} Replace every other copy by hand: the "
        "standbys' admin.token files, LLMGW_TOKEN, scripts and secrets stores."
    )


def add_parsers(
    roles: Subcommands,
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def show(args: argparse.Namespace, value: Shown, text: Callable[[Shown], str]) -> int:
        print(json.dumps(value, indent=2) if args.json else text(value))
        return 0

    def create(args: argparse.Namespace) -> int:
        body: dict[str, object] = {"name": args.name}
        if args.models:
            body["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
        for name in ("rpm", "tpm", "budget", "expires", "priority", "org", "project"):
            if getattr(args, name) is not None:
                body[name] = getattr(args, name)
        if args.personal:
            body["personal"] = True
        made = client(args).create_key(body)
        return show(
            args,
            made,
            lambda k: (
                f"{k['key']}\n\nKey {k['id']} for {k['name']}: shown this once, kept only "
                "as a hash. Use it as the OpenAI API key with base URL http://CONTROL_PLANE/v1."
            ),
        )

    def listing(args: argparse.Namespace) -> int:
        return show(args, client(args).keys(), keys_table)

    def one(args: argparse.Namespace) -> int:
        return show(args, client(args).key(args.id), lambda k: keys_table([k]))

    def update(args: argparse.Namespace) -> int:
        body = {"priority": args.priority}
        changed = client(args).update_key(args.id, body)
        return show(
            args, changed, lambda k: f"key {k['id']} ({k['name']}) has priority {k['priority']}"
        )

    def limits(args: argparse.Namespace) -> int:
        body = limits_body(args)
        set_ = client(args).set_key_limits(args.id, body)
        return show(args, set_, lambda lim: set_text(f"key {args.id}", lim))

    def revoke(args: argparse.Namespace) -> int:
        done = client(args).revoke_key(args.id)
        return show(args, done, lambda k: f"key {k['id']} ({k['name']}) is {k['state']}")

    def rotate(args: argparse.Namespace) -> int:
        return show(args, client(args).rotate_admin_token(), rotated_text)

    def serving(stopped: bool | None) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            api = client(args)
            if stopped is not None:
                api.set_serving(stopped)
            status = api.status()

            def text(s: StatusJson) -> str:
                nodes = s["nodes"]
                if s["serving"] == "stopped":
                    line = "stopped: /v1 answers 503 and every model is at zero replicas"
                    line += " (`llmgw start` resumes)"
                else:
                    line = "serving"
                line += f"\nnodes: {nodes['ready']} of {nodes['total']} Ready"
                return line + f"\nstore: {store_line(s)}"

            return show(args, status, text)

        return run

    def usage(args: argparse.Namespace) -> int:
        api = client(args)
        asked = {"days": str(args.days)}
        asked.update({k: v for k in ("since", "until", "org") if (v := getattr(args, k))})
        if args.by in OWNERS:
            sums = api.usage_sums({**asked, "by": args.by})
            return show(args, sums, lambda r: sums_table(r, args.by))
        rows = api.usage(asked)
        energy = api.energy() if args.by == "model" and not args.json else None
        return show(args, rows, lambda r: usage_table(r, args.by, energy))

    def leaf(
        sub: Subcommands, name: str, run: Callable[[argparse.Namespace], int], text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text)
        p.add_argument("--json", action="store_true", help="print the API's JSON")
        client_options(p)
        p.set_defaults(handler=run)
        return p

    keys = ctl_cmds.add_parser(
        "keys", help="gateway API keys: create, list, show, update, limits, revoke"
    )
    sub = keys.add_subparsers(dest="keys_command", metavar="ACTION")
    p = leaf(sub, "create", create, "make a key (shown once)")
    p.add_argument("--name", required=True, help="whose key it is")
    p.add_argument("--models", help="model name patterns it may use, comma-separated")
    p.add_argument("--rpm", type=int, help="requests a minute")
    p.add_argument("--tpm", type=int, help="tokens a minute")
    p.add_argument("--budget", type=int, help="tokens a month")
    p.add_argument("--expires", help="a date (2027-01-31) or date and time")
    p.add_argument("--priority", type=int, help=PRIORITY_HELP + " (default 0)")
    p.add_argument("--org", help="the organisation it belongs to (id or name)")
    whose = p.add_mutually_exclusive_group()
    whose.add_argument(
        "--project",
        help="the project it belongs to (id, name or TEAM/NAME; default: the default project)",
    )
    whose.add_argument(
        "--personal", action="store_true", help="your own key in the organisation, no project's"
    )
    leaf(sub, "list", listing, "every key, without the keys themselves")
    leaf(sub, "show", one, "one key").add_argument("id")
    p = leaf(sub, "update", update, "change a key's priority")
    p.add_argument("id")
    p.add_argument("--priority", type=int, required=True, help=PRIORITY_HELP)
    p = leaf(sub, "limits", limits, "a key's own limits, MCP tools and guard policies")
    p.add_argument("id")
    add_limit_flags(p)
    leaf(sub, "revoke", revoke, "revoke a key (at once)").add_argument("id")

    admin_token = ctl_cmds.add_parser("admin-token", help="the admin token: rotate")
    sub = admin_token.add_subparsers(dest="admin_token_command", metavar="ACTION")
    leaf(
        sub,
        "rotate",
        rotate,
        "a new admin token (shown once); the old one and its page sessions end everywhere",
    )

    p = leaf(ctl_cmds, "usage", usage, "requests and tokens by key, model or replica")
    p.add_argument("--days", type=int, default=30, help="this many days back (default 30)")
    p.add_argument("--since", help="the first day (2026-12-01), in place of --days")
    p.add_argument("--until", help="the last day (2026-12-31), included")
    p.add_argument(
        "--by",
        choices=("key", "model", "replica", "day", *OWNERS),
        default="key",
        help="sum by key, model, replica or day; or by the keys' org, team, project or person",
    )
    p.add_argument("--org", help="only this organisation's keys (id or name)")

    leaf(roles, "stop", serving(True), "stop serving: /v1 answers 503, every model to zero")
    leaf(roles, "start", serving(False), "serve again after `llmgw stop`")
    leaf(roles, "status", serving(None), "whether the cluster is serving, and its nodes")
