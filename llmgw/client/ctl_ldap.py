"""``llmgw ctl auth ldap [show|set|off|test]``: signing in with an LDAP directory or
Active Directory. The service account's password and the CA are read from files here
and sent to the control plane, which seals the password in the store; ``test`` tries
the settings from the control plane and says which step failed."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from llmgw.client import Client, Subcommands, UsageError
from llmgw.client.routes import Route
from llmgw.client.tables import render, when
from llmgw.wire.admin.ldap import LdapSettingsJson, LdapTestJson

LDAP: Route[LdapSettingsJson] = Route("GET", "/api/v1/auth/ldap")
SET_LDAP: Route[LdapSettingsJson] = Route("POST", "/api/v1/auth/ldap")
LDAP_OFF: Route[LdapSettingsJson] = Route("DELETE", "/api/v1/auth/ldap")
TEST_LDAP: Route[LdapTestJson] = Route("POST", "/api/v1/auth/ldap/test")


def read_secret(path: str, what: str) -> str:
    """A file's text without its last line end; an empty or unreadable one is refused."""
    try:
        text = Path(path).read_text().rstrip("\r\n")
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if not text:
        raise UsageError(f"{what}: {path} is empty")
    return text


def shown(doc: LdapSettingsJson) -> str:
    if not doc["enabled"]:
        return "LDAP sign-in is off (`llmgw ctl auth ldap set` turns it on)."
    rows = [
        ["url", str(doc["url"])],
        ["bind dn", str(doc["bind_dn"])],
        ["bind password", doc["bind_password"] or "-"],
        ["base dn", str(doc["base_dn"])],
        ["user filter", str(doc["user_filter"])],
        ["group base", str(doc["group_base"])],
        ["group filter", str(doc["group_filter"])],
        ["active directory", "yes" if doc["ad"] else "no"],
        ["ca", doc["ca"] or "-"],
        ["updated", f"{when(doc['updated_at'])} by {doc['updated_by'] or '-'}"],
    ]
    out = render(["LDAP", "VALUE"], rows)
    maps = [[m["group"], m["target"], m["role"]] for m in doc["maps"]]
    if maps:
        out += "\n\n" + render(["GROUP", "GIVES IN", "ROLE"], maps)
    return out


def tested(doc: LdapTestJson) -> str:
    rows = [[s["step"], "ok" if s["ok"] else "FAILED", s["detail"]] for s in doc["steps"]]
    out = render(["STEP", "", "DETAIL"], rows)
    person = doc["person"]
    if person is not None:
        out += f"\n\nperson: {person['dn']} ({person['name'] or '-'}, {person['email'] or '-'})"
        out += "\ngroups: " + (", ".join(doc["groups"]) or "none")
        grants = [f"{g['target']}: {g['role']} (from {g['group']})" for g in doc["grants"]]
        out += "\ngives: " + ("; ".join(grants) or "nothing")
    if not doc["ok"]:
        out += f"\n\nfailed at {doc['failed']}"
    return out


def add_parsers(
    auth_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def show(args: argparse.Namespace) -> int:
        doc = client(args).call(LDAP)
        print(json.dumps(doc, indent=2) if args.json else shown(doc))
        return 0

    def set_(args: argparse.Namespace) -> int:
        body: dict[str, object] = {
            "url": args.url,
            "bind_dn": args.bind_dn,
            "base_dn": args.base_dn,
            "ad": args.ad,
            "maps": list(args.map or []),
        }
        if args.bind_password_file:
            body["bind_password"] = read_secret(args.bind_password_file, "--bind-password-file")
        if args.ca_file:
            body["ca_pem"] = read_secret(args.ca_file, "--ca-file")
        for name in ("user_filter", "group_base", "group_filter"):
            if getattr(args, name):
                body[name] = getattr(args, name)
        doc = client(args).call(SET_LDAP, body=body)
        print(json.dumps(doc, indent=2) if args.json else shown(doc))
        return 0

    def off(args: argparse.Namespace) -> int:
        doc = client(args).call(LDAP_OFF)
        print(json.dumps(doc, indent=2) if args.json else shown(doc))
        return 0

    def test(args: argparse.Namespace) -> int:
        body: dict[str, object] = {"login": args.login}
        if args.password_file:
            body["password"] = read_secret(args.password_file, "--password-file")
        doc = client(args).call(TEST_LDAP, body=body)
        print(json.dumps(doc, indent=2) if args.json else tested(doc))
        return 0 if doc["ok"] else 1

    def options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print the API's JSON")
        client_options(p)

    ldap = auth_cmds.add_parser(
        "ldap", help="sign in with an LDAP directory or Active Directory (admin)"
    )
    options(ldap)
    ldap.set_defaults(handler=show)
    sub = ldap.add_subparsers(dest="ldap_command", metavar="ACTION")
    p = sub.add_parser("show", help="the settings (the bind password only as 'set')")
    options(p)
    p.set_defaults(handler=show)

    p = sub.add_parser("set", help="set LDAP sign-in; every control plane uses it at once")
    p.add_argument("--url", required=True, help="ldap://HOST[:PORT] or ldaps://HOST[:PORT]")
    p.add_argument("--bind-dn", required=True, help="the service account the search binds as")
    p.add_argument(
        "--bind-password-file",
        metavar="FILE",
        help="a file holding the service account's password (sealed in the store); "
        "left out: the one kept",
    )
    p.add_argument("--base-dn", required=True, help="where people are searched")
    p.add_argument(
        "--user-filter",
        help="finds a person by {login}: default (uid={login}), with --ad "
        "(&(objectClass=user)(sAMAccountName={login}))",
    )
    p.add_argument("--group-base", help="where groups are searched (default: --base-dn)")
    p.add_argument(
        "--group-filter",
        help="finds the groups holding {dn} (or {login}): default "
        "(|(member={dn})(uniqueMember={dn})), nested groups walked up",
    )
    p.add_argument(
        "--ad",
        action="store_true",
        help="Active Directory: its filters, nested groups by LDAP_MATCHING_RULE_IN_CHAIN",
    )
    p.add_argument("--ca-file", metavar="FILE", help="CA certificates (PEM) for ldaps://")
    p.add_argument(
        "--map",
        action="append",
        metavar="GROUP=ORG[/TEAM]:ROLE",
        help="members of GROUP (its cn or DN) get ROLE (member, manager, admin) in ORG or "
        "its TEAM, or with GROUP=cluster:ROLE a cluster role (viewer, operator, admin); "
        "repeat. Never lowers a role an admin set by hand",
    )
    options(p)
    p.set_defaults(handler=set_)

    p = sub.add_parser("off", help="turn LDAP sign-in off (its settings and password go)")
    options(p)
    p.set_defaults(handler=off)

    p = sub.add_parser(
        "test",
        help="try the settings from the control plane for USER: connect, bind, find, "
        "groups; says which step failed",
    )
    p.add_argument("login", metavar="USER", help="the login to find")
    p.add_argument("--password-file", metavar="FILE", help="USER's password, to try their bind too")
    options(p)
    p.set_defaults(handler=test)
