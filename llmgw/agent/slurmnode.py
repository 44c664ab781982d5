"""This node's part in the cluster's Slurm, kept as the control plane's ``Slurm`` message
says, and reported in ``SlurmStatus``.

``SlurmNode.want`` keeps the newest message and wakes one background task, which
converges (never two at once; a message that comes meanwhile is taken after):

- part "none": stop the daemons this agent started (``slurmdaemons``), nothing else.
- otherwise: install what is missing from the machine's own package sources (only the
  packages whose program is missing); refuse a Slurm older than 22.05 (``problem``
  says so; nothing is started); write the munge key (0400, owned by munge, only when it
  differs) and have munged running; make the directories of ``slurm_paths(root)``; on
  the controller's node write slurm.conf, gres.conf and cgroup.conf to
  ``STATE/slurm/etc`` and run slurmctld on them (restarted when one changed); on a
  slurmd node run slurmd configless (``--conf-server``, ``-N NAME``).
- lent or not, once slurmctld answers, every pass: lent and drained by llmgw (a reason
  starting ``llmgw:``) -> resumed; not lent and not drained -> drained with
  ``DRAIN_REASON``. A drain with any other reason is an administrator's: never touched.

It reports after every converge, every ``REPORT_EVERY`` seconds while it has a part
(``BUSY_REPORT_EVERY`` while it is lent or runs a job step),
and when the stream attaches (with no part too: the installed version, ``slurmd -C``,
cgroup v2, so the control plane can refuse a Slurm too old at setup). A failing Slurm
is a ``problem`` with its fix, never an exception out of the task. The munge key is
never logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from llmgw.agent.engines.ospackages import Manager, OsPackageError, OsPackages
from llmgw.agent.slurmdaemons import (
    DAEMONS,
    SHORT,
    SYSTEMD_DIR,
    Daemons,
    LocalMachine,
    Machine,
    StartedBook,
)
from llmgw.agent.slurmread import (
    SQUEUE_FORMAT,
    SlurmNodeRecord,
    SlurmReadError,
    parse_node,
    parse_slurmd_c,
    parse_squeue,
    parse_version,
    version_ok,
)
from llmgw.wire.messages import (
    DRAIN_REASON,
    OUR_REASON_PREFIX,
    Message,
    Slurm,
    SlurmdFacts,
    SlurmJob,
    SlurmStatus,
)
from llmgw.wire.slurmpaths import SlurmPaths, slurm_paths

log = logging.getLogger("llmgw.agent.slurm")

REPORT_EVERY = 30.0
# While the node is lent or runs a job step: a reclaim waits on its jobs ending, and the
# console and pages show them.
BUSY_REPORT_EVERY = 5.0
RETRY_SOON = 2.0
# A converge that ended in a problem (an install, a daemon that would not start) is
# tried again this often while no newer message comes.
CONVERGE_AGAIN = 120.0
# How long a converge waits for a slurmctld it (or another node) started to answer.
ANSWER_WAIT = 20.0
# Each package, per manager, and the programs that say it is there.
PACKAGES: dict[Manager, dict[str, tuple[str, ...]]] = {
    "apt": {
        "munge": ("munged", "munge"),
        "slurm-client": ("scontrol", "squeue"),
        "slurmd": ("slurmd",),
        "slurmctld": ("slurmctld",),
    },
    "dnf": {
        "munge": ("munged", "munge"),
        "slurm": ("scontrol", "squeue"),
        "slurm-slurmd": ("slurmd",),
        "slurm-slurmctld": ("slurmctld",),
    },
}
_ROLE_PACKAGE = {
    "slurmd": ("slurmd", "slurm-slurmd"),
    "slurmctld": ("slurmctld", "slurm-slurmctld"),
}
_SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Installer(Protocol):
    """OS packages from the machine's sources (``OsPackages``)."""

    def manager(self) -> Manager | None: ...

    async def ensure(
        self, engine: str, packages: Mapping[str, Sequence[str]], report: Callable[[str], None]
    ) -> list[str]: ...


@dataclass(frozen=True)
class SlurmPlaces:
    """Where the machine keeps munge's key and socket, systemd's units, and the kernel's
    cgroup v2 controllers (tests point the key and units at a tmp dir)."""

    munge_key: Path = Path("/etc/munge/munge.key")
    munge_run: Path = Path("/run/munge")
    munge_log: Path = Path("/var/log/munge/munged.out")
    systemd_dir: Path = SYSTEMD_DIR
    cgroup_controllers: Path = Path("/sys/fs/cgroup/cgroup.controllers")
    proc: Path = Path("/proc")


def detect_systemd() -> bool:
    """systemd runs this machine (as node add tells it: /run/systemd/system)."""
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def _which(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SBIN_PATH}")


def has_ctld(part: str) -> bool:
    return part in ("slurmctld", "both")


def has_slurmd(part: str) -> bool:
    return part in ("slurmd", "both")


def wanted_packages(part: str, manager: Manager, which: Callable[[str], str | None]) -> list[str]:
    """The packages ``part`` needs on a ``manager`` machine whose programs are missing."""
    roles = {"munge", "slurm-client", "slurm"}
    for role, names in _ROLE_PACKAGE.items():
        if (role == "slurmd" and has_slurmd(part)) or (role == "slurmctld" and has_ctld(part)):
            roles.update(names)
    return [
        name
        for name, programs in PACKAGES[manager].items()
        if name in roles and not all(which(p) for p in programs)
    ]


def registered(node: SlurmNodeRecord) -> bool:
    """slurmd has registered with slurmctld (its state is no longer UNKNOWN, and it
    answers)."""
    flags = node.flags
    return bool(flags) and flags[0] != "UNKNOWN" and "NOT_RESPONDING" not in flags


def slurm_user(slurm_conf: str | None) -> str | None:
    """SlurmUser in ``slurm_conf`` (slurmctld runs as it and writes its state so)."""
    found = re.search(r"(?im)^\s*SlurmUser\s*=\s*(\S+)", slurm_conf or "")
    return found.group(1) if found else None


def write_munge_key(path: Path, key: str | None) -> bool:
    """Write the cluster's munge key (base64) to ``path`` when it differs; True when it
    did. Through a file of this process's own beside it, then renamed: two agents on one
    machine (as the tests run them) never rename each other's, and none is left behind."""
    if not key:
        return False
    try:
        raw = base64.b64decode(key, validate=True)
    except binascii.Error:
        raise ValueError("the control plane's munge key is not base64") from None
    with contextlib.suppress(OSError):
        if path.read_bytes() == raw:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.llmgw.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
        os.chmod(tmp, 0o400)
        with contextlib.suppress(KeyError, OSError):
            shutil.chown(tmp, "munge", "munge")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("slurm: wrote the cluster's munge key to %s", path)
    return True


class SlurmNode:
    def __init__(
        self,
        state_dir: Path,
        emit: Callable[[Message], None],
        packages: Installer | None = None,
        systemd: bool | None = None,
        *,
        machine: Machine | None = None,
        which: Callable[[str], str | None] = _which,
        places: SlurmPlaces | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.etc = state_dir / "slurm" / "etc"
        self.emit = emit
        self.places = places or SlurmPlaces()
        self.packages: Installer = packages or OsPackages(which=which)
        self.systemd = detect_systemd() if systemd is None else systemd
        self.machine = machine or LocalMachine(self.places.proc)
        self.which = which
        self.daemons = Daemons(
            self.machine, StartedBook(state_dir), self.systemd, self.places.systemd_dir
        )
        self.msg = Slurm(version=0)
        self.problem: str | None = None
        self.doing: str | None = None
        self._pending: Slurm | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._facts: SlurmdFacts | None = None
        # A resume or drain Slurm refused (the node not registered yet): try again soon.
        self._retry_soon = False

    # --- the runtime's hooks ------------------------------------------------------------

    def want(self, msg: Slurm) -> None:
        """Keep ``msg`` (the newest wins) and have the task converge on it."""
        self._pending = msg
        self._kick()

    def report_soon(self) -> None:
        """Report at once (a stream attached)."""
        self._kick()

    async def close(self) -> None:
        """Stop the task; the daemons keep running for the next agent."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _kick(self) -> None:
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failed_at: float | None = None
        while True:
            self._wake.clear()
            msg, self._pending = self._pending, None
            if msg is None and failed_at is not None and loop.time() - failed_at >= CONVERGE_AGAIN:
                msg = self.msg
            # A failing Slurm never stops the agent's other work: it is said, and tried
            # again with the next message or pass.
            try:
                if msg is not None:
                    await self._converge(msg)
            except Exception as exc:
                log.exception("slurm: keeping this node's part failed")
                self.problem = f"this node's Slurm part failed: {type(exc).__name__}: {exc}"
            if msg is not None:
                failed_at = loop.time() if self.problem is not None else None
            busy = False
            try:
                said = await self.status()
                self.emit(said)
                busy = self.msg.lent or bool(said.jobs) or bool(said.steps)
            except Exception:
                log.exception("slurm: reading Slurm's state failed")
            if self._pending is not None:
                continue
            every = None if self.msg.part == "none" else BUSY_REPORT_EVERY if busy else REPORT_EVERY
            if self._retry_soon:
                every, self._retry_soon = RETRY_SOON, False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await self._wake.wait()

    # --- converging ----------------------------------------------------------------------

    async def _converge(self, msg: Slurm) -> None:
        # The message holds the munge key: it is never logged, only its part and version.
        log.info("slurm: part %s (lent %s), version %d", msg.part, msg.lent, msg.version)
        self.msg, self.problem = msg, None
        if msg.part == "none":
            for name in reversed(DAEMONS):
                await self.daemons.stop(name)
            return
        if not await self._install(msg.part):
            return
        version = await self.installed()
        if version is None:
            self.problem = "Slurm's programs are not here after installing: install slurm by hand"
            return
        if not version_ok(version):
            self.problem = (
                f"Slurm {version} is installed here; llmgw needs Slurm 22.05 or newer (the "
                "first whose cgroup v2 plugin confines jobs): upgrade slurm on this node"
            )
            return
        try:
            key_changed = write_munge_key(self.places.munge_key, msg.munge_key)
        except (OSError, ValueError) as exc:
            self.problem = (
                f"the munge key could not be written to {self.places.munge_key}: {exc} "
                "(the agent runs Slurm only as root)"
            )
            return
        paths = slurm_paths(msg.root)
        self._make_dirs(paths, msg)
        problem = await self.daemons.ensure_munge(
            key_changed, self.places.munge_run, self.places.munge_log
        )
        if has_ctld(msg.part):
            problem = problem or await self._controller(msg, paths)
        if has_slurmd(msg.part):
            problem = problem or await self._slurmd(msg, paths)
        self.problem = problem
        if problem is None:
            await self._await_answer(msg)

    async def _install(self, part: str) -> bool:
        manager = self.packages.manager()
        if manager is None:
            missing = [
                p for p in ("munged", "scontrol", "slurmd", "slurmctld") if not self.which(p)
            ]
            if (
                has_slurmd(part)
                and "slurmd" in missing
                or has_ctld(part)
                and "slurmctld" in missing
            ):
                self.problem = (
                    f"Slurm is not installed here ({', '.join(missing)} missing) and this "
                    "machine has neither apt-get nor dnf: install munge and Slurm 22.05 or "
                    "newer by hand"
                )
                return False
            return True
        names = wanted_packages(part, manager, self.which)
        if not names:
            return True
        self.doing = f"installing {', '.join(names)} with {manager}"
        self.emit(await self.status())
        try:
            await self.packages.ensure("Slurm", {manager: names}, lambda words: None)
        except OsPackageError as exc:
            self.problem = str(exc)
            return False
        finally:
            self.doing = None
        self._facts = None
        return True

    def _make_dirs(self, paths: SlurmPaths, msg: Slurm) -> None:
        for directory in (paths.state_save, paths.slurmd_spool, paths.log_dir):
            Path(directory).mkdir(parents=True, exist_ok=True)
        for pid in (paths.ctld_pid, paths.slurmd_pid):
            Path(pid).parent.mkdir(parents=True, exist_ok=True)
        user = slurm_user(msg.slurm_conf)
        if has_ctld(msg.part) and user and user != "root":
            with contextlib.suppress(KeyError, OSError):
                shutil.chown(paths.state_save, user, user)
                shutil.chown(paths.log_dir, user, user)

    def _write_conf(self, msg: Slurm) -> bool:
        """slurm.conf, gres.conf, cgroup.conf in STATE/slurm/etc; True when one changed."""
        self.etc.mkdir(parents=True, exist_ok=True)
        changed = False
        files = {
            "slurm.conf": msg.slurm_conf,
            "gres.conf": msg.gres_conf,
            "cgroup.conf": msg.cgroup_conf,
        }
        for name, text in files.items():
            path = self.etc / name
            if text is None:
                continue
            with contextlib.suppress(OSError):
                if path.read_text() == text:
                    continue
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            changed = True
        return changed

    async def _controller(self, msg: Slurm, paths: SlurmPaths) -> str | None:
        if not msg.slurm_conf:
            return (
                "this node runs slurmctld but the control plane sent no slurm.conf: run "
                "`llmgw ctl slurm setup` again"
            )
        changed = self._write_conf(msg)
        program = self.which("slurmctld") or "slurmctld"
        conf = str(self.etc / "slurm.conf")
        argv = [program, "-D", "-f", conf]
        return await self.daemons.ensure(
            "slurmctld", argv, Path(paths.log_dir) / "slurmctld.out", restart=changed
        )

    async def _slurmd(self, msg: Slurm, paths: SlurmPaths) -> str | None:
        if not msg.conf_server or not msg.name:
            return (
                "this node runs slurmd but the control plane sent no conf_server or name: "
                "run `llmgw ctl slurm setup` again"
            )
        program = self.which("slurmd") or "slurmd"
        argv = [
            program,
            "-D",
            "--conf-server",
            msg.conf_server,
            "-N",
            msg.name,
        ]
        return await self.daemons.ensure(
            "slurmd", argv, Path(paths.log_dir) / "slurmd.out", restart=False
        )

    async def _await_answer(self, msg: Slurm) -> None:
        """Give a slurmctld just started (here or on the controller) a moment to answer,
        and a slurmd just started a moment to register (Slurm refuses to resume a node
        whose state is still UNKNOWN), so the first report already says the node's state."""
        if not msg.conf_server:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ANSWER_WAIT
        while loop.time() < deadline:
            if await self._unreachable(msg.conf_server) is None:
                if not (has_slurmd(msg.part) and msg.name):
                    return
                found = await self.node(msg.name)
                if isinstance(found, SlurmNodeRecord) and registered(found):
                    return
            await asyncio.sleep(0.5)

    # --- reading Slurm -------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        """scontrol's config: our slurm.conf on the controller's node; elsewhere the
        copy configless slurmd keeps (/run/slurm/conf)."""
        if has_ctld(self.msg.part):
            return {"SLURM_CONF": str(self.etc / "slurm.conf")}
        return {}

    async def _ask(self, argv: list[str]) -> tuple[int, str]:
        try:
            done = await self.machine.run(argv, SHORT, env=self._env())
        except OSError as exc:
            return 127, str(exc)
        return done.code, done.out

    async def installed(self) -> str | None:
        """Slurm's version here (slurmd's, else slurmctld's, else scontrol's)."""
        for program in ("slurmd", "slurmctld", "scontrol"):
            path = self.which(program)
            if path is None:
                continue
            code, out = await self._ask([path, "-V"])
            if code == 0 and (version := parse_version(out)):
                return version
        return None

    async def facts(self) -> SlurmdFacts | None:
        if self._facts is None and (path := self.which("slurmd")):
            code, out = await self._ask([path, "-C"])
            if code == 0:
                with contextlib.suppress(SlurmReadError):
                    self._facts = parse_slurmd_c(out)
        return self._facts

    async def _unreachable(self, conf_server: str) -> str | None:
        """None when slurmctld's port takes a connection; else why not. (scontrol
        itself takes MessageTimeout, 10 s, to say the same.)"""
        host, _, port = conf_server.rpartition(":")
        try:
            return await self.machine.reach(host.strip("[]"), int(port))
        except ValueError:
            return f"{conf_server!r} is not host:port"

    async def node(self, name: str) -> SlurmNodeRecord | str:
        code, out = await self._ask(["scontrol", "show", "node", name, "-o"])
        if code != 0:
            return out.strip() or f"scontrol exit {code}"
        try:
            return parse_node(out)
        except SlurmReadError as exc:
            return str(exc)

    async def keep_lent(self, name: str, node: SlurmNodeRecord) -> bool:
        """Resume a drain of ours when lent, drain when not; True when it changed."""
        ours = (node.reason or "").startswith(OUR_REASON_PREFIX)
        if self.msg.lent and node.drained and ours:
            argv = ["scontrol", "update", f"nodename={name}", "state=resume"]
        elif not self.msg.lent and not node.drained:
            argv = [
                "scontrol",
                "update",
                f"nodename={name}",
                "state=drain",
                f"reason={DRAIN_REASON}",
            ]
        else:
            return False
        code, out = await self._ask(argv)
        if code != 0:
            log.warning("slurm: %s failed: %s", " ".join(argv[:4]), out.strip())
            self._retry_soon = True
            return False
        log.info("slurm: %s %s", "resumed" if self.msg.lent else "drained", name)
        return True

    def steps(self, msg: Slurm) -> int | None:
        """Job steps this node's slurmd runs (None: it runs no slurmd here)."""
        if not (has_slurmd(msg.part) and msg.name):
            return None
        return self.machine.steps(Path(slurm_paths(msg.root).slurmd_spool), msg.name)

    async def status(self) -> SlurmStatus:
        msg = self.msg
        part = msg.part
        state = reason = None
        jobs: list[SlurmJob] | None = None
        problem = self.problem
        if part != "none" and problem is None:
            problem = await self._health(msg)
        if part != "none" and problem is None and msg.name and has_slurmd(part):
            found = await self.node(msg.name)
            if isinstance(found, SlurmNodeRecord) and await self.keep_lent(msg.name, found):
                found = await self.node(msg.name)
            if isinstance(found, SlurmNodeRecord):
                state, reason = found.state, found.reason
                code, out = await self._ask(["squeue", "-h", "-w", msg.name, "-o", SQUEUE_FORMAT])
                if code == 0:
                    with contextlib.suppress(SlurmReadError):
                        jobs = parse_squeue(out)
            else:
                problem = (
                    f"scontrol could not read node {msg.name}: {found}; check slurmctld's log "
                    f"{slurm_paths(msg.root).ctld_log} on the controller"
                )
        return SlurmStatus(
            version=msg.version,
            part=part,
            installed=await self.installed(),
            facts=await self.facts(),
            state=state,
            reason=reason,
            jobs=jobs,
            steps=self.steps(msg),
            running=self.daemons.running(),
            started=self.daemons.started(),
            problem=problem,
            doing=self.doing,
            cgroup_v2=self.places.cgroup_controllers.exists() and self.systemd,
        )

    async def _health(self, msg: Slurm) -> str | None:
        broken = await self.daemons.munge_works()
        if broken is not None:
            return (
                f"munge does not work here: {broken}; check munged (`systemctl status munge`, "
                f"{self.places.munge_key} must match the cluster's)"
            )
        if msg.conf_server:
            why = await self._unreachable(msg.conf_server)
            if why is not None:
                controller = msg.conf_server.rpartition(":")[0] or msg.conf_server
                return (
                    f"slurmctld at {msg.conf_server} does not answer: {why}; check slurmctld on "
                    f"{controller} (`systemctl status slurmctld`, its log "
                    f"{slurm_paths(msg.root).ctld_log})"
                )
        return None
