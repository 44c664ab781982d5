"""``llmgw ctl auth oidc [set|show|off]`` and ``llmgw ctl auth entra set``: signing in to
the pages with the company's OpenID Connect provider, or Microsoft Entra ID, and what
each of its groups gives (``--map GROUP=ORG[/TEAM]:ROLE``, ``--map GROUP=cluster:ROLE``).

The client secret is read from a file (never a command-line argument, which other users
of the machine could read in the process list), sent once, sealed in the store, and never
shown back: ``show`` says ``set``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from llmgw.client import Client, Subcommands, UsageError
from llmgw.client.ctl_engines import json_and_client_options
from llmgw.client.routes import Route
from llmgw.client.tables import render, when
from llmgw.wire.admin import OidcJson

OIDC: Route[OidcJson] = Route("GET", "/api/v1/auth/oidc")
SET_OIDC: Route[OidcJson] = Route("POST", "/api/v1/auth/oidc")
OIDC_OFF: Route[OidcJson] = Route("DELETE", "/api/v1/auth/oidc")
MAP_HELP = (
    "what a group gives: GROUP=cluster:viewer|operator|admin, or "
    "GROUP=ORG:member|manager|admin, GROUP=ORG/TEAM:... (repeat)"
)


def shown(doc: OidcJson) -> str:
    if not doc["enabled"]:
        return "OIDC sign-in is off (`llmgw ctl auth oidc set` or `ctl auth entra set`)."
    rows = [
        ["kind", str(doc["kind"])],
        ["issuer", str(doc["issuer"])],
        ["client id", str(doc["client_id"])],
        ["client secret", doc["client_secret"] or "not set"],
        ["groups claim", str(doc["groups_claim"])],
        ["scopes", " ".join(doc["scopes"])],
        ["button", f"Sign in with {doc['name']}"],
        ["changed", when(doc["updated_at"])],
    ]
    out = render(["OIDC", "VALUE"], rows)
    if doc["maps"]:
        maps = [[m["group"], m["target"], m["role"]] for m in doc["maps"]]
        out += "\n\n" + render(["GROUP", "GIVES IN", "ROLE"], maps)
    return out


def read_secret(path: str) -> str:
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise UsageError(f"--client-secret-file {path}: cannot read it ({exc.strerror})") from None
    if not secret:
        raise UsageError(f"--client-secret-file {path}: the file is empty")
    return secret


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> Subcommands:
    def printed(args: argparse.Namespace, doc: OidcJson) -> int:
        print(json.dumps(doc, indent=2) if args.json else shown(doc))
        return 0

    def show(args: argparse.Namespace) -> int:
        return printed(args, client(args).call(OIDC))

    def off(args: argparse.Namespace) -> int:
        return printed(args, client(args).call(OIDC_OFF))

    def change(kind: str) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            body: dict[str, object] = {
                "kind": kind,
                "client_id": args.client_id,
                "client_secret": read_secret(args.client_secret_file),
                "groups_claim": args.groups_claim,
                "maps": list(args.map or []),
            }
            if kind == "entra":
                body["tenant"] = args.tenant
            else:
                body["issuer"] = args.issuer
            if args.scopes:
                body["scopes"] = args.scopes.replace(",", " ").split()
            if args.name:
                body["name"] = args.name
            return printed(args, client(args).call(SET_OIDC, body=body))

        return run

    def options(p: argparse.ArgumentParser, action: bool = True) -> None:
        json_and_client_options(p, client_options, action)

    def settings(p: argparse.ArgumentParser) -> None:
        p.add_argument("--client-id", required=True, help="the client id the provider gave")
        p.add_argument(
            "--client-secret-file",
            required=True,
            metavar="FILE",
            help="a file holding the client's secret (sealed in the store, never shown)",
        )
        p.add_argument(
            "--groups-claim",
            default="groups",
            help="the ID token's claim listing the person's groups (default groups)",
        )
        p.add_argument("--map", action="append", metavar="GROUP=TARGET:ROLE", help=MAP_HELP)
        p.add_argument(
            "--scopes", help="the scopes to ask for (default 'openid profile email'; add groups)"
        )
        p.add_argument("--name", help="what the sign-in button names (default: the issuer)")
        options(p)

    auth = ctl_cmds.add_parser("auth", help="how people sign in: OIDC, Entra ID, LDAP, SCIM")
    auth_cmds = auth.add_subparsers(dest="auth_command", metavar="PROVIDER")

    oidc = auth_cmds.add_parser("oidc", help="sign in with an OpenID Connect provider")
    options(oidc, action=False)
    oidc.set_defaults(handler=show)
    sub = oidc.add_subparsers(dest="oidc_command", metavar="ACTION")
    p = sub.add_parser("set", help="the provider, client, secret and group maps")
    p.add_argument("--issuer", required=True, help="the provider's issuer URL")
    settings(p)
    p.set_defaults(handler=change("oidc"))
    p = sub.add_parser("show", help="the settings (the secret only as 'set')")
    options(p)
    p.set_defaults(handler=show)
    p = sub.add_parser("off", help="turn OIDC sign-in off (accounts stay)")
    options(p)
    p.set_defaults(handler=off)

    entra = auth_cmds.add_parser("entra", help="sign in with Microsoft Entra ID (OIDC)")
    options(entra, action=False)
    entra.set_defaults(handler=show)
    sub = entra.add_subparsers(dest="entra_command", metavar="ACTION")
    p = sub.add_parser("set", help="the tenant, client, secret and group maps")
    p.add_argument("--tenant", required=True, help="the tenant's id or domain")
    settings(p)
    p.set_defaults(handler=change("entra"))
    p = sub.add_parser("show", help="the settings (the secret only as 'set')")
    options(p)
    p.set_defaults(handler=show)
    p = sub.add_parser("off", help="turn Entra ID sign-in off (accounts stay)")
    options(p)
    p.set_defaults(handler=off)
    return auth_cmds
