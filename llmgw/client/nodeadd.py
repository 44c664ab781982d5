"""``llmgw node add HOST``: install and start an agent on a machine over ssh.

Run on (or against) the control plane: it looks at the node over the system ``ssh``
client, copies there the llmgw release the control plane names, fetched and checked here
(``zipappsource``; or ``--zipapp``'s file as it is), writes ``agent.yaml`` with a fresh
join token, starts the agent (a systemd unit where systemd runs, else ``nohup``), runs
``llmgw doctor`` there, and waits until the control plane reports the node Ready.

The ssh side (``Remote``, the node's probe, the copy and start scripts) is in
``llmgw.client.remote``, shared with ``server add``; here are the agent's own files and
the steps in order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmgw.client.admin import AdminClient
from llmgw.client.remote import (
    PROBE_SCRIPT,
    NodeAddError,
    NodeFacts,
    Remote,
    RemoteResult,
    config_script,
    copy_script,
    launch_script,
    parse_probe,
    remote_from_args,
)
from llmgw.client.zipappsource import explicit_zipapp, zipapp_for
from llmgw.config import AgentConfig, ConfigError, dump, parse_hostport
from llmgw.wire.admin import TokenJson

UNIT_NAME = "llmgw-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
TOKEN_TTL = 900
LOG_TAIL_LINES = 40
# The prefix lands unquoted in a systemd unit and in agent.yaml; keeping it to plain
# path characters spares both from quoting rules of their own.
_PREFIX_RE = re.compile(r"[\w./+-]+")


def agent_yaml(server: str, token: str, node_id: str, prefix: str) -> str:
    config = AgentConfig(server=server, token=token, node_id=node_id, state_dir=f"{prefix}/state")
    return "# written by `llmgw node add`; the token is used once, to enroll\n" + dump(config)


def agent_argv(prefix: str) -> list[str]:
    """The agent's command line as installed under ``prefix`` (``llmgw service`` starts
    it the same way)."""
    return ["agent", "run", "--config", f"{prefix}/agent.yaml"]


def systemd_unit(prefix: str) -> str:
    return f"""\
[Unit]
Description=llmgw node agent
After=network-online.target
Wants=network-online.target

[Service]
# shiv unpacks the zipapp here instead of in root's home.
Environment=SHIV_ROOT={prefix}/.shiv
ExecStart=/usr/bin/env python3 {prefix}/llmgw.pyz {" ".join(agent_argv(prefix))}
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def start_script(prefix: str, systemd: bool) -> str:
    """Shell that (re)starts the agent: the unit (read on stdin) or a nohup'd process."""
    return launch_script(prefix, systemd, UNIT_NAME, UNIT_PATH, "agent", agent_argv(prefix))


def _step(message: str) -> None:
    print(f"==> {message}", flush=True)


class NodeInstaller:
    """The steps of one ``node add``, in order; each raises NodeAddError with its fix."""

    def __init__(self, args: argparse.Namespace, client: AdminClient, remote: Remote) -> None:
        self.args = args
        self.client = client
        self.remote = remote
        self.host = remote.host
        self.prefix: str = args.prefix
        self.use_systemd = False
        self.sudo = ""

    def run(self) -> int:
        explicit = explicit_zipapp(self.args)
        _step(f"looking at {self.remote.destination} over ssh (port {self.remote.port})")
        facts = self.probe()
        with tempfile.TemporaryDirectory(prefix="llmgw-release-") as fetched:
            pyz = zipapp_for(
                self.args,
                self.client,
                facts,
                self.host,
                systemd=self.use_systemd,
                into=Path(fetched),
                explicit=explicit,
            )
            return self.install(facts, pyz)

    def install(self, facts: NodeFacts, pyz: Path) -> int:
        node_id = self.args.node_id or facts.hostname
        if not node_id:
            raise NodeAddError(f"{self.host} did not say its hostname: pass --node-id NAME")
        python = facts.unit_python_text if self.use_systemd else facts.python_text
        print(f"    node id {node_id}, Python {python}, {facts.machine}")

        _step("asking the control plane for a join token")
        answer = self.client.node_token(TOKEN_TTL)
        server = self.control_plane(answer)

        _step(f"copying {pyz} to {self.host}:{self.prefix}/llmgw.pyz")
        self.copy(pyz)
        _step(f"writing {self.prefix}/agent.yaml (control plane {server})")
        self.write_config(agent_yaml(server, str(answer["token"]), node_id, self.prefix))
        self.start()
        self.doctor()
        return self.wait_ready(node_id)

    # --- steps ------------------------------------------------------------------------

    def probe(self) -> NodeFacts:
        result = self.remote.run(PROBE_SCRIPT, what="looking at the node")
        facts = parse_probe(result.stdout)
        if facts.uid < 0:
            raise NodeAddError(
                f"could not read {self.host}'s facts over ssh: {result.stderr or result.stdout}"
            )
        privileged = facts.uid == 0 or facts.sudo
        self.sudo = "sudo -n " if facts.uid != 0 and facts.sudo else ""
        self.use_systemd = facts.systemd and privileged
        if facts.systemd and not privileged:
            print(
                f"    {self.remote.destination} is not root and has no password-less sudo: "
                "cannot install a systemd unit"
            )
        return facts

    def control_plane(self, token_answer: TokenJson) -> str:
        address = self.args.control_plane
        if not address:
            addresses = token_answer.get("addresses") or []
            if not addresses:
                raise NodeAddError(
                    "the control plane advertises no address for nodes: pass "
                    "--control-plane HOST:PORT (its --listen address as the node reaches it)"
                )
            address = str(addresses[0])
        try:
            parse_hostport(address)
        except ConfigError as exc:
            raise NodeAddError(f"--control-plane: {exc}") from exc
        return str(address)

    def privileged(self, script: str, *, what: str, **kw: Any) -> RemoteResult:
        command = f"{self.sudo}sh -c {shlex.quote(script)}" if self.sudo else script
        return self.remote.run(command, what=what, **kw)

    def copy(self, pyz: Path) -> None:
        data = pyz.read_bytes()
        script = copy_script(self.prefix, hashlib.sha256(data).hexdigest())
        result = self.privileged(script, what="copying the zipapp", input=data, timeout=600)
        if result.returncode != 0:
            raise NodeAddError(
                f"copying the zipapp to {self.host}:{self.prefix} failed: "
                f"{result.stderr or 'exit status ' + str(result.returncode)}. Check that "
                f"{self.remote.destination} may write there (root, or password-less sudo) and "
                "that the disk has room, or pick another --prefix"
            )

    def write_config(self, text: str) -> None:
        script = config_script(self.prefix)
        result = self.privileged(script, what="writing agent.yaml", input=text.encode())
        if result.returncode != 0:
            raise NodeAddError(
                f"writing {self.host}:{self.prefix}/agent.yaml failed: {result.stderr}"
            )

    def start(self) -> None:
        p = self.prefix
        script = start_script(p, self.use_systemd)
        if self.use_systemd:
            _step(f"installing {UNIT_PATH} and starting it")
            unit = systemd_unit(p).encode()
            result = self.privileged(script, what="starting the agent", input=unit)
        else:
            print(
                f"no systemd on {self.host}: starting the agent under nohup; "
                "it will not restart on reboot",
                flush=True,
            )
            _step(f"starting the agent (log {p}/agent.log, pid in {p}/agent.pid)")
            result = self.privileged(script, what="starting the agent")
        if result.returncode != 0:
            raise NodeAddError(f"starting the agent on {self.host} failed: {result.stderr}")

    def doctor(self) -> None:
        _step(f"running `llmgw doctor` on {self.host}")
        p = self.prefix
        q = shlex.quote
        script = (
            f"cd {q(p)} && SHIV_ROOT={q(p + '/.shiv')} python3 llmgw.pyz doctor --json "
            f"--state-dir {q(p + '/state')}"
        )
        try:
            result = self.privileged(script, what="running doctor", timeout=180)
        except NodeAddError as exc:
            print(f"    doctor could not run ({exc}); carrying on")
            return
        for line in doctor_report(result):
            print(f"    {line}")

    def wait_ready(self, node_id: str) -> int:
        timeout = float(self.args.timeout)
        _step(f"waiting up to {timeout:.0f}s for node {node_id} to be Ready")
        deadline = time.monotonic() + timeout
        last = ""
        next_alive_check = time.monotonic() + 5
        while True:
            node = next((n for n in self.client.nodes() if n.get("id") == node_id), None)
            if node is None:
                seen = "not enrolled yet"
            else:
                state = str(node.get("state"))
                seen = state + (f" ({node['reason']})" if node.get("reason") else "")
                if state == "Ready" and node.get("connected", True):
                    print(f"node {node_id} is Ready (llmgw {node.get('version') or '?'})")
                    return 0
            if seen != last:
                print(f"    {node_id}: {seen}", flush=True)
                last = seen
            now = time.monotonic()
            if now >= deadline:
                print(
                    f"llmgw: node {node_id} was not Ready within {timeout:.0f}s "
                    f"(last seen: {seen}); the agent's log on {self.host}:",
                    file=sys.stderr,
                )
                self.print_log_tail()
                return 1
            # Without systemd nothing restarts a dead agent: stop waiting and say why.
            if not self.use_systemd and now >= next_alive_check:
                next_alive_check = now + 5
                if not self.agent_alive():
                    print(f"llmgw: the agent on {self.host} exited; its log:", file=sys.stderr)
                    self.print_log_tail()
                    return 1
            time.sleep(1)

    # --- helpers ----------------------------------------------------------------------

    def agent_alive(self) -> bool:
        pid_file = shlex.quote(self.prefix + "/agent.pid")
        script = f'pid=$(cat {pid_file} 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid"'
        try:
            return self.privileged(script, what="checking the agent").returncode == 0
        except NodeAddError:
            # ssh hiccups are not the agent's death; the timeout still bounds the wait.
            return True

    def print_log_tail(self) -> None:
        if self.use_systemd:
            script = f"journalctl -u {UNIT_NAME} -n {LOG_TAIL_LINES} --no-pager 2>&1"
        else:
            log_path = shlex.quote(self.prefix + "/agent.log")
            script = f"tail -n {LOG_TAIL_LINES} {log_path} 2>&1"
        try:
            result = self.privileged(script, what="reading the agent's log")
        except NodeAddError as exc:
            print(f"    (could not read it: {exc})", file=sys.stderr)
            return
        for line in (result.stdout or "(empty)").rstrip().splitlines():
            print(f"    {line}", file=sys.stderr)


def doctor_report(result: RemoteResult) -> list[str]:
    """Lines to show from ``llmgw doctor``: its warnings and failures, or why it failed."""
    try:
        checks = json.loads(result.stdout)
    except ValueError:
        checks = None
    if isinstance(checks, dict):
        checks = checks.get("checks")
    if isinstance(checks, list) and all(isinstance(c, dict) for c in checks):
        lines = []
        for c in checks:
            if c.get("status", "ok") == "ok":
                continue
            detail = c.get("detail") or c.get("message") or ""
            line = f"{str(c.get('status')).upper()} {c.get('name', '?')}: {detail}"
            if c.get("fix"):
                line += f" (fix: {c['fix']})"
            lines.append(line)
        return lines or [f"doctor: all {len(checks)} checks passed"]
    if result.returncode == 0:
        return [line for line in result.stdout.strip().splitlines()] or ["doctor: no output"]
    detail = (result.stderr or result.stdout).strip().splitlines()
    reason = detail[-1] if detail else f"exit status {result.returncode}"
    return [f"doctor did not run cleanly ({reason}); carrying on"]


def add_node(args: argparse.Namespace, client: AdminClient) -> int:
    """``llmgw node add``: 0 once the node is Ready, 1 with a reason otherwise."""
    if not args.prefix.startswith("/") or not _PREFIX_RE.fullmatch(args.prefix):
        print(
            f"llmgw: --prefix {args.prefix!r}: use an absolute path of plain characters "
            "(letters, digits, . _ + - /)",
            file=sys.stderr,
        )
        return 1
    try:
        return NodeInstaller(args, client, remote_from_args(args)).run()
    except NodeAddError as exc:
        print(f"llmgw: node add {args.host}: {exc}", file=sys.stderr)
        return 1
