"""``llmgw ctl people ...``, ``llmgw ctl tokens ...`` and ``llmgw ctl audit``: people,
their personal tokens and the audit log, thin calls of the admin API with ``--json``.

What each caller may do is the control plane's to say: a refusal comes back in its
words (``making people needs the cluster's admin role``), never decided here.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections.abc import Callable
from typing import TypeVar

from llmgw.client import Client, Subcommands, UsageError
from llmgw.client.admin import AdminClient
from llmgw.client.tables import render
from llmgw.wire.admin import AuditEntryJson, PersonJson, PersonTokenJson

Shown = TypeVar("Shown")
DASH = "-"
ROLES = ("viewer", "operator", "admin")


def when(ts: float | None) -> str:
    if ts is None:
        return DASH
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M")


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a day (2026-12-01) or a time (2026-12-01T10:00, UTC unless it says
    its offset), or a span back from now (30m, 2h, 7d); as Unix seconds."""
    text = text.strip()
    span = {"m": 60, "h": 3600, "d": 86400}
    if text[:-1].isdigit() and text[-1:] in span:
        return (time.time() if now is None else now) - int(text[:-1]) * span[text[-1]]
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--since: {text!r} is neither a date or time (2026-12-01, 2026-12-01T10:00) nor a "
            "span back from now (30m, 2h, 7d)"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    return at.timestamp()


def people_table(people: list[PersonJson]) -> str:
    if not people:
        return "No people. Make one with `llmgw ctl people create --login LOGIN`."
    rows = [
        [
            p["login"],
            p["name"] or DASH,
            p["email"] or DASH,
            p["role"] or DASH,
            p["source"],
            "active" if p["active"] else "deactivated",
            p["id"],
        ]
        for p in people
    ]
    return render(["LOGIN", "NAME", "EMAIL", "ROLE", "SOURCE", "STATE", "ID"], rows)


def person_text(p: PersonJson) -> str:
    role: str = p["role"] or "none (only their memberships)"
    if p["role"] and p["role_by_hand"]:
        role += " (set by hand)"
    lines = [
        ("login", p["login"]),
        ("id", p["id"]),
        ("name", p["name"] or DASH),
        ("email", p["email"] or DASH),
        ("role", role),
        ("source", p["source"]),
        ("state", "active" if p["active"] else "deactivated"),
        ("created", when(p["created_at"])),
        ("updated", when(p["updated_at"])),
    ]
    return "\n".join(f"{k + ':':9} {v}" for k, v in lines)


def tokens_table(tokens: list[PersonTokenJson]) -> str:
    if not tokens:
        return "No personal tokens. Make one with `llmgw ctl tokens create --name NAME`."
    rows = [
        [
            t["id"],
            t["name"],
            "revoked" if t["revoked_at"] is not None else "active",
            when(t["created_at"]),
            when(t["expires_at"]) if t["expires_at"] is not None else "never",
        ]
        for t in tokens
    ]
    return render(["ID", "NAME", "STATE", "CREATED", "EXPIRES"], rows)


def audit_table(entries: list[AuditEntryJson]) -> str:
    if not entries:
        return "No audit entries match."
    rows = [
        [when(e["at"]), e["actor"], e["action"], e["target"], e["org_id"] or DASH, e["detail"]]
        for e in entries
    ]
    return render(["AT", "ACTOR", "ACTION", "TARGET", "ORG", "DETAIL"], rows)


def own_person(api: AdminClient) -> str:
    """The caller's person id: ``--person`` left out means oneself."""
    me = api.me()
    if me["person"] is None:
        raise UsageError(
            f"{me['name']} is not a person (the admin token): name one with --person, or "
            "sign in as yourself with `llmgw login`"
        )
    return me["person"]["id"]


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def show(args: argparse.Namespace, value: Shown, text: Callable[[Shown], str]) -> int:
        print(json.dumps(value, indent=2) if args.json else text(value))
        return 0

    def leaf(
        sub: Subcommands, name: str, run: Callable[[argparse.Namespace], int], text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text)
        p.add_argument("--json", action="store_true", help="print the API's JSON")
        client_options(p)
        p.set_defaults(handler=run)
        return p

    # --- people

    def people_list(args: argparse.Namespace) -> int:
        return show(args, client(args).people(), people_table)

    def people_show(args: argparse.Namespace) -> int:
        return show(args, client(args).person(args.person), person_text)

    def people_create(args: argparse.Namespace) -> int:
        body: dict[str, object] = {"login": args.login}
        body.update({k: v for k in ("name", "email", "role") if (v := getattr(args, k))})
        return show(args, client(args).create_person(body), person_text)

    def people_update(args: argparse.Namespace) -> int:
        body: dict[str, object] = {
            k: v for k in ("name", "email", "role") if (v := getattr(args, k)) is not None
        }
        if args.no_role:
            body["no_role"] = True
        if not body:
            raise UsageError("say what changes: --name, --email, --role or --no-role")
        return show(args, client(args).change_person(args.person, body), person_text)

    def people_active(active: bool) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            changed = client(args).change_person(args.person, {"active": active})
            said = "active" if active else "deactivated: their sessions and tokens have ended"
            return show(args, changed, lambda p: f"{p['login']} is {said}")

        return run

    people = ctl_cmds.add_parser(
        "people", help="people: list, show, create, update, deactivate, activate"
    )
    sub = people.add_subparsers(dest="people_command", metavar="ACTION")
    leaf(sub, "list", people_list, "everyone you may see")
    leaf(sub, "show", people_show, "one person").add_argument("person", help="id or login")
    p = leaf(sub, "create", people_create, "an account for a person (the cluster's admins)")
    p.add_argument("--login", required=True, help="what they sign in as")
    p.add_argument("--name", help="their full name")
    p.add_argument("--email", help="their e-mail address")
    p.add_argument("--role", choices=ROLES, help="their cluster role (default: none)")
    p = leaf(sub, "update", people_update, "change a person's name, e-mail or cluster role")
    p.add_argument("person", help="id or login")
    p.add_argument("--name")
    p.add_argument("--email")
    roles = p.add_mutually_exclusive_group()
    roles.add_argument("--role", choices=ROLES, help="their cluster role, set by hand")
    roles.add_argument(
        "--no-role", action="store_true", help="take their cluster role away (memberships stay)"
    )
    leaf(
        sub, "deactivate", people_active(False), "end their sessions and tokens, at once"
    ).add_argument("person", help="id or login")
    leaf(sub, "activate", people_active(True), "let a deactivated person in again").add_argument(
        "person", help="id or login"
    )

    # --- personal tokens

    def tokens_list(args: argparse.Namespace) -> int:
        api = client(args)
        return show(args, api.person_tokens(args.person or own_person(api)), tokens_table)

    def tokens_create(args: argparse.Namespace) -> int:
        api = client(args)
        body: dict[str, object] = {"name": args.name, "days": None if args.no_expiry else args.days}
        made = api.create_person_token(own_person(api), body)
        return show(
            args,
            made,
            lambda t: (
                f"{t['token']}\n\nPersonal token {t['id']} ({t['name']}): shown this once, kept "
                "only as a hash. It acts as you, with your role and memberships as they are "
                "at each call: `llmgw ctl --token` or LLMGW_TOKEN, or `llmgw login --token`."
            ),
        )

    def tokens_revoke(args: argparse.Namespace) -> int:
        api = client(args)
        done = api.revoke_person_token(args.person or own_person(api), args.id)
        return show(args, done, lambda t: f"token {t['id']} ({t['name']}) is revoked")

    tokens = ctl_cmds.add_parser("tokens", help="your personal tokens: list, create, revoke")
    sub = tokens.add_subparsers(dest="tokens_command", metavar="ACTION")
    p = leaf(sub, "list", tokens_list, "your personal tokens (never the tokens themselves)")
    p.add_argument("--person", help="another person's (id or login; the cluster's admins)")
    p = leaf(sub, "create", tokens_create, "a personal token acting as you (shown once)")
    p.add_argument("--name", required=True, help="what it is for")
    p.add_argument("--days", type=int, default=90, help="days it lasts (default 90)")
    p.add_argument("--no-expiry", action="store_true", help="until revoked")
    p = leaf(sub, "revoke", tokens_revoke, "revoke a personal token, at once")
    p.add_argument("id")
    p.add_argument("--person", help="another person's (id or login; the cluster's admins)")

    # --- the audit log

    def audit(args: argparse.Namespace) -> int:
        query: dict[str, str | int | float] = {"limit": args.limit}
        query.update({k: v for k in ("org", "person") if (v := getattr(args, k))})
        if args.since:
            query["since"] = parse_since(args.since)
        return show(args, client(args).audit(query), audit_table)

    p = leaf(ctl_cmds, "audit", audit, "who changed what, newest first")
    p.add_argument("--org", help="only this organisation's (needed unless cluster staff)")
    p.add_argument("--person", help="only what this person (id or login) or admin@HOST did")
    p.add_argument("--since", help="from a date or time (2026-12-01, 2026-12-01T10:00) or 2h, 7d")
    p.add_argument("--limit", type=int, default=100, help="the newest this many (default 100)")
