"""What ``llmgw wipe`` does to a machine beyond its files: systemd units, the nftables
table, processes.

``HostMachine`` is this machine (systemctl, nft, every process). ``ScratchMachine`` is
a scratch root (``--root DIR``): its units and table are only what files under the root
say, nothing reaches this machine's systemd or nft, and the only processes it knows are
those a record under the root names by pid *and* start time (an engine's shard record):
a bare pid (a pid file, Slurm's started.json) cannot prove a process of this machine
belongs to the scratch root. Stopping checks the start time again, so a pid reused
since is never signalled. The host alone also looks for llmgw's own agent and control
plane by their command line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from llmgw.agent.firewall import STATE_FILE as FIREWALL_STATE_FILE
from llmgw.agent.firewall import FirewallError, Nft

# A process asked to stop (TERM) has this long before it is killed (KILL).
STOP_GRACE = 10.0
SYSTEMCTL_TIMEOUT = 60.0
# A recorded start time and the process's own may differ by rounding.
START_SLACK = 1.0


@dataclass(frozen=True)
class ProcessFacts:
    """A running process as wipe sees it."""

    pid: int
    name: str
    cmdline: tuple[str, ...]
    create_time: float


def process_facts(pid: int) -> ProcessFacts | None:
    """The running process ``pid``; None when there is none (or it is a zombie)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return ProcessFacts(pid, proc.name(), tuple(proc.cmdline()), proc.create_time())
    except psutil.Error:
        return None


def _matching(pid: int, create_time: float | None) -> ProcessFacts | None:
    """The process ``pid``, if it started when recorded (any, with no time recorded)."""
    facts = process_facts(pid)
    if facts is None or create_time is None:
        return facts
    return facts if abs(facts.create_time - create_time) <= START_SLACK else None


def _ended(proc: psutil.Process, within: float) -> bool:
    """Whether ``proc`` has ended within ``within`` seconds. A zombie has: its parent (an
    agent, or whoever started it) has yet to reap it, but it runs no more."""
    deadline = time.monotonic() + within
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_process(facts: ProcessFacts, grace: float = STOP_GRACE) -> str | None:
    """TERM, then KILL after ``grace`` seconds; None once it is gone, else why not. The
    process must still be the one found (same start time): a pid reused since is left."""
    try:
        proc = psutil.Process(facts.pid)
        if abs(proc.create_time() - facts.create_time) > START_SLACK:
            return None  # ours has ended; the pid now belongs to another process
        proc.terminate()
        if _ended(proc, grace):
            return None
        proc.kill()
        if _ended(proc, grace):
            return None
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return f"not allowed to signal pid {facts.pid} (run llmgw wipe as root)"
    return f"pid {facts.pid} still runs {grace:.0f} s after KILL"


def is_llmgw_daemon(cmdline: tuple[str, ...]) -> bool:
    """An ``llmgw agent run`` or ``llmgw server run``: llmgw's zipapp, its console
    script, or ``python -m llmgw``, with one of those two commands."""
    words = list(cmdline)
    llmgw = any(
        Path(w).name in ("llmgw", "llmgw.pyz") or (w == "llmgw" and i > 0 and words[i - 1] == "-m")
        for i, w in enumerate(words)
    )
    role = any(words[i : i + 2] in (["agent", "run"], ["server", "run"]) for i in range(len(words)))
    return llmgw and role


class Machine(Protocol):
    """The parts of a machine that are not files under its root."""

    def process(self, pid: int, create_time: float | None) -> ProcessFacts | None:
        """The running process ``pid`` a record under the root names, with its start
        time where the record has one (None when the pid is all it says)."""

    def llmgw_daemons(self) -> list[ProcessFacts]:
        """llmgw agents and control planes running, found by command line."""

    def stop(self, facts: ProcessFacts) -> str | None:
        """Stop a process; None once it is gone, else why not."""

    def firewall_table(self, state_dirs: list[Path]) -> bool:
        """llmgw's nftables table is loaded (``state_dirs``: the agents' state dirs)."""

    def delete_firewall_table(self) -> str | None: ...

    def stop_unit(self, unit: str) -> str | None:
        """Stop and disable ``unit``; None when done (or nothing to do), else why not."""

    def units_changed(self) -> str | None:
        """Unit files were removed: have systemd read its units again."""


class HostMachine:
    """This machine."""

    def __init__(self) -> None:
        self.systemctl = shutil.which("systemctl") if Path("/run/systemd/system").is_dir() else None
        self.nft = Nft()

    def process(self, pid: int, create_time: float | None) -> ProcessFacts | None:
        return _matching(pid, create_time)

    def llmgw_daemons(self) -> list[ProcessFacts]:
        mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        found = []
        for proc in psutil.process_iter():
            if proc.pid in mine:
                continue
            try:
                cmdline = tuple(proc.cmdline())
            except psutil.Error:
                continue
            if is_llmgw_daemon(cmdline):
                facts = process_facts(proc.pid)
                if facts is not None:
                    found.append(facts)
        return found

    def stop(self, facts: ProcessFacts) -> str | None:
        return stop_process(facts)

    def firewall_table(self, state_dirs: list[Path]) -> bool:
        return shutil.which("nft") is not None and self.nft.status(None)["present"]

    def delete_firewall_table(self) -> str | None:
        try:
            self.nft.remove()
        except FirewallError as exc:
            return str(exc)
        return None

    def _systemctl(self, *args: str) -> str | None:
        if self.systemctl is None:
            return None  # no systemd running: nothing runs the unit
        try:
            done = subprocess.run(
                [self.systemctl, *args],
                capture_output=True,
                text=True,
                timeout=SYSTEMCTL_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"systemctl {' '.join(args)} gave no answer in {SYSTEMCTL_TIMEOUT:.0f} s"
        if done.returncode != 0:
            words = done.stderr.strip() or f"exit status {done.returncode}"
            return f"systemctl {' '.join(args)} failed: {words}"
        return None

    def stop_unit(self, unit: str) -> str | None:
        return self._systemctl("disable", "--now", unit)

    def units_changed(self) -> str | None:
        return self._systemctl("daemon-reload")


class ScratchMachine:
    """A scratch root: no systemd or nft of its own, and the only processes are those
    records under the root name (pid and start time both)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def process(self, pid: int, create_time: float | None) -> ProcessFacts | None:
        return None if create_time is None else _matching(pid, create_time)

    def llmgw_daemons(self) -> list[ProcessFacts]:
        return []  # this machine's own agents are not the scratch root's

    def stop(self, facts: ProcessFacts) -> str | None:
        return stop_process(facts)

    def firewall_table(self, state_dirs: list[Path]) -> bool:
        # The agent saves the plan it loads: an agent that kept a table left this file.
        return any((d / FIREWALL_STATE_FILE).is_file() for d in state_dirs)

    def delete_firewall_table(self) -> str | None:
        return None

    def stop_unit(self, unit: str) -> str | None:
        return None

    def units_changed(self) -> str | None:
        return None
