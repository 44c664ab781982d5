"""``llmgw login [--server URL] [--token]``: sign ctl in as a person.

Without ``--token``, a device flow through the pages (``server/people/devicelogin.py``):
ctl asks the control plane for a code, prints the page to open and the code it should
show, and polls until the person, signed in to the pages, approves it; the control plane
then answers a personal token made for them. With ``--token``, ctl reads a personal
token pasted on stdin (one made on the pages or with ``ctl tokens create``).

Either way the token is checked (``/api/v1/me``) and kept with the server's URL in the
user's ctl config (``credentials.py``), which every later ctl command reads; the data
dir's admin token stays for bootstrap and recovery.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable

from llmgw.client import Subcommands, UsageError, credentials
from llmgw.client.admin import AdminClient, resolve
from llmgw.client.adminbase import AdminError
from llmgw.wire.admin import MeJson

PERSONAL = "llmgw-pat-"


def where_to(server: str | None) -> str:
    """The control plane to sign in to: ``--server``, ``LLMGW_SERVER``, the one signed
    in to before, or this machine's (its data dir's config)."""
    server = server or os.environ.get("LLMGW_SERVER")
    if server:
        return credentials.base_url(server)
    saved = credentials.read()
    if saved is not None:
        return saved.server
    try:  # on the control plane's machine: its own address
        return resolve(None, "-", None).base_url
    except AdminError:
        raise UsageError(
            "which control plane? `llmgw login --server HOST:PORT` (or LLMGW_SERVER)"
        ) from None


def signed_in(me: MeJson) -> str:
    role = me["role"] or "no cluster role"
    groups = len(me["memberships"])
    return f"{me['name']} ({role}; {groups} membership{'s' if groups != 1 else ''})"


def keep(server: str, token: str) -> int:
    """Check the token against the server, then keep both."""
    me = AdminClient(server, token).me()
    if me["person"] is None:
        raise UsageError(
            "that is not a person's token (the admin token?): `llmgw login` keeps a personal "
            "token; the admin token needs no login (--token, LLMGW_TOKEN or the data dir)"
        )
    path = credentials.write(credentials.Saved(server, token))
    print(f"Signed in to {server} as {signed_in(me)}; the token is kept in {path}.")
    return 0


def say(text: str) -> None:
    """A line at once, even to a pipe: the person needs the link while ctl waits."""
    print(text, flush=True)


def device_flow(
    server: str,
    out: Callable[[str], None] = say,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """The personal token the person approves on the pages."""
    api = AdminClient(server, "")
    code = api.device_login(f"llmgw ctl on {socket.gethostname()}")
    out(f"Open {code['verify_url']}")
    out(f"signed in as yourself, and approve the code {code['user_code']} if it shows.")
    out(f"Waiting (up to {code['expires_in'] // 60} minutes; Ctrl-C to give up)...")
    ends = clock() + code["expires_in"]
    interval = max(1, code["interval"])
    while clock() < ends:
        sleep(interval)
        try:
            return api.device_token(code["device_code"])["token"]
        except AdminError as exc:
            if exc.kind == "authorization_pending":
                continue
            if exc.kind == "slow_down":
                interval += 1
                continue
            raise
    raise UsageError("nobody approved the code in time; run `llmgw login` again")


def add_parsers(roles: Subcommands) -> None:
    def login(args: argparse.Namespace) -> int:
        server = where_to(args.server)
        if args.token:
            if sys.stdin.isatty():
                print("Paste a personal token (llmgw-pat-...) and press Enter:", file=sys.stderr)
            token = sys.stdin.readline().strip()
            if not token:
                raise UsageError("--token: no token on stdin; paste one made on the pages")
            if not token.startswith(PERSONAL):
                raise UsageError(
                    f"--token: that is not a personal token (they start with {PERSONAL}); make "
                    "one on the pages or with `llmgw ctl tokens create`"
                )
            return keep(server, token)
        return keep(server, device_flow(server))

    p = roles.add_parser(
        "login", help="sign ctl in as yourself: approve on the pages, or paste a token"
    )
    p.add_argument("--server", help="control plane HTTP address, HOST:PORT or URL")
    p.add_argument(
        "--token",
        action="store_true",
        help="read a personal token pasted on stdin instead of approving on the pages",
    )
    p.set_defaults(handler=login)
