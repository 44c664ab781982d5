"""``llmgw ctl auth scim [token|off|map]``: SCIM provisioning from the company's identity
provider, thin calls of ``/api/v1/auth/scim`` (a cluster admin's).

``token`` prints a new bearer token for the provider once (the one before ends);
``off`` ends it; ``map GROUP=ORG[/TEAM]:ROLE ...`` sets every map of the provider's
groups at once (``GROUP=cluster:ROLE`` for a cluster role; none: groups give nothing).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from llmgw.client import Client, Subcommands
from llmgw.client.admin import AdminClient
from llmgw.client.ctl_engines import json_and_client_options
from llmgw.client.routes import Route
from llmgw.client.tables import render, when
from llmgw.wire.admin.scim import ScimJson, ScimTokenJson

SCIM: Route[ScimJson] = Route("GET", "/api/v1/auth/scim")
SCIM_TOKEN: Route[ScimTokenJson] = Route("POST", "/api/v1/auth/scim/token")
SCIM_OFF: Route[ScimJson] = Route("DELETE", "/api/v1/auth/scim")
SCIM_MAPS: Route[ScimJson] = Route("POST", "/api/v1/auth/scim/maps")


def shown(doc: ScimJson) -> str:
    state = f"on (token made {when(doc['token_made_at'])} UTC)" if doc["token"] else "off"
    rows = [
        ["scim", state],
        ["endpoint", doc["endpoint"]],
        ["users", str(doc["users"])],
        ["groups", str(doc["groups"])],
    ]
    rows += [["map", m] for m in doc["maps"]] or [["map", "none: groups give nothing"]]
    return render(["SCIM", "VALUE"], rows)


def add_parsers(
    auth_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """``scim`` under ``ctl auth``."""

    def output(doc: ScimJson, args: argparse.Namespace) -> int:
        print(json.dumps(doc, indent=2) if args.json else shown(doc))
        return 0

    def show(args: argparse.Namespace) -> int:
        return output(client(args).call(SCIM), args)

    def token(args: argparse.Namespace) -> int:
        admin: AdminClient = client(args)
        made = admin.call(SCIM_TOKEN)
        if args.json:
            print(json.dumps(made, indent=2))
            return 0
        print(made["token"])
        print(
            f"\nGive the identity provider this token (shown once) and the URL "
            f"{admin.base_url}{made['endpoint']}; the token before it no longer works.",
        )
        return 0

    def off(args: argparse.Namespace) -> int:
        return output(client(args).call(SCIM_OFF), args)

    def maps(args: argparse.Namespace) -> int:
        given = [] if args.clear else list(args.maps)
        if not given and not args.clear:
            raise SystemExit("name maps (GROUP=ORG[/TEAM]:ROLE, GROUP=cluster:ROLE) or --clear")
        return output(client(args).call(SCIM_MAPS, body={"maps": given}), args)

    def options(p: argparse.ArgumentParser, action: bool = True) -> None:
        json_and_client_options(p, client_options, action)

    scim = auth_cmds.add_parser(
        "scim", help="SCIM provisioning: the identity provider makes people and groups"
    )
    options(scim, action=False)
    scim.set_defaults(handler=show)
    sub = scim.add_subparsers(dest="scim_command", metavar="ACTION")
    p = sub.add_parser("show", help="on or off, the endpoint, the maps")
    options(p)
    p.set_defaults(handler=show)
    p = sub.add_parser("token", help="a new bearer token for the provider, shown once")
    options(p)
    p.set_defaults(handler=token)
    p = sub.add_parser("off", help="end SCIM's token: the provider is refused")
    options(p)
    p.set_defaults(handler=off)
    p = sub.add_parser(
        "map",
        help="map the provider's groups to memberships (all maps at once)",
        description="Each GROUP=ORG[/TEAM]:ROLE makes the group's members member, manager "
        "or admin of the organisation or team; GROUP=cluster:ROLE gives them the cluster "
        "role viewer, operator or admin. A role or membership an admin set by hand is "
        "never lowered.",
    )
    p.add_argument("maps", nargs="*", metavar="MAP", help="GROUP=ORG[/TEAM]:ROLE")
    p.add_argument("--clear", action="store_true", help="no maps: groups give nothing")
    options(p)
    p.set_defaults(handler=maps)
