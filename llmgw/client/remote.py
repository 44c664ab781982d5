"""A machine reached over the system ``ssh`` client, and the shell that ``node add`` and
``server add`` run there.

``Remote`` runs a POSIX shell script on the machine. The probe (``PROBE_SCRIPT``, read into
``NodeFacts``) says what the machine has, and ``check_node`` refuses one the zipapp cannot
run on. The scripts copy the zipapp (checked by SHA-256), write a file that holds a token,
and (re)start ``llmgw.pyz`` under a systemd unit or ``nohup``.

ssh always runs with ``BatchMode=yes``: these commands never ask for a password, so they
work from scripts and fail with a readable reason instead of hanging at a prompt.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MIN_PYTHON = (3, 11)
CONNECT_TIMEOUT = 10
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


def stop_previous(prefix: str, name: str = "agent", tenths: int = 50) -> str:
    """Shell that stops what an earlier nohup start left running (its pid in
    PREFIX/NAME.pid): SIGTERM, up to ``tenths`` tenths of a second for it to go, then
    SIGKILL, so a new start never runs beside an old process that was slow to leave (an
    agent's engines are adopted by the next agent either way)."""
    pid_file = shlex.quote(f"{prefix}/{name}.pid")
    # The cmdline check keeps a stale pid file from killing whatever reused the pid.
    return f"""\
if [ -f {pid_file} ]; then
  pid=$(cat {pid_file})
  if [ -n "$pid" ] && grep -q llmgw.pyz /proc/"$pid"/cmdline 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    i=0
    while grep -q llmgw.pyz /proc/"$pid"/cmdline 2>/dev/null && [ $i -lt {tenths} ]; do
      sleep 0.1; i=$((i + 1))
    done
    if grep -q llmgw.pyz /proc/"$pid"/cmdline 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
      i=0
      while grep -q llmgw.pyz /proc/"$pid"/cmdline 2>/dev/null && [ $i -lt 50 ]; do
        sleep 0.1; i=$((i + 1))
      done
    fi
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


def remote_from_args(args: argparse.Namespace) -> Remote:
    options: Sequence[str] = getattr(args, "ssh_option", None) or ()
    return Remote(
        host=args.host,
        user=args.user,
        port=args.ssh_port,
        key=args.ssh_key,
        options=tuple(options),
    )
