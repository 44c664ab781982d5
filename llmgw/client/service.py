"""``llmgw service status|start|stop|restart``: this machine's llmgw processes, as
``node add`` and ``server add`` installed them.

Where systemd runs (``/run/systemd/system``), each is its unit, ``llmgw-agent.service``
or ``llmgw-server.service``, and ``systemctl`` does the work. Elsewhere each is the
nohup'd process of an install under ``--prefix`` (default /opt/llmgw), its pid in
PREFIX/agent.pid or PREFIX/server.pid: stopped as ``node add`` stops it and started
with the very shell ``node add`` and ``server add`` start it with (``remote.py``'s
``launch_script``, the command line from ``agent_argv`` and ``server_argv``).

A unit is ``active`` (running: its pid, and since when), ``inactive`` (installed, not
running) or ``absent`` (not installed here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

import psutil

from llmgw.cliargs import UsageError
from llmgw.client import Subcommands, nodeadd, serveradd
from llmgw.client.remote import launch_script, stop_previous

Role = Literal["server", "agent"]
UnitState = Literal["active", "inactive", "absent"]
Manager = Literal["systemd", "nohup"]

# Where a running systemd says it runs (as the node add probe asks too).
SYSTEMD_RUNS = Path("/run/systemd/system")
# The nohup'd agent gets as long to stop as node add gives it; the control plane longer.
AGENT_STOP_TENTHS = 50
# How long a started process may take to be llmgw (the shell forks, then execs it).
START_WAIT = 10.0
# Started last and stopped first: an agent without its control plane only waits.
ORDER: tuple[Role, ...] = ("server", "agent")


class UnitJson(TypedDict):
    """A unit of this machine as ``service status --json`` says it; ``since`` epoch
    seconds the process started, null when not running."""

    role: Role
    unit: str
    manager: Manager
    state: UnitState
    pid: int | None
    since: float | None
    # Where its output goes: the journal, or PREFIX/NAME.log.
    log: str


@dataclass(frozen=True)
class Unit:
    role: Role
    prefix: str

    @property
    def unit_name(self) -> str:
        return nodeadd.UNIT_NAME if self.role == "agent" else serveradd.UNIT_NAME

    @property
    def unit_path(self) -> str:
        return nodeadd.UNIT_PATH if self.role == "agent" else serveradd.UNIT_PATH

    @property
    def argv(self) -> list[str]:
        if self.role == "agent":
            return nodeadd.agent_argv(self.prefix)
        return serveradd.server_argv(self.prefix)

    @property
    def tenths(self) -> int:
        return AGENT_STOP_TENTHS if self.role == "agent" else serveradd.STOP_TENTHS

    @property
    def pid_file(self) -> Path:
        return Path(self.prefix) / f"{self.role}.pid"

    def installed(self) -> bool:
        """An install of this role under the prefix: the zipapp and its config."""
        root = Path(self.prefix)
        config = root / ("agent.yaml" if self.role == "agent" else "data")
        return (root / "llmgw.pyz").exists() and config.exists()


def systemd_runs() -> bool:
    return SYSTEMD_RUNS.is_dir()


def _since(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _ours(pid: int) -> bool:
    """The pid is an llmgw zipapp's (as the stop shell checks): not a reused pid."""
    try:
        return any(part.endswith("llmgw.pyz") for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _became_python(pid: int) -> bool:
    """The process a start forked has exec'd the zipapp's python: no longer the shell or
    ``nohup`` whose command line already names llmgw.pyz, and past the exec, while which
    its command line can read empty (and the unit inactive)."""
    if pid <= 0:
        return False
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return bool(cmdline) and Path(cmdline[0]).name not in ("sh", "nohup") and _ours(pid)


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["systemctl", *args], capture_output=True, text=True, timeout=120, check=False
        )
    except FileNotFoundError:
        raise UsageError("systemd runs here but systemctl is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"systemctl {' '.join(args)} did not finish in 120 s") from None


def _shown(text: str) -> dict[str, str]:
    """``systemctl show``'s KEY=VALUE lines."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _pid_in(unit: Unit) -> int:
    """The pid in the unit's pid file; 0 when there is none."""
    try:
        return int(unit.pid_file.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def status_of(unit: Unit, systemd: bool) -> UnitJson:
    if systemd:
        shown = _shown(
            _systemctl("show", "--property=LoadState,ActiveState,MainPID", unit.unit_name).stdout
        )
        loaded = shown.get("LoadState", "not-found") not in ("not-found", "")
        pid = int(shown.get("MainPID") or 0) or None
        active = loaded and shown.get("ActiveState") in ("active", "reloading", "activating")
        return {
            "role": unit.role,
            "unit": unit.unit_name,
            "manager": "systemd",
            "state": "active" if active else "inactive" if loaded else "absent",
            "pid": pid if active else None,
            "since": _since(pid) if active and pid else None,
            "log": f"journalctl -u {unit.unit_name}",
        }
    pid = _pid_in(unit) or None
    running = pid is not None and _ours(pid)
    state: UnitState = "active" if running else "inactive" if unit.installed() or pid else "absent"
    return {
        "role": unit.role,
        "unit": str(unit.pid_file),
        "manager": "nohup",
        "state": state,
        "pid": pid if running else None,
        "since": _since(pid) if running and pid else None,
        "log": f"{unit.prefix}/{unit.role}.log",
    }


def _shell(script: str, what: str) -> None:
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise UsageError(f"{what}: {said}")


def act(unit: Unit, action: str, systemd: bool) -> None:
    """``start``, ``stop`` or ``restart`` one unit."""
    if systemd:
        done = _systemctl(action, unit.unit_name)
        if done.returncode != 0:
            said = done.stderr.strip() or f"exit status {done.returncode}"
            raise UsageError(f"systemctl {action} {unit.unit_name}: {said}")
        return
    if action == "stop":
        _shell(stop_previous(unit.prefix, unit.role, unit.tenths), f"stopping the {unit.role}")
        return
    if action == "start" and status_of(unit, systemd=False)["state"] == "active":
        return  # running already: a start changes nothing
    # The install's own start: it stops what a pid file names first, so this restarts too.
    script = launch_script(
        unit.prefix, False, unit.unit_name, unit.unit_path, unit.role, unit.argv, unit.tenths
    )
    _shell(script, f"starting the {unit.role}")
    # The shell has forked the process but it may not have become llmgw yet (the fork is
    # a shell until nohup and python3 exec): said started only once it is.
    deadline = time.monotonic() + START_WAIT
    while not _became_python(_pid_in(unit)):
        if time.monotonic() > deadline:
            raise UsageError(
                f"the {unit.role} did not start within {START_WAIT:.0f}s: see "
                f"{unit.prefix}/{unit.role}.log"
            )
        time.sleep(0.1)


def line(u: UnitJson) -> str:
    text = f"{u['role']:<7} {u['unit']}: {u['state']}"
    if u["pid"] is not None:
        text += f", pid {u['pid']}"
    if u["since"] is not None:
        from datetime import datetime

        text += f", since {datetime.fromtimestamp(u['since']).isoformat(' ', 'seconds')}"
    return text + (f" (log: {u['log']})" if u["state"] != "absent" else "")


def run(args: argparse.Namespace) -> int:
    systemd = systemd_runs()
    roles: Sequence[Role] = (args.role,) if args.role else ORDER
    units = [Unit(role, args.prefix.rstrip("/") or "/") for role in roles]
    if args.action != "status":
        present = [u for u in units if status_of(u, systemd)["state"] != "absent"]
        if not present:
            where = "systemd" if systemd else f"{args.prefix} (--prefix)"
            raise UsageError(
                f"no llmgw {' or '.join(roles)} is installed here ({where}); "
                "`llmgw node add` or `llmgw server add` installs one"
            )
        # Stopped agent first; started control plane first.
        for unit in reversed(present) if args.action == "stop" else present:
            act(unit, args.action, systemd)
    shown = [status_of(u, systemd) for u in units]
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        for u in shown:
            print(line(u))
    return 0


def add_parsers(roles: Subcommands) -> None:
    p = roles.add_parser(
        "service", help="this machine's llmgw processes: status, start, stop, restart"
    )
    p.add_argument("action", choices=("status", "start", "stop", "restart"))
    p.add_argument("--role", choices=("server", "agent"), help="one of them (default: both)")
    p.add_argument(
        "--prefix",
        default="/opt/llmgw",
        help="where node add or server add installed llmgw, without systemd (default /opt/llmgw)",
    )
    p.add_argument("--json", action="store_true", help="print each unit as JSON")
    p.set_defaults(handler=run)
