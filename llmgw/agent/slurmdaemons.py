"""Starting and stopping the daemons of a node's Slurm part (munged, slurmctld, slurmd),
and remembering which of them this agent started.

Where systemd runs the machine, a daemon is its packaged unit: slurmctld and slurmd get
a drop-in (``/etc/systemd/system/UNIT.service.d/llmgw.conf``) whose ExecStart runs them
on llmgw's files (slurmctld) or configless (slurmd), and are enabled and started; munge
is enabled and started as packaged. Elsewhere (a container, a bare image) each is
started directly in a session of its own, its output in Slurm's log directory, and
left running when the agent stops or starts again, as engines are.

What this agent started is kept in ``STATE/slurm/started.json`` (the pid, and the
command line or the drop-in), so an agent started again in between still knows: a pid
counts as ours only while ``/proc/PID/cmdline`` is still that program. A daemon the
agent did not start (an administrator's) is never stopped, restarted or replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

from llmgw.agent import command
from llmgw.agent.command import Finished

log = logging.getLogger("llmgw.agent.slurm")

Daemon = Literal["munge", "slurmctld", "slurmd"]
DAEMONS: tuple[Daemon, ...] = ("munge", "slurmctld", "slurmd")
# The program each daemon runs as (its /proc/PID/comm).
PROGRAM: dict[Daemon, str] = {"munge": "munged", "slurmctld": "slurmctld", "slurmd": "slurmd"}
SYSTEMD_DIR = Path("/etc/systemd/system")
DROPIN_NAME = "llmgw.conf"
SHORT = 30.0  # systemctl, scontrol, munge: a command that should answer at once
STOP_GRACE = 10.0


class Machine(Protocol):
    """What the Slurm part does to the machine: commands, daemons, processes. The real
    one is ``LocalMachine``; unit tests give a recording fake."""

    async def run(
        self, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> Finished: ...

    async def spawn(self, argv: Sequence[str], log_file: Path) -> int: ...

    def pids(self, program: str) -> list[int]: ...

    def cmdline(self, pid: int) -> list[str] | None: ...

    def steps(self, spool: Path, name: str) -> int | None: ...

    async def kill(self, pid: int, program: str) -> None: ...

    async def reach(self, host: str, port: int) -> str | None: ...


def _zombie(stat: str) -> bool:
    # /proc/PID/stat: "pid (comm) S ..."; the state follows the last ")".
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


class LocalMachine:
    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc

    async def run(
        self, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> Finished:
        return await command.run(argv, timeout, env=env)

    async def spawn(self, argv: Sequence[str], log_file: Path) -> int:
        """Start ``argv`` in a session of its own, not a child of the agent (so it is
        neither killed nor left a zombie by the agent's going); its pid."""
        line = shlex.join(argv)
        script = f"{line} >>{shlex.quote(str(log_file))} 2>&1 </dev/null & echo $!"
        done = await command.run(["setsid", "sh", "-c", script], SHORT, stderr="apart")
        pid = done.out.strip()
        if done.code != 0 or not pid.isdigit():
            raise OSError(f"{argv[0]} could not be started: {done.err.strip() or done.out}")
        return int(pid)

    def pids(self, program: str) -> list[int]:
        found: list[int] = []
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                comm = (entry / "comm").read_text().strip()
                # slurmctld's helper (": slurmscriptd") keeps its comm, not its command
                # line; slurmstepd names itself "slurmstepd: [1.batch]"; a zombie has none.
                line = self.cmdline(int(entry.name))
                if comm == program and line and Path(line[0]).name.startswith(program):
                    found.append(int(entry.name))
            except OSError:
                continue
        return sorted(found)

    def steps(self, spool: Path, name: str) -> int | None:
        """The job steps node ``name``'s slurmd runs here: each step's slurmstepd
        listens on ``<spool>/<name>_<job>.<step>``, as slurmd itself finds them; a
        socket nothing answers on is a step that ended without cleaning up. None when
        the spool cannot be read. (Counting slurmstepd processes would count the steps
        of another slurmd on the machine, and strays no slurmd owns any more.)"""
        try:
            entries = list(spool.glob(f"{name}_*.*"))
        except OSError:
            return None
        alive = 0
        for entry in entries:
            try:
                if not stat.S_ISSOCK(entry.stat().st_mode):
                    continue
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.settimeout(1.0)
                    probe.connect(str(entry))
                alive += 1
            except OSError:
                continue
        return alive

    def cmdline(self, pid: int) -> list[str] | None:
        try:
            raw = (self.proc / str(pid) / "cmdline").read_bytes()
            if _zombie((self.proc / str(pid) / "stat").read_text()):
                return None
        except OSError:
            return None
        return [part.decode(errors="replace") for part in raw.split(b"\0") if part] or None

    async def reach(self, host: str, port: int) -> str | None:
        """None when ``host:port`` takes a TCP connection within 3 s; else why not."""
        try:
            async with asyncio.timeout(3.0):
                _, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            return str(exc) or type(exc).__name__
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None

    async def kill(self, pid: int, program: str) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE; returns once it is gone."""
        sig = signal.SIGTERM
        deadline = time.monotonic() + STOP_GRACE
        while self.cmdline(pid) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if time.monotonic() > deadline:
                sig = signal.SIGKILL
            await asyncio.sleep(0.1)


@dataclass(frozen=True)
class Started:
    """A daemon this agent started: directly (``pid``, ``argv``) or as a systemd unit
    (``dropin``: the file written, None for a unit run as packaged)."""

    how: Literal["direct", "systemd"]
    argv: list[str]
    pid: int | None = None
    dropin: str | None = None


def is_program(cmdline: list[str] | None, program: str) -> bool:
    return cmdline is not None and len(cmdline) > 0 and Path(cmdline[0]).name == program


def node_name(argv: Sequence[str]) -> str | None:
    """The NodeName a slurmd runs as (``-N NAME``); None: the host's own."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-N":
            return argv[i + 1]
    return None


def clashes(other: list[str] | None, ours: list[str]) -> bool:
    """Another daemon of the same program stands where ours would: always for one
    slurmctld or munged a machine; for slurmd, one serving the same node (a machine may
    run several slurmd, each its own ``-N`` node, as a test cluster on one host does)."""
    if other is None:
        return False
    if Path(ours[0]).name != "slurmd":
        return True
    mine, theirs = node_name(ours), node_name(other)
    return theirs is None or mine is None or theirs == mine


class StartedBook:
    """``started.json``: the daemons this agent started, kept across its restarts."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "slurm" / "started.json"
        self.entries: dict[Daemon, Started] = {}
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            raw = json.loads(self.path.read_text())
            for name in DAEMONS:
                if name in raw:
                    self.entries[name] = Started(**raw[name])

    def set(self, name: Daemon, started: Started | None) -> None:
        if started is None:
            self.entries.pop(name, None)
        else:
            self.entries[name] = started
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: asdict(v) for k, v in self.entries.items()}, indent=1))
        tmp.replace(self.path)


def dropin(name: Daemon, exec_start: Sequence[str]) -> str:
    """The drop-in that runs ``name``'s packaged unit as llmgw needs it: in the
    foreground (``-D``) as Type=simple, which every Slurm since 22.05 takes (22.05 has no
    ``--systemd``: it refuses the option; and a configless slurmd under Type=notify can
    time out fetching its config). The packaged units' ConditionPathExists=
    /etc/slurm/slurm.conf and PIDFile are cleared: configless slurmd has no such file,
    and llmgw's root keeps its own pids."""
    env = "$SLURMCTLD_OPTIONS" if name == "slurmctld" else "$SLURMD_OPTIONS"
    return (
        "# Written by llmgw's agent for this node's Slurm part; removed when it has none.\n"
        "[Unit]\n"
        "ConditionPathExists=\n"
        "[Service]\n"
        "Type=simple\n"
        "PIDFile=\n"
        "ExecStart=\n"
        f"ExecStart={shlex.join(exec_start)} {env}\n"
    )


class Daemons:
    """Starts, restarts and stops the daemons, directly or under systemd."""

    def __init__(
        self,
        machine: Machine,
        book: StartedBook,
        systemd: bool,
        systemd_dir: Path = SYSTEMD_DIR,
    ) -> None:
        self.machine = machine
        self.book = book
        self.systemd = systemd
        self.systemd_dir = systemd_dir

    def ours(self, name: Daemon) -> Started | None:
        """What the book says we started, if it still runs (for a direct one: the pid
        is still that program)."""
        entry = self.book.entries.get(name)
        if entry is None:
            return None
        if entry.how == "direct":
            if entry.pid is None or not is_program(self.machine.cmdline(entry.pid), PROGRAM[name]):
                return None
        return entry

    def foreign(self, name: Daemon) -> list[int]:
        """Pids of ``name`` running here that this agent did not start."""
        entry = self.ours(name)
        mine = entry.pid if entry is not None and entry.how == "direct" else None
        return [p for p in self.machine.pids(PROGRAM[name]) if p != mine]

    async def systemctl(self, *args: str) -> Finished:
        return await self.machine.run(["systemctl", *args], SHORT)

    async def unit_active(self, unit: str) -> bool:
        done = await self.systemctl("is-active", "--quiet", unit)
        return done.code == 0

    async def ensure(
        self, name: Daemon, argv: list[str], log_file: Path, restart: bool
    ) -> str | None:
        """``name`` running ``argv`` (as started by us), restarted when ``restart`` or
        when it runs something else; None, or what is wrong."""
        if self.systemd:
            return await self._ensure_unit(name, argv, restart)
        entry = self.ours(name)
        if entry is not None and entry.argv == argv and not restart:
            return None
        if entry is None:
            others = [p for p in self.foreign(name) if clashes(self.machine.cmdline(p), argv)]
            if others:
                return (
                    f"{PROGRAM[name]} already runs here (pid {others[0]}), not started by "
                    f"llmgw: stop it so llmgw can run it with the cluster's settings, or "
                    f"take this node out of Slurm (`llmgw ctl slurm setup --nodes ...`)"
                )
        if entry is not None and entry.pid is not None:
            log.info("slurm: restarting %s", PROGRAM[name])
            await self.machine.kill(entry.pid, PROGRAM[name])
        log_file.parent.mkdir(parents=True, exist_ok=True)
        pid = await self.machine.spawn(argv, log_file)
        log.info("slurm: started %s (pid %d)", shlex.join(argv), pid)
        self.book.set(name, Started(how="direct", argv=argv, pid=pid))
        return None

    async def _ensure_unit(self, name: Daemon, argv: list[str], restart: bool) -> str | None:
        path = self.systemd_dir / f"{name}.service.d" / DROPIN_NAME
        text = dropin(name, argv)
        entry = self.book.entries.get(name)
        try:
            old = path.read_text()
        except OSError:
            old = None
        if entry is None and await self.unit_active(name):
            return (
                f"{name}.service already runs here, not started by llmgw: stop it "
                f"(`systemctl disable --now {name}`) so llmgw can run it with the "
                "cluster's settings"
            )
        if old != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            restart = True
            await self.systemctl("daemon-reload")
        self.book.set(name, Started(how="systemd", argv=argv, dropin=str(path)))
        await self.systemctl("enable", f"{name}.service")
        verb = "restart" if restart else "start"
        done = await self.systemctl(verb, f"{name}.service")
        if done.code != 0:
            return (
                f"`systemctl {verb} {name}` failed ({done.out.strip()[-200:]}): see "
                f"`journalctl -u {name}`"
            )
        return None

    async def stop(self, name: Daemon) -> None:
        """Stop ``name`` if this agent started it; anything else is left alone."""
        entry = self.book.entries.get(name)
        if entry is None:
            return
        if entry.how == "systemd":
            await self.systemctl("disable", "--now", f"{name}.service")
            if entry.dropin:
                with contextlib.suppress(OSError):
                    Path(entry.dropin).unlink()
                await self.systemctl("daemon-reload")
        elif self.ours(name) is not None and entry.pid is not None:
            await self.machine.kill(entry.pid, PROGRAM[name])
        log.info("slurm: stopped %s (this agent had started it)", PROGRAM[name])
        self.book.set(name, None)

    async def munge_works(self) -> str | None:
        """None when a credential made here decodes here; else munge's error."""
        try:
            done = await self.machine.run(["sh", "-c", "munge -n | unmunge >/dev/null"], SHORT)
        except OSError as exc:
            return str(exc)
        if done.code != 0:
            return done.out.strip().splitlines()[-1] if done.out.strip() else f"exit {done.code}"
        return None

    async def ensure_munge(self, key_changed: bool, run_dir: Path, log_file: Path) -> str | None:
        """munged running with the key on disk; None, or what is wrong."""
        if self.systemd:
            if not await self.unit_active("munge"):
                self.book.set("munge", Started(how="systemd", argv=[]))
                done = await self.systemctl("enable", "--now", "munge.service")
            elif key_changed:
                done = await self.systemctl("restart", "munge.service")
            else:
                return None
            if done.code != 0:
                said = done.out.strip()[-200:]
                return f"munged could not be started ({said}): see `journalctl -u munge`"
            return None
        entry = self.ours("munge")
        if entry is not None and not key_changed:
            return None
        if entry is None:
            if self.foreign("munge"):
                if key_changed:
                    return (
                        "munged here was not started by llmgw and still runs with the old key: "
                        "restart it (`systemctl restart munge`, or stop munged and llmgw starts it)"
                    )
                return None
            if await self.munge_works() is None:
                return None
        elif entry.pid is not None:
            await self.machine.kill(entry.pid, "munged")
        # munged refuses a socket directory it does not own.
        run_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(KeyError, OSError):
            shutil.chown(run_dir, "munge", "munge")
        argv = ["setpriv", "--reuid=munge", "--regid=munge", "--clear-groups", "munged", "-F"]
        log_file.parent.mkdir(parents=True, exist_ok=True)
        pid = await self.machine.spawn(argv, log_file)
        log.info("slurm: started munged (pid %d)", pid)
        self.book.set("munge", Started(how="direct", argv=argv, pid=pid))
        return None

    def started(self) -> list[str]:
        return [n for n in DAEMONS if self.ours(n) is not None]

    def running(self) -> list[str]:
        return [n for n in DAEMONS if self.machine.pids(PROGRAM[n])]
