"""SlurmNode against the real thing: Debian's munged, slurmctld and slurmd (22.05) on
loopback, under a tmp root, with a slurm.conf written here for one node "n1".

Configless slurmd reaches munge on the default socket before it has any config, so this
uses the machine's own /run/munge and /etc/munge/munge.key (sent back as the cluster's
key, so the key on disk is never changed): in the "slurm" xdist group, one test at a
time, and everything it started is stopped at the end, passed or failed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from llmgw.agent.slurmdaemons import LocalMachine, StartedBook
from llmgw.agent.slurmnode import SlurmNode, SlurmPlaces
from llmgw.wire.messages import Message, Slurm, SlurmStatus
from llmgw.wire.slurmpaths import slurm_paths
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.xdist_group("slurm"),
    pytest.mark.skipif(
        shutil.which("slurmctld") is None or shutil.which("slurmd") is None,
        reason="Slurm's daemons are not installed (apt-get install slurmctld slurmd munge)",
    ),
]

KEY = Path("/etc/munge/munge.key")


def slurm_conf(root: Path, ctld_port: int, slurmd_port: int) -> str:
    paths = slurm_paths(str(root))
    host = socket.gethostname().split(".")[0]
    return f"""ClusterName=llmgwtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmctldParameters=enable_configless
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MailProg=/bin/true
SlurmUser=root
StateSaveLocation={paths.state_save}
SlurmdSpoolDir={paths.slurmd_spool}
SlurmctldLogFile={paths.ctld_log}
SlurmdLogFile={paths.slurmd_log}
SlurmctldPidFile={paths.ctld_pid}
SlurmdPidFile={paths.slurmd_pid}
SelectType=select/cons_tres
ReturnToService=2
NodeName=n1 NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=UNKNOWN
PartitionName=llmgw Nodes=n1 Default=YES MaxTime=INFINITE State=UP
"""


class Reports:
    def __init__(self) -> None:
        self.seen: list[SlurmStatus] = []

    def __call__(self, msg: Message) -> None:
        if isinstance(msg, SlurmStatus):
            self.seen.append(msg)

    async def until(self, check: Callable[[SlurmStatus], bool], timeout: float = 30) -> SlurmStatus:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for status in reversed(self.seen):
                if check(status):
                    return status
            await asyncio.sleep(0.1)
        last = self.seen[-1] if self.seen else None
        raise AssertionError(f"no SlurmStatus as wanted within {timeout} s; last: {last}")


def stop_leftovers(state_dir: Path) -> None:
    """Whatever the book says was started, killed (a failed test leaves none behind)."""
    machine = LocalMachine()
    for entry in StartedBook(state_dir).entries.values():
        if entry.pid is not None and machine.cmdline(entry.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(entry.pid, signal.SIGKILL)


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[Path, Path, str, int]]:
    if not KEY.exists():
        pytest.fail(f"{KEY} is missing: munge's package makes it (apt-get install munge)")
    state, root = tmp_path / "state", tmp_path / "root"
    ctld_port, slurmd_port = free_port(), free_port()
    conf = slurm_conf(root, ctld_port, slurmd_port)
    try:
        yield state, root, conf, ctld_port
    finally:
        stop_leftovers(state)


async def test_a_node_with_both_parts_lent_and_reclaimed(
    setup: tuple[Path, Path, str, int],
) -> None:
    state, root, conf, ctld_port = setup
    munge_before = subprocess.run(
        "munge -n | unmunge", shell=True, capture_output=True, stdin=subprocess.DEVNULL
    ).returncode
    reports = Reports()
    node = SlurmNode(state, reports, systemd=False, places=SlurmPlaces())
    base = dict(
        part="both",
        name="n1",
        conf_server=f"127.0.0.1:{ctld_port}",
        munge_key=base64.b64encode(KEY.read_bytes()).decode(),
        slurm_conf=conf,
        gres_conf="",
        cgroup_conf="",
        root=str(root),
    )
    env = {**os.environ, "SLURM_CONF": str(state / "slurm" / "etc" / "slurm.conf")}
    try:
        # Not lent: munge, slurmctld and slurmd started, and the node drained as ours.
        node.want(Slurm(version=1, lent=False, **base))
        first = await reports.until(lambda s: s.version == 1 and s.state is not None)
        assert first.problem is None
        assert {"slurmctld", "slurmd"} <= set(first.started)
        assert {"munge", "slurmctld", "slurmd"} <= set(first.running)
        assert munge_before == 0 or "munge" in first.started
        assert "DRAIN" in first.state.split("+")
        assert first.reason == "llmgw: reclaimed"
        assert first.installed is not None and first.facts is not None
        assert first.jobs == []

        # Lent: resumed, and a job runs on it.
        node.want(Slurm(version=2, lent=True, **base))
        lent = await reports.until(lambda s: s.version == 2 and s.state is not None)
        assert "DRAIN" not in lent.state.split("+"), lent
        ran = await asyncio.to_thread(
            subprocess.run,
            ["srun", "-N1", "-w", "n1", "-t", "1", "hostname"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            # srun hands its stdin to the job: never the test worker's own (xdist's channel).
            stdin=subprocess.DEVNULL,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == socket.gethostname()

        # A job running here: squeue's job and its step on this machine.
        job = await asyncio.create_subprocess_exec(
            "srun",
            "-N1",
            "-w",
            "n1",
            "-J",
            "llmgw-sleep",
            "sleep",
            "30",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            node.report_soon()
            busy = await reports.until(lambda s: bool(s.jobs) and (s.steps or 0) >= 1)
            assert busy.jobs is not None and busy.jobs[0].name == "llmgw-sleep"
            assert busy.jobs[0].state == "RUNNING"
        finally:
            job.terminate()
            await job.wait()

        # An administrator's drain survives lent and not lent.
        subprocess.run(
            ["scontrol", "update", "nodename=n1", "state=drain", "reason=maintenance"],
            env=env,
            check=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
        for version, lent_now in ((3, True), (4, False)):
            node.want(Slurm(version=version, lent=lent_now, **base))
            kept = await reports.until(lambda s, v=version: s.version == v and s.state is not None)
            assert "DRAIN" in kept.state.split("+")
            assert kept.reason == "maintenance"

        # slurmctld stopped by hand: the status names it, and its fix.
        ctld = node.daemons.ours("slurmctld")
        assert ctld is not None and ctld.pid is not None
        os.kill(ctld.pid, signal.SIGTERM)
        await LocalMachine().kill(ctld.pid, "slurmctld")
        node.report_soon()
        down = await reports.until(lambda s: s.problem is not None)
        assert f"slurmctld at 127.0.0.1:{ctld_port} does not answer" in down.problem
        assert "systemctl status slurmctld" in down.problem
        assert str(root / "log" / "slurmctld.log") in down.problem
        assert "slurmctld" not in down.running
    finally:
        await node.close()

    # An agent started again still knows what it started, and told "none" stops it.
    again = SlurmNode(state, reports, systemd=False)
    assert "slurmd" in again.daemons.started()
    try:
        again.want(Slurm(version=5, part="none"))
        none = await reports.until(lambda s: s.version == 5)
    finally:
        await again.close()
    assert none.part == "none"
    assert none.started == []
    assert "slurmd" not in none.running and "slurmctld" not in none.running
    if munge_before != 0:
        assert "munge" not in none.running
    assert none.installed is not None
