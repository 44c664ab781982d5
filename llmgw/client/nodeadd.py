"""``llmgw node add HOST``: install and start an agent on a machine over ssh.

Run on (or against) the control plane: it looks at the node over the system ``ssh``
client, copies the zipapp there, writes ``agent.yaml`` with a fresh join token, starts
the agent (a systemd unit where systemd runs, else ``nohup``), runs ``llmgw doctor``
there, and waits until the control plane reports the node Ready.

ssh always runs with ``BatchMode=yes``: this command never asks for a password, so it
works from scripts and fails with a readable reason instead of hanging at a prompt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.client.admin import AdminClient
from llmgw.config import AgentConfig, ConfigError, dump, parse_hostport

UNIT_NAME = "llmgw-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
TOKEN_TTL = 900
MIN_PYTHON = (3, 11)
CONNECT_TIMEOUT = 10
LOG_TAIL_LINES = 40
# The prefix lands unquoted in a systemd unit and in agent.yaml; keeping it to plain
# path characters spares both from quoting rules of their own.
_PREFIX_RE = re.compile(r"[\w./+-]+")
# Compiled modules in the zipapp name the CPython and machine they were built for.
_SO_TAG_RE = re.compile(r"\.cpython-(\d)(\d+)-([a-z0-9_]+)-linux-gnu\.so$")
_SHA256_PY = (
    'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())'
)


class NodeAddError(RuntimeError):
    """A step of ``node add`` failed; the message names it and says what to do."""


@dataclass(frozen=True)
class RemoteResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Remote:
    """How to reach the node with the system ssh client."""

    host: str
    user: str | None = None
    port: int = 22
    key: str | None = None
    options: tuple[str, ...] = ()
    connect_timeout: int = CONNECT_TIMEOUT

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def ssh_argv(self, command: str) -> list[str]:
        argv = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={self.connect_timeout}",
            "-o",
            "StrictHostKeyChecking=accept-new",
            # Keeps "Permanently added ... to the list of known hosts" out of our messages.
            "-o",
            "LogLevel=ERROR",
            "-p",
            str(self.port),
        ]
        if self.key:
            # Only the given key: an agent's many keys can exhaust MaxAuthTries first.
            argv += ["-i", self.key, "-o", "IdentitiesOnly=yes"]
        for option in self.options:
            argv += ["-o", option]
        return [*argv, "--", self.destination, command]

    def login_hint(self) -> str:
        key = f" -i {shlex.quote(self.key)}" if self.key else ""
        return f"ssh -p {self.port}{key} {self.destination} true"

    def run(
        self, script: str, *, what: str, input: bytes | None = None, timeout: float = 60
    ) -> RemoteResult:
        """Run a POSIX shell script on the node; ssh's own failures raise NodeAddError."""
        # The login shell may not be sh (fish, tcsh); hand the script to sh explicitly.
        argv = self.ssh_argv("sh -c " + shlex.quote(script))
        try:
            done = subprocess.run(argv, input=input, capture_output=True, timeout=timeout)
        except FileNotFoundError as exc:
            raise NodeAddError(
                "no `ssh` client on this machine: install OpenSSH's client "
                "(Debian/Ubuntu: apt-get install openssh-client)"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise NodeAddError(
                f"{what} on {self.host}: ssh did not finish within {timeout:.0f}s"
            ) from exc
        stdout = done.stdout.decode(errors="replace")
        stderr = done.stderr.decode(errors="replace").strip()
        # 255 is ssh's own failure (connect, auth, host key), not the remote command's.
        if done.returncode == 255:
            raise NodeAddError(
                f"{what}: ssh to {self.destination} port {self.port} failed: "
                f"{stderr or 'no reason given'}. Check that sshd runs there and that "
                f"`{self.login_hint()}` logs in without a password (--user, --ssh-key, "
                "--ssh-port to change them)"
            )
        return RemoteResult(done.returncode, stdout, stderr)


@dataclass(frozen=True)
class NodeFacts:
    """What ``node add`` needs to know about the node before it installs anything."""

    hostname: str
    uid: int
    machine: str
    python: tuple[int, int] | None
    python_text: str
    systemd: bool
    sudo: bool
    # The python3 a systemd unit's `/usr/bin/env python3` finds, which need not be the
    # one an ssh login finds (pyenv, conda and modules change only the login's PATH).
    unit_python: tuple[int, int] | None = None
    unit_python_text: str = ""


# systemd's default PATH for services.
UNIT_PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE_SCRIPT = f"""\
version='import sys; print("%d.%d.%d" % sys.version_info[:3])'
echo "uid=$(id -u)"
echo "hostname=$(hostname -s 2>/dev/null || hostname)"
echo "machine=$(uname -m)"
if command -v python3 >/dev/null 2>&1; then
  echo "python=$(python3 -c "$version" 2>&1)"
else
  echo "python="
fi
if [ -d /run/systemd/system ] && systemctl show --property=Version >/dev/null 2>&1; then
  echo "systemd=yes"
  echo "unit_python=$(PATH={UNIT_PATH_ENV} python3 -c "$version" 2>&1)"
else
  echo "systemd=no"
fi
if [ "$(id -u)" != 0 ] && sudo -n true >/dev/null 2>&1; then
  echo "sudo=yes"
else
  echo "sudo=no"
fi
"""


def parse_probe(output: str) -> NodeFacts:
    values: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    uid = values.get("uid", "")
    return NodeFacts(
        hostname=values.get("hostname", "").split(".")[0],
        uid=int(uid) if uid.isdigit() else -1,
        machine=values.get("machine", ""),
        python=_version(values.get("python", "")),
        python_text=values.get("python", ""),
        systemd=values.get("systemd") == "yes",
        sudo=values.get("sudo") == "yes",
        unit_python=_version(values.get("unit_python", "")),
        unit_python_text=values.get("unit_python", ""),
    )


def _version(text: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"(\d+)\.(\d+)\.\d+\S*", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_zipapp(explicit: str | None, argv0: str | None = None) -> Path:
    """The llmgw.pyz to copy: --zipapp, the one running, or the repository's dist/."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise NodeAddError(f"--zipapp {explicit}: no such file")
        return path
    argv0 = sys.argv[0] if argv0 is None else argv0
    if Path(argv0).is_file() and (argv0.endswith(".pyz") or _is_zipapp(Path(argv0))):
        return Path(argv0).resolve()
    built = Path(__file__).resolve().parents[2] / "dist" / "llmgw.pyz"
    if built.is_file():
        return built
    raise NodeAddError(
        f"no llmgw.pyz to copy to the node: run `make zipapp` (it builds {built}), "
        "or pass --zipapp PATH"
    )


def _is_zipapp(path: Path) -> bool:
    """A shiv zipapp under any name (installed as /usr/local/bin/llmgw, say)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return "environment.json" in zf.namelist() and "__main__.py" in zf.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def compiled_for(pyz: Path) -> tuple[tuple[int, int], str] | None:
    """The CPython version and machine the zipapp's compiled modules need, if any."""
    try:
        with zipfile.ZipFile(pyz) as zf:
            names = zf.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise NodeAddError(f"{pyz} is not a zipapp ({exc}); rebuild it with `make zipapp`") from exc
    for name in names:
        m = _SO_TAG_RE.search(name)
        if m:
            return (int(m.group(1)), int(m.group(2))), m.group(3)
    return None


def check_node(
    facts: NodeFacts,
    host: str,
    needs: tuple[tuple[int, int], str] | None,
    systemd: bool = False,
) -> None:
    """Refuse a node the zipapp cannot run on, saying what to install."""
    python, text = (
        (facts.unit_python, facts.unit_python_text)
        if systemd
        else (
            facts.python,
            facts.python_text,
        )
    )
    where = f"{host} (on systemd's PATH, {UNIT_PATH_ENV})" if systemd else host
    if python is None:
        found = f" (python3 said: {text})" if text else ""
        raise NodeAddError(
            f"{where} has no working python3{found}: install Python "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer there "
            "(Debian/Ubuntu: apt-get install python3)"
        )
    if python < MIN_PYTHON:
        raise NodeAddError(
            f"{where} has Python {text}; llmgw needs "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer: install it there as python3"
        )
    if needs is None:
        return
    (major, minor), machine = needs
    if python != (major, minor) or (facts.machine and facts.machine != machine):
        raise NodeAddError(
            f"the zipapp's compiled modules are for CPython {major}.{minor} on {machine}, but "
            f"{where} has Python {text} on {facts.machine or 'an unknown machine'}:"
            f" build a zipapp with a matching Python (`make zipapp PYTHON=python{major}.{minor}`"
            " on such a machine) and pass it with --zipapp"
        )


def agent_yaml(server: str, token: str, node_id: str, prefix: str) -> str:
    config = AgentConfig(server=server, token=token, node_id=node_id, state_dir=f"{prefix}/state")
    return "# written by `llmgw node add`; the token is used once, to enroll\n" + dump(config)


def systemd_unit(prefix: str) -> str:
    return f"""\
[Unit]
Description=llmgw node agent
After=network-online.target
Wants=network-online.target

[Service]
# shiv unpacks the zipapp here instead of in root's home.
Environment=SHIV_ROOT={prefix}/.shiv
ExecStart=/usr/bin/env python3 {prefix}/llmgw.pyz agent run --config {prefix}/agent.yaml
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def stop_previous(prefix: str, name: str = "agent", tenths: int = 50) -> str:
    """Shell that stops what an earlier nohup start left running (its pid in
    PREFIX/NAME.pid), waiting up to ``tenths`` tenths of a second for it to go."""
    pid_file = shlex.quote(f"{prefix}/{name}.pid")
    # The cmdline check keeps a stale pid file from killing whatever reused the pid.
    return f"""\
if [ -f {pid_file} ]; then
  pid=$(cat {pid_file})
  if [ -n "$pid" ] && grep -q llmgw.pyz /proc/"$pid"/cmdline 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt {tenths} ]; do sleep 0.1; i=$((i + 1)); done
  fi
  rm -f {pid_file}
fi
"""


def copy_script(prefix: str, digest: str) -> str:
    """Shell that takes the zipapp on stdin and puts it at PREFIX/llmgw.pyz."""
    q = shlex.quote
    # Written beside the old one and renamed, so a running agent never sees half a file;
    # the digest check catches a copy cut short.
    return f"""\
set -e
mkdir -p {q(prefix)} {q(prefix + "/state")}
chmod 700 {q(prefix + "/state")}
cd {q(prefix)}
cat > llmgw.pyz.new
got=$(python3 -c {q(_SHA256_PY)} llmgw.pyz.new)
if [ "$got" != {q(digest)} ]; then
  rm -f llmgw.pyz.new
  echo "the copy arrived damaged (sha256 $got)" >&2
  exit 3
fi
chmod 755 llmgw.pyz.new
mv -f llmgw.pyz.new llmgw.pyz
"""


def config_script(prefix: str) -> str:
    """Shell that takes agent.yaml on stdin; umask first, as the file holds the token."""
    q = shlex.quote
    return f"""\
set -e
umask 077
cat > {q(prefix + "/agent.yaml.new")}
mv -f {q(prefix + "/agent.yaml.new")} {q(prefix + "/agent.yaml")}
"""


def start_script(prefix: str, systemd: bool) -> str:
    """Shell that (re)starts the agent: the unit (read on stdin) or a nohup'd process."""
    return launch_script(
        prefix,
        systemd,
        UNIT_NAME,
        UNIT_PATH,
        "agent",
        ["agent", "run", "--config", f"{prefix}/agent.yaml"],
    )


def launch_script(
    prefix: str,
    systemd: bool,
    unit_name: str,
    unit_path: str,
    name: str,
    argv: list[str],
    tenths: int = 50,
) -> str:
    """Shell that (re)starts ``llmgw.pyz ARGV`` under PREFIX: its systemd unit (read on
    stdin) where systemd runs, else nohup'd with NAME.log and NAME.pid."""
    q = shlex.quote
    stop = stop_previous(prefix, name, tenths)
    if systemd:
        return f"""\
set -e
{stop}
cat > {unit_path}.new
mv -f {unit_path}.new {unit_path}
systemctl daemon-reload
systemctl enable --quiet {unit_name}
systemctl restart {unit_name}
"""
    # nohup and every stream redirected: the process outlives the ssh session, and ssh
    # returns at once instead of waiting on a descriptor it holds open.
    args = " ".join(q(a) for a in argv)
    return f"""\
set -e
{stop}
cd {q(prefix)}
SHIV_ROOT={q(prefix + "/.shiv")} nohup python3 {q(prefix + "/llmgw.pyz")} {args} \\
  >> {name}.log 2>&1 < /dev/null &
echo $! > {name}.pid
"""


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
        pyz = find_zipapp(self.args.zipapp)
        needs = compiled_for(pyz)
        _step(f"looking at {self.remote.destination} over ssh (port {self.remote.port})")
        facts = self.probe()
        check_node(facts, self.host, needs, systemd=self.use_systemd)
        node_id = self.args.node_id or facts.hostname
        if not node_id:
            raise NodeAddError(f"{self.host} did not say its hostname: pass --node-id NAME")
        python = facts.unit_python_text if self.use_systemd else facts.python_text
        print(f"    node id {node_id}, Python {python}, {facts.machine}")

        _step("asking the control plane for a join token")
        answer = self.client.post("/api/v1/tokens", {"ttl_seconds": TOKEN_TTL})
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

    def control_plane(self, token_answer: dict[str, Any]) -> str:
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
            node = next(
                (n for n in self.client.get("/api/v1/nodes") if n.get("id") == node_id), None
            )
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


def remote_from_args(args: argparse.Namespace) -> Remote:
    options: Sequence[str] = getattr(args, "ssh_option", None) or ()
    return Remote(
        host=args.host,
        user=args.user,
        port=args.ssh_port,
        key=args.ssh_key,
        options=tuple(options),
    )


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
