"""What ``llmgw wipe`` finds of llmgw on a machine, and why each piece is llmgw's.

Every path here is as the machine sees it (``/var/lib/llmgw``); ``Places.real`` puts it
under the root wipe works on (``/`` or a scratch root). What goes:

- units: ``llmgw-agent.service`` and ``llmgw-server.service`` (node add, server add),
  their ``*.wants`` links, and the Slurm and munge units whose drop-in
  (``UNIT.service.d/llmgw.conf``) the agent wrote, with that drop-in;
- processes: the engines the agents' shard records name (pid and start time), the Slurm
  daemons an agent started itself (``slurm/started.json``), the agent and control plane
  of a nohup'd install (``PREFIX/agent.pid``, ``server.pid``) and, on the host, any
  ``llmgw agent run`` / ``llmgw server run``;
- llmgw's nftables table, ``inet llmgw``;
- files: ``/etc/llmgw``, the agents' state dirs, the install prefix ``/opt/llmgw`` and
  keepalived's configuration where ``server add`` wrote it (its mark on the first line).
  With ``--models`` the weights dirs; with ``--store`` the control plane's data dirs
  (its SQLite store, cluster key and CA). A dir that holds one that stays is taken
  apart entry by entry around it.

llmgw never puts the cluster CA in the system's trust store (agents trust it from their
state dir), so there is nothing of it to take from there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from llmgw.agent.firewall import TABLE
from llmgw.agent.slurmdaemons import DAEMONS, DROPIN_NAME, PROGRAM, SYSTEMD_DIR, StartedBook
from llmgw.agent.slurmdaemons import dropin as slurm_dropin
from llmgw.client import credentials
from llmgw.client.keepalived import KEEPALIVED_DIR, KEEPALIVED_MARK
from llmgw.client.nodeadd import UNIT_NAME as AGENT_UNIT
from llmgw.client.serveradd import UNIT_NAME as SERVER_UNIT
from llmgw.config import (
    AgentConfig,
    ConfigError,
    default_data_dir,
    default_state_dir,
    default_weights_dir,
    load,
)
from llmgw.wipe.machine import Machine, ProcessFacts, is_llmgw_daemon

Kind = Literal["unit", "process", "firewall", "file", "directory"]
KINDS: tuple[Kind, ...] = ("unit", "process", "firewall", "file", "directory")

CONFIG_DIR = "/etc/llmgw"
# node add's and server add's --prefix unless told (cli.py, client/ctl_servers.py).
DEFAULT_PREFIX = "/opt/llmgw"
SYSTEM_DIR = SYSTEMD_DIR.as_posix()
# Root's defaults (llmgw.config): what a system install uses.
SYSTEM_DATA_DIR = "/var/lib/llmgw"
SYSTEM_STATE_DIR = "/var/lib/llmgw-agent"
SYSTEM_WEIGHTS_DIR = "/var/lib/llmgw-weights"
# What node add and server add put in a prefix (remote.py's scripts, release.py's swap):
# all of a prefix that is not llmgw's own dir by name goes entry by entry.
INSTALL_ENTRIES = (
    "llmgw.pyz",
    "agent.yaml",
    "agent.log",
    "agent.pid",
    "server.log",
    "server.pid",
    ".shiv",
)
_SHIV_ROOT = re.compile(r"^Environment=SHIV_ROOT=(/\S+)/\.shiv$", re.MULTILINE)
# The supervisor's shard records, under an agent's state dir (agent/runtime.py).
SHARDS = "shards"
# What the agent writes at the top of a Slurm drop-in.
DROPIN_MARK = slurm_dropin("slurmd", ["slurmd"]).splitlines()[0]


@dataclass(frozen=True)
class Item:
    """One thing wipe takes away: a unit, process or table by ``name``, a file or
    directory by ``path``; ``reason`` says why it is llmgw's."""

    kind: Kind
    name: str
    reason: str
    pid: int | None = None
    process: ProcessFacts | None = None

    def as_json(self) -> dict[str, str | int]:
        key = "path" if self.kind in ("file", "directory") else "name"
        out: dict[str, str | int] = {"kind": self.kind, key: self.name, "reason": self.reason}
        if self.pid is not None:
            out["pid"] = self.pid
        return out


@dataclass(frozen=True)
class Choice:
    models: bool = False
    store: bool = False


@dataclass(frozen=True)
class Kept:
    """A dir that stays unless its flag is given."""

    path: str
    reason: str
    flag: str


@dataclass(frozen=True)
class Places:
    """Where to look: the root, and the dirs of each kind (machine paths)."""

    root: Path
    state_dirs: tuple[str, ...]
    data_dirs: tuple[str, ...]
    weights_dirs: tuple[str, ...]
    prefixes: tuple[str, ...] = (DEFAULT_PREFIX,)
    # Single files of llmgw's outside those dirs (ctl's saved login, on the host).
    files: tuple[str, ...] = ()

    def real(self, path: str) -> Path:
        return self.root / path.lstrip("/")


def _llmgw_path(path: str) -> bool:
    """A dir a config names is taken only when its own path says llmgw: agent.yaml
    saying ``weights_dir: /srv`` must not take /srv."""
    parts = PurePosixPath(path).parts
    return path.startswith("/") and any("llmgw" in part for part in parts[1:])


def _configured(agent_yaml: Path) -> tuple[list[str], list[str]]:
    """The state and weights dirs an agent.yaml names (beyond the defaults)."""
    try:
        config = load(AgentConfig, agent_yaml)
    except (ConfigError, OSError, ValueError):
        return [], []
    state = [config.state_dir] if config.state_dir and _llmgw_path(config.state_dir) else []
    weights = [config.weights_dir] if config.weights_dir and _llmgw_path(config.weights_dir) else []
    return state, weights


def _unit_prefixes(root: Path) -> list[str]:
    """The install prefixes llmgw's own units run from (``node add --prefix``)."""
    out = []
    for unit in (AGENT_UNIT, SERVER_UNIT):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = (root / SYSTEM_DIR.lstrip("/") / unit).read_text()
            out += [m.group(1) for m in _SHIV_ROOT.finditer(text)]
    return out


def places(root: Path, on_host: bool) -> Places:
    """The system's places, those llmgw's units and the agents' agent.yaml name and, on
    the host, this user's own defaults (``~/.local/share/llmgw`` and the like)."""
    prefixes = [DEFAULT_PREFIX, *_unit_prefixes(root)]
    state = [SYSTEM_STATE_DIR, *(f"{p}/state" for p in prefixes)]
    data = [SYSTEM_DATA_DIR, *(f"{p}/data" for p in prefixes)]
    weights = [SYSTEM_WEIGHTS_DIR]
    files = []
    if on_host:
        state.append(str(default_state_dir()))
        data.append(str(default_data_dir()))
        weights.append(str(default_weights_dir()))
        files.append(str(credentials.path()))
    configs = [CONFIG_DIR + "/agent.yaml", *(f"{p}/agent.yaml" for p in prefixes)]
    configs += [d + "/agent.yaml" for d in state]
    for config in configs:
        more_state, more_weights = _configured(root / config.lstrip("/"))
        state += more_state
        weights += more_weights
    for d in list(state):
        weights.append(d + "/weights")  # an agent run without a weights dir of its own
    return Places(
        root, _unique(state), _unique(data), _unique(weights), _unique(prefixes), _unique(files)
    )


def _unique(paths: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(os.path.normpath(p) for p in paths))


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


# --- units ----------------------------------------------------------------------------


def _units(p: Places) -> Iterator[Item]:
    system = str(SYSTEM_DIR)
    for unit, why in (
        (AGENT_UNIT, "llmgw's agent unit (node add)"),
        (SERVER_UNIT, "llmgw's control plane unit (server add)"),
    ):
        path = f"{system}/{unit}"
        if p.real(path).is_file():
            yield Item("unit", unit, why + ": stopped and disabled")
            yield Item("file", path, why)
        for wants in sorted(p.real(system).glob(f"*.wants/{unit}")):
            if wants.is_symlink():
                link = "/" + wants.relative_to(p.root).as_posix()
                yield Item("file", link, f"enables {unit}")
    for daemon in DAEMONS:
        unit = f"{daemon}.service"
        folder = f"{system}/{unit}.d"
        path = f"{folder}/{DROPIN_NAME}"
        try:
            text = p.real(path).read_text()
        except OSError:
            continue
        if DROPIN_MARK not in text:
            continue
        why = "llmgw's agent runs it for the cluster's Slurm (its drop-in)"
        yield Item("unit", unit, why + ": stopped and disabled")
        if [e.name for e in p.real(folder).iterdir()] == [DROPIN_NAME]:
            yield Item("directory", folder, f"holds only llmgw's drop-in for {unit}")
        else:
            yield Item("file", path, f"llmgw's drop-in for {unit}")


# --- processes ------------------------------------------------------------------------


def _read_json(path: Path) -> object:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    return None


def _engines(p: Places, machine: Machine) -> Iterator[Item]:
    for state in p.state_dirs:
        folder = p.real(f"{state}/{SHARDS}")
        if not folder.is_dir():
            continue
        for record_path in sorted(folder.glob("*.json")):
            record = _read_json(record_path)
            if not isinstance(record, dict):
                continue
            pid, started = record.get("pid"), record.get("create_time")
            if not isinstance(pid, int) or not isinstance(started, int | float):
                continue
            facts = machine.process(pid, started)
            if facts is None:
                continue  # ended, or the pid is another process's now
            where = f"{state}/{SHARDS}/{record_path.name}"
            yield Item("process", facts.name, f"an engine llmgw started ({where})", pid, facts)


def _slurm_daemons(p: Places, machine: Machine) -> Iterator[Item]:
    for state in p.state_dirs:
        book = StartedBook(p.real(state))
        for daemon, entry in book.entries.items():
            if entry.how != "direct" or entry.pid is None:
                continue
            facts = machine.process(entry.pid, None)
            if facts is None or facts.name != PROGRAM[daemon]:
                continue
            why = f"{PROGRAM[daemon]} llmgw's agent started ({state}/slurm/started.json)"
            yield Item("process", facts.name, why, facts.pid, facts)


def _pid_files(p: Places, machine: Machine) -> Iterator[Item]:
    for prefix in p.prefixes:
        for role in ("agent", "server"):
            path = f"{prefix}/{role}.pid"
            with contextlib.suppress(OSError, ValueError, IndexError):
                facts = machine.process(int(p.real(path).read_text().split()[0]), None)
                # As node add's own stop does: a pid reused by another program stays.
                if facts is not None and any("llmgw.pyz" in w for w in facts.cmdline):
                    yield Item("process", facts.name, f"llmgw's {role} ({path})", facts.pid, facts)


def _daemons(machine: Machine) -> Iterator[Item]:
    for facts in machine.llmgw_daemons():
        if is_llmgw_daemon(facts.cmdline):
            role = "agent" if "agent" in facts.cmdline else "control plane"
            command = " ".join(facts.cmdline)
            command = command if len(command) <= 60 else command[:57] + "..."
            why = f"llmgw's {role} ({command})"
            yield Item("process", facts.name, why, facts.pid, facts)


# --- files ----------------------------------------------------------------------------


def kept(p: Places, choice: Choice) -> list[Kept]:
    out = []
    if not choice.store:
        out += [Kept(d, "the control plane's data dir and store", "--store") for d in p.data_dirs]
    if not choice.models:
        out += [Kept(d, "model weights", "--models") for d in p.weights_dirs]
    return out


def _spread(p: Places, path: str, reason: str, keep: list[str]) -> Iterator[Item]:
    """``path`` whole, or, when something that stays lies inside it, each of its entries
    but that (a dir entered only when it is a real dir, never through a link)."""
    real = p.real(path)
    if not (real.is_symlink() or real.exists()):
        return
    if any(_inside(k, path) for k in keep) and real.is_dir() and not real.is_symlink():
        for entry in sorted(real.iterdir()):
            child = f"{path.rstrip('/')}/{entry.name}"
            if child not in keep:
                yield from _spread(p, child, reason, keep)
        return
    if any(_inside(path, k) for k in keep):
        return
    kind: Kind = "directory" if real.is_dir() and not real.is_symlink() else "file"
    yield Item(kind, path, reason)


def _files(p: Places, choice: Choice) -> Iterator[Item]:
    # Only what is there: a dir is taken apart around what stays, not around a name.
    keep = [k.path for k in kept(p, choice) if os.path.lexists(p.real(k.path))]
    yield from _spread(p, CONFIG_DIR, "llmgw's configuration", keep)
    for d in p.state_dirs:
        yield from _spread(p, d, "an agent's state (its key, certificate, engines)", keep)
    why = "llmgw's install (node add, server add)"
    for prefix in p.prefixes:
        if _llmgw_path(prefix):
            yield from _spread(p, prefix, why, keep)
            continue
        old = sorted(e.name for e in p.real(prefix).glob("llmgw-*.pyz"))
        for name in [*INSTALL_ENTRIES, *old, "state"]:
            yield from _spread(p, f"{prefix}/{name}", why, keep)
    for path in p.files:
        yield from _spread(p, path, "llmgw's own file", keep)
    if choice.store:
        for d in p.data_dirs:
            yield from _spread(p, d, "the control plane's data dir and store (--store)", keep)
    if choice.models:
        for d in p.weights_dirs:
            yield from _spread(p, d, "model weights (--models)", keep)
    for name in ("keepalived.conf", "llmgw.conf"):
        path = f"{KEEPALIVED_DIR}/{name}"
        with contextlib.suppress(OSError, UnicodeDecodeError):
            with p.real(path).open() as f:
                first = f.readline()
            if first.startswith(KEEPALIVED_MARK):
                yield Item("file", path, "keepalived's configuration, written by server add")


def find(p: Places, machine: Machine, choice: Choice) -> list[Item]:
    """Everything wipe would take, each once (a path inside one listed goes with it)."""
    # Agents and control planes before the engines and daemons they would start again.
    found: list[Item] = [*_units(p), *_pid_files(p, machine), *_daemons(machine)]
    found += [*_engines(p, machine), *_slurm_daemons(p, machine)]
    state = [p.real(d) for d in p.state_dirs]
    if machine.firewall_table(state):
        found.append(Item("firewall", f"table inet {TABLE}", "llmgw's nftables table (agent)"))
    found += [*_files(p, choice)]
    paths = {item.name for item in found if item.kind in ("file", "directory")}
    out: list[Item] = []
    seen: set[tuple[str, str]] = set()
    for item in found:
        key = (item.kind, str(item.pid) if item.pid is not None else item.name)
        if key in seen:
            continue
        seen.add(key)
        if item.kind in ("file", "directory") and any(
            other != item.name and _inside(item.name, other) for other in paths
        ):
            continue
        out.append(item)
    return out
