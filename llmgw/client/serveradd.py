"""``llmgw server add HOST``: make a machine a standby control plane over ssh.

Run on (or against) the leader, with ``node add``'s pieces (the ssh ``Remote`` in
BatchMode, the machine's probe, the zipapp's copy checked by SHA-256): it mints a server
token, copies the llmgw release the leader names (fetched and checked here,
``zipappsource``; or ``--zipapp``'s file as it is), runs ``server join`` there, starts
``server run`` (a systemd unit, else ``nohup`` with a pid file) and waits until the leader
sees it answer as a standby. A failure names its step and shows the log.

``--vip ADDR/PREFIX --interface IF`` also writes keepalived's configuration on HOST, and
the leader's: here when this is the leader's machine (reached over loopback) and we are
root, else printed with where it goes. Each keepalived asks its own ``GET /leader`` (200 on
the leader, 503 on a standby); a yes adds ``weight`` to a priority all share, so the leader
bids highest. Preemption stays on (no ``nopreempt``): when leadership moves while the
address's holder still runs, the new leader's bid must take it. With no leader (SQLite,
before ``server promote``) all bid alike and the address stays on a standby, serving /v1.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from llmgw.client.admin import AdminClient, local_url
from llmgw.client.adminbase import AdminError
from llmgw.client.keepalived import (
    KEEPALIVED_DIR,
    NAME_RE,
    ServerAddError,
    Vip,
    keepalived_conf,
    keepalived_outcome,
    keepalived_script,
    parse_vip,
)
from llmgw.client.nodeadd import _PREFIX_RE, LOG_TAIL_LINES, NodeInstaller
from llmgw.client.remote import NodeAddError, NodeFacts, launch_script, remote_from_args
from llmgw.client.zipappsource import explicit_zipapp, zipapp_for
from llmgw.config import ConfigError, parse_hostport

__all__ = ["ServerAddError", "Vip", "add_server", "keepalived_conf", "parse_vip"]

UNIT_NAME = "llmgw-server.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
TOKEN_TTL = 900


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def leader_address(
    base_url: str, host: str, token_addresses: list[str], explicit: str | None
) -> str:
    """The leader's HTTP address as HOST reaches it, for ``server join --server``: --leader,
    else the admin client's, unless that is loopback and HOST is another machine."""
    address = explicit
    if not address:
        url = urlsplit(base_url)
        address = url.netloc
        if _is_loopback(url.hostname or "") and not _is_loopback(host):
            if not token_addresses:
                raise ServerAddError(
                    f"this command talks to the leader at {address}, which {host} cannot "
                    "reach, and the leader advertises no address: pass --leader HOST:PORT "
                    "(its --listen address as HOST reaches it)"
                )
            address = str(token_addresses[0])
    try:
        parse_hostport(address)
    except ConfigError as exc:
        raise ServerAddError(f"--leader: {exc}") from exc
    return address


# --- the scripts run on HOST ----------------------------------------------------------


def join_script(prefix: str, flags: list[str]) -> str:
    """Shell that runs ``server join FLAGS`` on HOST; the token comes on stdin, so it is on
    no command line but join's own."""
    q = shlex.quote
    return f"""\
set -e
IFS= read -r token
cd {q(prefix)}
SHIV_ROOT={q(prefix + "/.shiv")} exec python3 llmgw.pyz server join --token "$token" \\
  --data-dir {q(prefix + "/data")} {" ".join(q(f) for f in flags)} --yes
"""


def existing_script(prefix: str) -> str:
    """Shell that says whether HOST already holds a control plane's data dir."""
    return f"if [ -e {shlex.quote(prefix + '/data/server.yaml')} ]; then echo exists; fi"


def listener_script(url: str) -> str:
    """Shell that prints the HTTP status ``url`` answers on HOST, or ``none``."""
    code = (
        "import sys, urllib.request as u, urllib.error as e\n"
        "try:\n    print(u.urlopen(sys.argv[1], timeout=3).status)\n"
        "except e.HTTPError as exc:\n    print(exc.code)\n"
        "except OSError:\n    print('none')"
    )
    return f"python3 -c {shlex.quote(code)} {shlex.quote(url)}"


def server_argv(prefix: str) -> list[str]:
    """The control plane's command line as installed under ``prefix`` (``llmgw service``
    starts it the same way)."""
    return ["server", "run", "--data-dir", f"{prefix}/data"]


def systemd_unit(prefix: str) -> str:
    return f"""\
[Unit]
Description=llmgw control plane (standby until promoted)
After=network-online.target
Wants=network-online.target

[Service]
# shiv unpacks the zipapp here instead of in root's home.
Environment=SHIV_ROOT={prefix}/.shiv
ExecStart=/usr/bin/env python3 {prefix}/llmgw.pyz {" ".join(server_argv(prefix))}
Restart=always
RestartSec=2
# One connection per agent, and thousands of agents: the default 1,024 is too few.
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
"""


# Tenths of a second a stopping control plane gets before its start goes on anyway.
STOP_TENTHS = 100


def start_script(prefix: str, systemd: bool) -> str:
    """Shell that (re)starts the control plane: the unit (read on stdin) or nohup'd."""
    argv = server_argv(prefix)
    return launch_script(prefix, systemd, UNIT_NAME, UNIT_PATH, "server", argv, STOP_TENTHS)


# --- the steps ------------------------------------------------------------------------


class ServerInstaller:
    """The steps of one ``server add``, in order; the node installer does what the two
    share (probe, privileges, the zipapp's copy)."""

    def __init__(self, args: argparse.Namespace, client: AdminClient, node: NodeInstaller):
        self.args = args
        self.client = client
        self.node = node
        self.host = node.host
        self.prefix: str = args.prefix
        self.step = "checking the options"
        # Set when a failure is worth the log's tail after its message.
        self.show_log = False

    def say(self, step: str, detail: str = "") -> None:
        self.step = step
        print(f"==> {step}{detail}", flush=True)

    def run(self) -> int:
        args = self.args
        vip = parse_vip(args.vip, args.interface, args.vrid) if args.vip else None
        if args.interface and not args.vip:
            raise ServerAddError("--interface goes with --vip ADDR/PREFIX")
        try:
            parse_hostport(args.listen)
        except ConfigError as exc:
            raise ServerAddError(f"--listen: {exc}") from exc
        explicit = explicit_zipapp(args)
        remote = self.node.remote
        self.say("looking at the machine", f" {remote.destination} over ssh (port {remote.port})")
        facts = self.node.probe()
        name = args.name or facts.hostname
        if not NAME_RE.fullmatch(name or ""):
            raise ServerAddError(
                f"control plane name {name!r} is not valid: pass --name NAME (letters, digits, "
                "'.', '_' or '-', up to 63 characters, starting with a letter or digit)"
            )
        self.refuse_existing(name)
        with tempfile.TemporaryDirectory(prefix="llmgw-release-") as fetched:
            if explicit is None:
                self.step = "fetching the release"
            pyz = zipapp_for(
                args,
                self.client,
                facts,
                self.host,
                systemd=self.node.use_systemd,
                into=Path(fetched),
                explicit=explicit,
            )
            return self.install(facts, name, pyz, vip)

    def install(self, facts: NodeFacts, name: str, pyz: Path, vip: Vip | None) -> int:
        args = self.args
        python = facts.unit_python_text if self.node.use_systemd else facts.python_text
        print(f"    control plane {name}, Python {python}, {facts.machine}")

        self.say("asking the leader for a server token")
        answer = self.client.server_token(TOKEN_TTL)
        leader = leader_address(
            self.client.base_url, self.host, answer.get("addresses") or [], args.leader
        )
        self.say("copying the zipapp", f" {pyz} to {self.host}:{self.prefix}/llmgw.pyz")
        self.node.copy(pyz)
        self.say("joining the cluster", f" as {name}, a standby of {leader}")
        self.join(str(answer["token"]), leader, name)
        self.start()
        self.wait_standby(name)
        if vip is not None:
            self.keepalived(vip, name)
        return 0

    def refuse_existing(self, name: str) -> None:
        result = self.node.privileged(existing_script(self.prefix), what="looking for a data dir")
        if "exists" in result.stdout:
            raise ServerAddError(
                f"{self.host}:{self.prefix}/data already holds a control plane's data dir; "
                f"start it as it is (llmgw server run --data-dir {self.prefix}/data), or "
                f"remove it there first, with `llmgw server remove NAME` here if it had joined"
            )
        for s in self.client.servers():
            if s.get("name") == name and s.get("removed_at") is None:
                raise ServerAddError(
                    f"a control plane named {name} is already part of the cluster: pick "
                    f"another --name, or `llmgw server remove {name}` first"
                )

    def join(self, token: str, leader: str, name: str) -> None:
        a = self.args
        flags = ["--server", leader, "--name", name, "--listen", a.listen]
        flags += ["--agent-port", str(a.agent_port), "--peer-port", str(a.peer_port)]
        for address in a.advertise or [self.host]:
            flags += ["--advertise", address]
        # The store's copy travels in this step: a large one takes a while.
        script = join_script(self.prefix, flags)
        done = self.node.privileged(
            script, what="joining", input=(token + "\n").encode(), timeout=600
        )
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise ServerAddError(f"`llmgw server join` on {self.host} said: {detail}")
        for line in done.stdout.strip().splitlines():
            if not line.startswith("Next:"):  # the next step is this command's
                print(f"    {line}")

    def start(self) -> None:
        p = self.prefix
        script = start_script(p, self.node.use_systemd)
        if self.node.use_systemd:
            self.say("starting the control plane", f" ({UNIT_PATH})")
            done = self.node.privileged(script, what="starting", input=systemd_unit(p).encode())
        else:
            print(f"no systemd on {self.host}: it will not restart on reboot", flush=True)
            self.say("starting the control plane", f" under nohup (log {p}/server.log)")
            done = self.node.privileged(script, what="starting")
        if done.returncode != 0:
            self.show_log = True
            raise ServerAddError(done.stderr or f"exit status {done.returncode}")

    def wait_standby(self, name: str) -> None:
        timeout = float(self.args.timeout)
        self.say("waiting for it to answer", f" as a standby (up to {timeout:.0f}s)")
        deadline = time.monotonic() + timeout
        last = ""
        next_alive_check = time.monotonic() + 5
        while True:
            try:
                listed = self.client.servers()
                it = next((s for s in listed if s.get("name") == name), None)
            except AdminError as exc:
                it, seen = None, f"the leader did not answer: {exc}"
            else:
                seen = "not listed by the leader" if it is None else "not answering yet"
            if it is not None and it.get("answers"):
                seen = str(it.get("role")) + (f" ({it['problem']})" if it.get("problem") else "")
                # The leader asks over the control planes' link, which opens first: /v1's
                # listener may still be to come, or fail to bind.
                if it.get("role") == "standby":
                    if self.listener_answers():
                        print(f"control plane {name} answers as a standby of the leader")
                        return
                    seen = f"standby; its HTTP listener ({self.args.listen}) not answering yet"
            if seen != last:
                print(f"    {name}: {seen}", flush=True)
                last = seen
            now = time.monotonic()
            if now >= deadline:
                self.show_log = True
                raise ServerAddError(
                    f"{name} did not answer as a standby within {timeout:.0f}s (last: {seen})"
                )
            # Without systemd nothing restarts it: stop waiting and say why.
            if not self.node.use_systemd and now >= next_alive_check:
                next_alive_check = now + 5
                if not self.alive():
                    self.show_log = True
                    raise ServerAddError(f"the control plane on {self.host} exited")
            time.sleep(1)

    def keepalived(self, vip: Vip, name: str) -> None:
        self.say("configuring keepalived", f" on {self.host} ({vip.address} on {vip.interface})")
        conf = keepalived_conf(vip, name=name, check_url=local_url(self.args.listen) + "/leader")
        done = self.node.privileged(keepalived_script(), what="keepalived", input=conf.encode())
        if done.returncode != 0:
            raise ServerAddError(f"{done.stderr or done.stdout}".strip())
        print(f"    {keepalived_outcome(done.stdout, self.host)}")

        self.say("keepalived for the leader")
        servers = self.client.servers()
        leader = next((s for s in servers if s.get("role") == "leader"), None)
        if leader is None:
            raise ServerAddError("no control plane answers as the leader now; try again")
        base = urlsplit(self.client.base_url)
        here = _is_loopback(base.hostname or "") and not _is_loopback(self.host)
        url = (self.client.base_url if here else f"http://{leader['api_address']}") + "/leader"
        conf = keepalived_conf(vip, name=str(leader["name"]), check_url=url)
        if here and os.geteuid() == 0:
            local = subprocess.run(
                ["sh", "-c", keepalived_script()], input=conf.encode(), capture_output=True
            )
            if local.returncode == 0:
                print(f"    {keepalived_outcome(local.stdout.decode(), 'this machine')}")
                return
            print(f"    could not write it here: {local.stderr.decode().strip()}")
        print(
            f"    put this in {KEEPALIVED_DIR}/keepalived.conf on the leader's machine "
            f"({leader['name']}, {leader['api_address']}) and restart keepalived there:\n"
        )
        print(conf)

    # --- helpers ----------------------------------------------------------------------

    def listener_answers(self) -> bool:
        script = listener_script(local_url(self.args.listen) + "/leader")
        try:
            done = self.node.privileged(script, what="asking its /leader")
        except NodeAddError:
            return False
        return done.stdout.strip() in ("200", "503")

    def alive(self) -> bool:
        pid_file = shlex.quote(self.prefix + "/server.pid")
        script = f'pid=$(cat {pid_file} 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid"'
        try:
            return self.node.privileged(script, what="checking it").returncode == 0
        except NodeAddError:
            return True  # an ssh hiccup is not its death; the timeout still bounds the wait

    def print_log_tail(self) -> None:
        if self.node.use_systemd:
            script = f"journalctl -u {UNIT_NAME} -n {LOG_TAIL_LINES} --no-pager 2>&1"
        else:
            script = f"tail -n {LOG_TAIL_LINES} {shlex.quote(self.prefix + '/server.log')} 2>&1"
        try:
            result = self.node.privileged(script, what="reading its log")
        except NodeAddError as exc:
            print(f"    (could not read it: {exc})", file=sys.stderr)
            return
        for line in (result.stdout or "(empty)").rstrip().splitlines():
            print(f"    {line}", file=sys.stderr)


def add_server(args: argparse.Namespace, client: AdminClient) -> int:
    """``llmgw server add``: 0 once HOST answers as a standby, 1 with a reason otherwise."""
    if not args.prefix.startswith("/") or not _PREFIX_RE.fullmatch(args.prefix):
        print(
            f"llmgw: --prefix {args.prefix!r}: use an absolute path of plain characters "
            "(letters, digits, . _ + - /)",
            file=sys.stderr,
        )
        return 1
    installer = ServerInstaller(args, client, NodeInstaller(args, client, remote_from_args(args)))
    try:
        return installer.run()
    except (NodeAddError, AdminError) as exc:
        print(f"llmgw: server add {args.host}: {installer.step} failed: {exc}", file=sys.stderr)
        if installer.show_log:
            print(f"its log on {args.host}:", file=sys.stderr)
            installer.print_log_tail()
        return 1
