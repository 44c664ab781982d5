"""``llmgw ctl mcp list|show|add|set|remove|test|off|on``: the MCP tool servers the
gateway's ``/mcp`` reaches. A credential is read from a file (``--secret-file``:
``Header-Name: value`` lines; ``--bearer-file``: a token sent as ``Authorization:
Bearer``), never from the command line, and kept sealed by the control plane."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from llmgw.client import Client, Subcommands
from llmgw.client.ctl_engines import json_and_client_options
from llmgw.client.tables import render, when
from llmgw.wire.admin import McpServerJson, McpTestJson


def _state(s: McpServerJson) -> str:
    if not s["enabled"]:
        return "off"
    if not s["up"]:
        return f"out until {when(s['out_until'])}"
    return "on"


def servers_table(servers: list[McpServerJson]) -> str:
    rows = [
        [
            s["name"],
            _state(s),
            s["url"] or "(in process)",
            "-" if s["tools"] is None else str(s["tools"]),
            "-" if s["rate"] is None else f"{s['rate']}/min",
            f"{s['timeout']:g} s",
        ]
        for s in servers
    ]
    return render(["SERVER", "STATE", "ADDRESS", "TOOLS", "RATE", "TIMEOUT"], rows)


def server_text(s: McpServerJson) -> str:
    headers = ", ".join(
        f"{h['name']} (sealed)" if h["sealed"] else f"{h['name']}: {h['value']}"
        for h in s["headers"]
    )
    lines = [
        f"server:      {s['name']}{' (built in)' if s['builtin'] else ''}",
        f"state:       {_state(s)}",
        f"address:     {s['url'] or '(answered by the control plane)'}",
        f"headers:     {headers or '-'}",
        f"timeout:     {s['timeout']:g} s",
        f"rate:        {'-' if s['rate'] is None else str(s['rate']) + ' calls a minute a key'}",
        f"description: {s['description'] or '-'}",
        f"changed:     {when(s['updated_at'])} by {s['updated_by'] or '-'}",
    ]
    return "\n".join(lines)


def test_text(found: McpTestJson) -> str:
    if not found["ok"]:
        return f"{found['name']}: FAILED ({found['failure']}) after {found['ms']:g} ms: " + (
            found["message"] or ""
        )
    rows = [[t["name"], t["description"][:80]] for t in found["tools"]]
    head = f"{found['name']}: ok, {len(rows)} tool(s) in {found['ms']:g} ms"
    return head + ("\n" + render(["TOOL", "DESCRIPTION"], rows) if rows else "")


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise SystemExit(f"{what} {path}: {exc.strerror or exc}") from None


def _body(args: argparse.Namespace) -> dict[str, object]:
    """What ``add`` and ``set`` send: credentials read from their files."""
    body: dict[str, object] = {}
    if args.secret_file is not None:
        body["secret"] = _read(args.secret_file, "--secret-file")
    if args.bearer_file is not None:
        body["bearer"] = _read(args.bearer_file, "--bearer-file").strip()
    if args.header:
        body["headers"] = list(args.header)
    for name in ("timeout", "rate", "description"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    return body


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    def show_all(args: argparse.Namespace) -> int:
        found = client(args).mcp_servers()
        print(json.dumps(found, indent=2) if args.json else servers_table(found))
        return 0

    def printed(doc: McpServerJson, args: argparse.Namespace) -> int:
        print(json.dumps(doc, indent=2) if args.json else server_text(doc))
        return 0

    def show(args: argparse.Namespace) -> int:
        return printed(client(args).mcp_server(args.name), args)

    def add(args: argparse.Namespace) -> int:
        body = {"name": args.name, "url": args.url, **_body(args)}
        return printed(client(args).add_mcp(body), args)

    def change(args: argparse.Namespace) -> int:
        body = _body(args)
        if args.url is not None:
            body["url"] = args.url
        if args.clear:
            body["clear"] = [c.strip() for c in args.clear.split(",") if c.strip()]
        if not body:
            raise SystemExit("say what to change: --url, --header, --secret-file, ... or --clear")
        return printed(client(args).change_mcp(args.name, body), args)

    def remove(args: argparse.Namespace) -> int:
        done = client(args).remove_mcp(args.name)
        print(json.dumps(done, indent=2) if args.json else f"removed {done['name']}")
        return 0

    def test(args: argparse.Namespace) -> int:
        found = client(args).test_mcp(args.name)
        print(json.dumps(found, indent=2) if args.json else test_text(found))
        return 0 if found["ok"] else 1

    def switch(on: bool) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            return printed(client(args).switch_mcp(args.name, on), args)

        return run

    def options(p: argparse.ArgumentParser, action: bool = True) -> None:
        json_and_client_options(p, client_options, action)

    def server_options(p: argparse.ArgumentParser) -> None:
        creds = p.add_mutually_exclusive_group()
        creds.add_argument(
            "--secret-file",
            metavar="F",
            help="a file of 'Header-Name: value' lines (X-Api-Key: ...), each kept sealed",
        )
        creds.add_argument(
            "--bearer-file",
            metavar="F",
            help="a file holding a token, sent as 'Authorization: Bearer TOKEN', kept sealed",
        )
        p.add_argument(
            "--header",
            action="append",
            metavar="K=V",
            help="a plain header sent with each request (repeat); not for credentials",
        )
        p.add_argument("--timeout", type=float, metavar="S", help="a whole call's seconds (30)")
        p.add_argument("--rate", type=int, metavar="N", help="each key's calls a minute to it")
        p.add_argument("--description", metavar="T", help="what it is for, in words")

    mcp = ctl_cmds.add_parser(
        "mcp", help="the MCP tool servers behind the gateway's /mcp (llmgw:admin built in)"
    )
    options(mcp, action=False)
    mcp.set_defaults(handler=show_all)
    sub = mcp.add_subparsers(dest="mcp_command", metavar="ACTION")
    p = sub.add_parser("list", help="every server: state, address, tools, rate, timeout")
    options(p)
    p.set_defaults(handler=show_all)
    p = sub.add_parser("show", help="one server, its headers named (sealed ones never shown)")
    p.add_argument("name")
    options(p)
    p.set_defaults(handler=show)
    p = sub.add_parser("add", help="add a tool server (its streamable HTTP address)")
    p.add_argument("name", help="the SERVER of SERVER.TOOL: a-z, 0-9, '_', '-'")
    p.add_argument("url", help="its address, such as https://tools.example.com/mcp")
    server_options(p)
    options(p)
    p.set_defaults(handler=add)
    p = sub.add_parser("set", help="change a server: address, headers, credential, rate...")
    p.add_argument("name")
    p.add_argument("--url", help="its new address")
    server_options(p)
    p.add_argument(
        "--clear",
        metavar="WHAT,...",
        help="back to none: rate, timeout, description, headers, secret",
    )
    options(p)
    p.set_defaults(handler=change)
    p = sub.add_parser("remove", help="remove a server (its grants stay, granting nothing)")
    p.add_argument("name")
    options(p)
    p.set_defaults(handler=remove)
    p = sub.add_parser("test", help="connect with its credential and list its tools")
    p.add_argument("name")
    options(p)
    p.set_defaults(handler=test)
    for word, on in (("off", False), ("on", True)):
        p = sub.add_parser(
            word, help=f"turn a server {word} (its tools {'back on' if on else 'off'} /mcp)"
        )
        p.add_argument("name")
        options(p)
        p.set_defaults(handler=switch(on))
