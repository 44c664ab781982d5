"""SlurmNode with a recording machine, where real Slurm cannot show it: a Slurm too
old, the packages asked of apt and of dnf, systemd's drop-ins, the munge key on disk,
and an administrator's drain never touched. (test_slurmnode_real.py: the real daemons.)"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import multiprocessing
import pwd
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import pytest

from llmgw.agent import command
from llmgw.agent.command import Finished
from llmgw.agent.engines.ospackages import OsPackages
from llmgw.agent.slurmdaemons import LocalMachine
from llmgw.agent.slurmnode import SlurmNode, SlurmPlaces, wanted_packages, write_munge_key
from llmgw.wire.messages import Message, Slurm, SlurmStatus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
KEY = base64.b64encode(b"k" * 128).decode()
ALL = {"munged", "munge", "scontrol", "squeue", "slurmd", "slurmctld"}


class FakeMachine:
    """Answers as a machine with Slurm ``version`` would; records what was asked."""

    def __init__(self, version: str = "slurm-wlm 22.05.8") -> None:
        self.version = version
        self.node = (FIXTURES / "scontrol-show-node-o_idle_22.05.8.txt").read_text()
        self.calls: list[list[str]] = []
        self.procs: dict[int, list[str]] = {}
        self.killed: list[int] = []
        self.active: set[str] = set()
        self.refuse_updates = 0
        self._pid = 1000
        self.step_count: int | None = 0
        self.asked_steps: list[tuple[Path, str]] = []

    async def run(
        self, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> Finished:
        argv = list(argv)
        self.calls.append(argv)
        program = Path(argv[0]).name
        if argv[-1] == "-V":
            return Finished(0, self.version + "\n")
        if argv[-1] == "-C":
            return Finished(0, (FIXTURES / "slurmd-C_vm_slurm-22.05.8.txt").read_text())
        if program == "sh":  # munge -n | unmunge
            return Finished(0 if self.munge_up() else 1, "unmunge: Error: Failed to connect\n")
        if program == "systemctl" and argv[1] == "is-active":
            return Finished(0 if argv[-1] in self.active else 3, "")
        if program == "scontrol" and argv[1] == "show":
            return Finished(0, self.node)
        if program == "scontrol" and argv[1] == "update" and self.refuse_updates:
            self.refuse_updates -= 1
            return Finished(1, "slurm_update error: Invalid node state specified\n")
        return Finished(0, "")

    async def spawn(self, argv: Sequence[str], log_file: Path) -> int:
        self._pid += 1
        # setpriv runs munged in its own place: the process is munged's.
        args = list(argv)
        self.procs[self._pid] = args[args.index("munged") :] if "munged" in args else args
        return self._pid

    def pids(self, program: str) -> list[int]:
        return [p for p, a in self.procs.items() if Path(a[0]).name == program]

    def cmdline(self, pid: int) -> list[str] | None:
        return self.procs.get(pid)

    def steps(self, spool: Path, name: str) -> int | None:
        self.asked_steps.append((spool, name))
        return self.step_count

    async def kill(self, pid: int, program: str) -> None:
        self.killed.append(pid)
        self.procs.pop(pid, None)

    async def reach(self, host: str, port: int) -> str | None:
        return None

    def munge_up(self) -> bool:
        started = ["systemctl", "enable", "--now", "munge.service"] in self.calls
        return started or "munge" in self.active or bool(self.pids("munged"))

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls if c[:2] == ["scontrol", "update"]]

    def systemctl(self) -> list[list[str]]:
        return [c[1:] for c in self.calls if c[0] == "systemctl" and c[1] != "is-active"]


class FakeInstaller:
    def __init__(self, manager: str | None = "apt") -> None:
        self._manager = manager
        self.asked: list[dict[str, list[str]]] = []

    def manager(self) -> str | None:
        return self._manager

    async def ensure(
        self, engine: str, packages: Mapping[str, Sequence[str]], report: Callable[[str], None]
    ) -> list[str]:
        self.asked.append({m: list(n) for m, n in packages.items()})
        return [n for names in packages.values() for n in names]


class Reports(list[SlurmStatus]):
    def __call__(self, msg: Message) -> None:
        if isinstance(msg, SlurmStatus):
            self.append(msg)

    async def version(self, version: int, timeout: float = 10) -> SlurmStatus:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = [s for s in self if s.version == version and s.doing is None]
            if done:
                return done[-1]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no SlurmStatus for version {version}: {list(self)}")


def places(tmp_path: Path) -> SlurmPlaces:
    return SlurmPlaces(
        munge_key=tmp_path / "etc-munge" / "munge.key",
        munge_run=tmp_path / "run-munge",
        munge_log=tmp_path / "log" / "munged.out",
        systemd_dir=tmp_path / "systemd",
        cgroup_controllers=tmp_path / "no-cgroup",
    )


# Slurm's root for the messages: a tmp dir, so no test makes the system's directories.
ROOT: list[Path] = []


@pytest.fixture(autouse=True)
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # A node the fake says is not responding is waited for this long, not 20 s.
    monkeypatch.setattr("llmgw.agent.slurmnode.ANSWER_WAIT", 0.3)
    ROOT[:] = [tmp_path / "root"]
    return ROOT[0]


def msg(version: int, part: str = "both", lent: bool = False, **more: str) -> Slurm:
    fields: dict[str, str] = {
        "root": str(ROOT[0]),
        "name": "n1",
        "conf_server": "ctl:6817",
        "munge_key": KEY,
        "slurm_conf": "ClusterName=c\nSlurmUser=root\n",
        "gres_conf": "",
        "cgroup_conf": "",
    }
    fields.update(more)
    return Slurm(version=version, part=part, lent=lent, **fields)  # type: ignore[arg-type]


def which_of(present: set[str]) -> Callable[[str], str | None]:
    return lambda name: f"/usr/sbin/{name}" if name in present else None


Made = tuple[SlurmNode, FakeMachine, Reports]


@pytest.fixture
async def made(tmp_path: Path) -> AsyncIterator[Callable[..., Made]]:
    nodes: list[SlurmNode] = []

    def make(
        systemd: bool = False,
        version: str = "slurm-wlm 22.05.8",
        present: set[str] = ALL,
        installer: FakeInstaller | None = None,
    ) -> Made:
        machine, reports = FakeMachine(version), Reports()
        node = SlurmNode(
            tmp_path / "state",
            reports,
            installer or FakeInstaller(),  # type: ignore[arg-type]
            systemd,
            machine=machine,
            which=which_of(present),
            places=places(tmp_path),
        )
        nodes.append(node)
        return node, machine, reports

    yield make
    for node in nodes:
        await node.close()


async def test_too_old_a_slurm_starts_nothing_and_says_why(made: Callable[..., Made]) -> None:
    node, machine, reports = made(version="slurm-wlm 21.08.8")
    node.want(msg(1))
    status = await reports.version(1)
    assert status.installed == "21.08.8"
    assert status.problem is not None
    assert "Slurm 21.08.8" in status.problem and "22.05 or newer" in status.problem
    assert "cgroup v2" in status.problem
    assert machine.procs == {}
    assert machine.systemctl() == []
    assert not node.places.munge_key.exists()


def test_packages_asked_per_manager_only_for_missing_programs() -> None:
    nothing = which_of(set())
    assert wanted_packages("both", "apt", nothing) == [
        "munge",
        "slurm-client",
        "slurmd",
        "slurmctld",
    ]
    assert wanted_packages("both", "dnf", nothing) == [
        "munge",
        "slurm",
        "slurm-slurmd",
        "slurm-slurmctld",
    ]
    assert wanted_packages("slurmd", "apt", nothing) == ["munge", "slurm-client", "slurmd"]
    assert wanted_packages("slurmctld", "dnf", nothing) == ["munge", "slurm", "slurm-slurmctld"]
    assert wanted_packages("slurmd", "apt", which_of(ALL - {"slurmd"})) == ["slurmd"]
    assert wanted_packages("both", "apt", which_of(ALL)) == []


async def test_install_goes_through_the_machine_manager(
    made: Callable[..., Made], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real OsPackages on a dnf machine: rpm says which are missing, dnf installs.
    ran: list[list[str]] = []
    installed: set[str] = set()

    async def fake_run(argv: Sequence[str], timeout: float, **kw: object) -> Finished:
        ran.append(list(argv))
        if argv[0] == "rpm":
            return Finished(0 if argv[-1] in installed else 1, "")
        if argv[:2] == ["dnf", "install"]:
            installed.update(argv[3:])
        return Finished(0, "")

    monkeypatch.setattr(command, "run", fake_run)
    present = ALL - {"slurmd", "slurmctld"}
    packages = OsPackages(is_root=lambda: True, which=which_of({"dnf", "rpm"}))
    node, machine, reports = made(present=present)
    node.packages = packages
    node.want(msg(1, part="slurmd"))
    await reports.version(1)
    assert ["dnf", "install", "-y", "slurm-slurmd"] in ran
    assert not any(a[0] == "apt-get" for a in ran)
    assert any(s.doing == "installing slurm-slurmd with dnf" for s in reports)


async def test_install_failure_names_packages_and_command(
    made: Callable[..., Made], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def nothing_installed(argv: Sequence[str], timeout: float, **kw: object) -> Finished:
        return Finished(1, "")

    monkeypatch.setattr(command, "run", nothing_installed)
    node, machine, reports = made(present=set())
    node.packages = OsPackages(is_root=lambda: False, which=which_of({"apt-get", "dpkg-query"}))
    node.want(msg(1, part="slurmd"))
    status = await reports.version(1)
    assert status.problem is not None
    assert "sudo apt-get install -y munge slurm-client slurmd" in status.problem
    assert machine.procs == {}


async def test_systemd_drop_ins_and_none_undoes_them(made: Callable[..., Made]) -> None:
    node, machine, reports = made(systemd=True)
    node.want(msg(1))
    status = await reports.version(1)
    assert status.problem is None, status.problem
    systemd = node.places.systemd_dir
    ctld = (systemd / "slurmctld.service.d" / "llmgw.conf").read_text()
    conf = node.state_dir / "slurm" / "etc" / "slurm.conf"
    assert "ExecStart=\n" in ctld
    assert f"ExecStart=/usr/sbin/slurmctld -D -f {conf} $SLURMCTLD_OPTIONS\n" in ctld
    assert "ConditionPathExists=\n" in ctld
    assert "Type=simple\n" in ctld  # Slurm 22.05 has no --systemd for Type=notify
    slurmd = (systemd / "slurmd.service.d" / "llmgw.conf").read_text()
    assert "ExecStart=/usr/sbin/slurmd -D --conf-server ctl:6817 -N n1 $SLURMD_OPTIONS\n" in slurmd
    assert conf.read_text() == "ClusterName=c\nSlurmUser=root\n"
    calls = machine.systemctl()
    assert ["enable", "--now", "munge.service"] in calls
    assert ["daemon-reload"] in calls
    for unit in ("slurmctld.service", "slurmd.service"):
        assert ["enable", unit] in calls
        assert ["restart", unit] in calls
    assert machine.procs == {}  # nothing run directly under systemd

    machine.calls.clear()
    node.want(msg(2, part="none"))
    await reports.version(2)
    calls = machine.systemctl()
    for unit in ("slurmd.service", "slurmctld.service", "munge.service"):
        assert ["disable", "--now", unit] in calls
    assert not (systemd / "slurmd.service.d" / "llmgw.conf").exists()
    assert not (systemd / "slurmctld.service.d" / "llmgw.conf").exists()


async def test_systemd_munge_running_already_is_not_ours(made: Callable[..., Made]) -> None:
    node, machine, reports = made(systemd=True)
    machine.active.add("munge")
    node.want(msg(1, part="slurmd"))
    await reports.version(1)
    assert ["enable", "--now", "munge.service"] not in machine.systemctl()
    machine.calls.clear()
    node.want(msg(2, part="none"))
    await reports.version(2)
    assert ["disable", "--now", "munge.service"] not in machine.systemctl()
    assert ["disable", "--now", "slurmd.service"] in machine.systemctl()


async def test_direct_daemons_and_the_key(
    made: Callable[..., Made], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    node, machine, reports = made()
    node.want(msg(1))
    status = await reports.version(1)
    assert status.problem is None, status.problem
    key = node.places.munge_key
    assert key.read_bytes() == b"k" * 128
    assert stat.S_IMODE(key.stat().st_mode) == 0o400
    with contextlib.suppress(KeyError):  # owned by munge where the user exists
        assert key.stat().st_uid == pwd.getpwnam("munge").pw_uid
    running = {a[0].rsplit("/", 1)[-1]: a for a in machine.procs.values()}
    assert running["munged"] == ["munged", "-F"]
    conf = str(node.state_dir / "slurm" / "etc" / "slurm.conf")
    assert running["slurmctld"] == ["/usr/sbin/slurmctld", "-D", "-f", conf]
    assert running["slurmd"] == ["/usr/sbin/slurmd", "-D", "--conf-server", "ctl:6817", "-N", "n1"]
    assert set(status.started) == {"munge", "slurmctld", "slurmd"}
    assert status.facts is not None and status.facts.cpus == 2
    inode = key.stat().st_ino

    # The same message again: nothing restarted, the key not rewritten.
    node.want(msg(2))
    await reports.version(2)
    assert machine.killed == []
    assert key.stat().st_ino == inode
    # A new key restarts the munged this agent started; a new conf_server, slurmd.
    newkey = base64.b64encode(b"z" * 128).decode()
    node.want(msg(3, munge_key=newkey, conf_server="ctl2:6817"))
    await reports.version(3)
    assert key.read_bytes() == b"z" * 128
    assert len(machine.killed) == 2
    assert sorted(Path(a[0]).name for a in machine.procs.values()) == [
        "munged",
        "slurmctld",
        "slurmd",
    ]
    # The key and the message carrying it are never logged.
    assert KEY not in caplog.text and newkey not in caplog.text
    assert "kkkk" not in caplog.text


async def test_an_agent_started_again_stops_only_what_its_book_says(
    made: Callable[..., Made],
) -> None:
    node, machine, reports = made()
    node.want(msg(1, part="slurmd"))
    await reports.version(1)
    await node.close()
    # An administrator's slurmctld runs here too.
    machine.procs[1] = ["/usr/sbin/slurmctld", "-D"]
    again, _, _ = made()
    again.machine = machine
    again.daemons.machine = machine
    again.emit = reports
    again.want(msg(2, part="none"))
    status = await reports.version(2)
    assert status.started == []
    assert list(machine.procs) == [1]


async def test_a_running_slurmd_not_ours_is_left_and_said(made: Callable[..., Made]) -> None:
    node, machine, reports = made()
    machine.procs[7] = ["/usr/sbin/slurmd", "-D"]
    node.want(msg(1, part="slurmd"))
    status = await reports.version(1)
    assert status.problem is not None
    assert "slurmd already runs here (pid 7), not started by llmgw" in status.problem
    assert 7 not in machine.killed


@pytest.mark.parametrize(
    ("fixture", "lent", "want"),
    [
        ("drained-llmgw", True, ["scontrol", "update", "nodename=n1", "state=resume"]),
        (
            "idle",
            False,
            ["scontrol", "update", "nodename=n1", "state=drain", "reason=llmgw: reclaimed"],
        ),
        ("drained-llmgw", False, None),
        ("idle", True, None),
        ("mixed", True, None),
        # An administrator's drain: never resumed, never overwritten.
        ("drained-admin", True, None),
        ("drained-admin", False, None),
    ],
)
async def test_lent_or_not(
    made: Callable[..., Made], fixture: str, lent: bool, want: list[str] | None
) -> None:
    node, machine, reports = made()
    machine.node = (FIXTURES / f"scontrol-show-node-o_{fixture}_22.05.8.txt").read_text()
    node.want(msg(1, lent=lent))
    status = await reports.version(1)
    assert machine.updates() == ([want] if want else [])
    assert status.state is not None


async def test_a_newer_message_while_converging_is_taken_after(
    made: Callable[..., Made],
) -> None:
    node, machine, reports = made()
    node.want(msg(1, lent=False))
    node.want(msg(2, lent=True))
    node.want(msg(3, part="none"))
    status = await reports.version(3)
    assert status.part == "none"
    assert node.msg.version == 3
    assert machine.procs == {}


async def test_first_report_without_a_part(made: Callable[..., Made]) -> None:
    node, machine, reports = made()
    node.report_soon()
    status = await reports.version(0)
    assert status.part == "none"
    assert status.installed == "22.05.8"
    assert status.facts is not None and status.facts.real_memory == 24105
    assert status.cgroup_v2 is False
    assert status.problem is None
    assert machine.procs == {} and machine.systemctl() == []


async def test_slurmctld_not_answering_is_a_problem_with_its_fix(
    made: Callable[..., Made], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, machine, reports = made()

    async def refused(host: str, port: int) -> str | None:
        return "[Errno 111] Connect call failed"

    machine.reach = refused  # type: ignore[method-assign]
    node.want(msg(1, part="slurmd"))
    status = await reports.version(1)
    assert status.problem == (
        "slurmctld at ctl:6817 does not answer: [Errno 111] Connect call failed; check "
        f"slurmctld on ctl (`systemctl status slurmctld`, its log {ROOT[0]}/log/slurmctld.log)"
    )
    assert status.state is None and status.jobs is None
    assert machine.updates() == []


async def test_munge_failing_is_a_problem_with_its_fix(made: Callable[..., Made]) -> None:
    node, machine, reports = made()
    machine.munge_up = lambda: False  # type: ignore[method-assign]
    node.want(msg(1, part="slurmd"))
    status = await reports.version(1)
    assert status.problem is not None
    assert status.problem.startswith("munge does not work here: unmunge: Error")
    assert "systemctl status munge" in status.problem
    assert "munge.key must match the cluster's" in status.problem


async def test_a_resume_slurm_refused_is_tried_again_soon(made: Callable[..., Made]) -> None:
    node, machine, reports = made()
    machine.node = (FIXTURES / "scontrol-show-node-o_drained-llmgw_22.05.8.txt").read_text()
    machine.refuse_updates = 1
    node.want(msg(1, lent=True))
    await reports.version(1)
    deadline = time.monotonic() + 5  # RETRY_SOON is 2 s, REPORT_EVERY 30 s
    while len(machine.updates()) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    resume = ["scontrol", "update", "nodename=n1", "state=resume"]
    assert machine.updates() == [resume, resume]


async def test_a_converge_that_failed_is_tried_again(
    made: Callable[..., Made], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("llmgw.agent.slurmnode.REPORT_EVERY", 0.1)
    monkeypatch.setattr("llmgw.agent.slurmnode.CONVERGE_AGAIN", 0.2)
    node, machine, reports = made(version="slurm-wlm 21.08.8")
    node.want(msg(1))
    assert (await reports.version(1)).problem is not None
    machine.version = "slurm-wlm 23.11.4"  # upgraded by hand
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not machine.pids("slurmd"):
        await asyncio.sleep(0.05)
    assert machine.pids("slurmd")
    assert reports[-1].version == 1


async def test_a_slurmd_of_another_node_on_this_machine_is_no_clash(
    made: Callable[..., Made],
) -> None:
    node, machine, reports = made()
    machine.procs[8] = ["/usr/sbin/slurmd", "-D", "--conf-server", "ctl:6817", "-N", "n2"]
    node.want(msg(1, part="slurmd"))
    status = await reports.version(1)
    assert status.problem is None, status.problem
    assert "slurmd" in status.started
    assert 8 in machine.procs and 8 not in machine.killed


def test_job_steps_are_counted_by_this_nodes_slurmd_sockets_alive(tmp_path: Path) -> None:
    """A step's slurmstepd listens on <spool>/<node>_<job>.<step>: a stale socket (the
    step died) and another node's steps on the same machine are not this node's."""
    import socket

    spool = tmp_path / "slurmd"
    spool.mkdir()
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(spool / "n1_5.0"))
    live.listen(1)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(spool / "n1_6.4294967292"))
    stale.close()  # the file stays; nothing answers on it
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(spool / "n2_7.0"))
    other.listen(1)
    (spool / "n1_8.0").write_text("not a socket")
    try:
        machine = LocalMachine()
        assert machine.steps(spool, "n1") == 1
        assert machine.steps(spool, "n2") == 1
        assert machine.steps(spool, "n3") == 0
    finally:
        live.close()
        other.close()
    assert LocalMachine().steps(spool, "n1") == 0


def _write_keys_in_turn(path: str, keys: list[str], rounds: int) -> str:
    """In a process of its own: the keys written one after another, ``rounds`` times;
    what went wrong, or ""."""
    try:
        for _ in range(rounds):
            for key in keys:
                write_munge_key(Path(path), key)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def test_two_agents_on_one_machine_write_the_munge_key_at_once(tmp_path: Path) -> None:
    """Two agents on one machine (the Slurm tests' two nodes) write /etc/munge's key at
    the same moment: neither renames the other's file from under it (which once left a
    node's Slurm part failed until its next try, two minutes on), and no file of theirs
    is left beside the key."""
    path = tmp_path / "munge" / "munge.key"
    one = base64.b64encode(b"1" * 1024).decode()
    two = base64.b64encode(b"2" * 1024).decode()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        said = pool.starmap(
            _write_keys_in_turn, [(str(path), [one, two], 300), (str(path), [two, one], 300)]
        )
    assert said == ["", ""]
    assert path.read_bytes() in (b"1" * 1024, b"2" * 1024)
    assert sorted(p.name for p in path.parent.iterdir()) == ["munge.key"]
