"""Slurm beside llmgw with the real thing: Debian's munged, slurmctld and slurmd, started
by the agents llmgw tells their part, on loopback.

One cluster for the module (one slurmctld shared by these tests, as the suite's time
allows): node ``n1`` runs slurmctld on the files the control plane writes, node ``n2``
runs slurmd configless and is what is lent. Both run the built llama-server, so a replica
on ``n2`` has somewhere to go when ``n2`` is lent. Each test leaves ``n2`` back in llmgw
(stage ``serving``, drained in Slurm by llmgw) for the next.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from tests.e2e.catalog import ctl, ctl_json, join, replicas, scheduled, serve, wait_ready
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.load import metrics_text
from tests.support.ports import free_port
from tests.support.tinymodel import write_tiny_model

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.xdist_group("slurm"),
    pytest.mark.skipif(
        not all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged", "srun")),
        reason="Slurm and munge are not installed (make apt installs them)",
    ),
]


@dataclass
class Site:
    cluster: Cluster
    root: Path
    ctld_port: int

    def status(self) -> dict[str, Any]:
        return ctl_json(self.cluster, "slurm", "status")  # type: ignore[no-any-return]

    def node(self, node_id: str) -> dict[str, Any]:
        rows = {n["node"]: n for n in self.status()["nodes"]}
        return rows[node_id]

    def scontrol_node(self, name: str = "n2") -> str:
        return subprocess.run(
            ["scontrol", "show", "node", name, "-o"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout

    def squeue(self, *args: str, name: str = "n2") -> str:
        return subprocess.run(
            ["squeue", "-h", "-w", name, *args],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()

    def squeue_all(self) -> str:
        """What Slurm holds, for a timeout's message."""
        shown = subprocess.run(
            ["squeue", "-a", "-o", "%i %T %R %N"], capture_output=True, text=True, timeout=20
        )
        return f"squeue: {shown.stdout.strip()!r}; node: {self.scontrol_node().strip()!r}"


def _ours(root: Path, ctld_port: int) -> list[psutil.Process]:
    """The Slurm daemons this module's agents started (found by their command lines)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] in {"slurmctld", "slurmd"} and (
            str(root) in line or f":{ctld_port}" in line
        ):
            found.append(proc)
    return found


def _munge_answers() -> bool:
    encode = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
    if encode.returncode != 0:
        return False
    decode = subprocess.run(["unmunge"], input=encode.stdout, capture_output=True, timeout=10)
    return decode.returncode == 0


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("slurm")
    cluster = scheduled(root)
    ctld_port = free_port()
    munge_before = _munge_answers()
    try:
        join(cluster, "n1", binary)
        join(cluster, "n2", binary)
        ctl(
            cluster,
            "slurm",
            "setup",
            "--controller",
            "n1",
            "--nodes",
            "n2",
            "--root",
            str(root / "slurm"),
            "--ctld-port",
            str(ctld_port),
            "--slurmd-port",
            str(free_port()),
        )
        site = Site(cluster, root, ctld_port)
        # n2's slurmd fetched its configuration from n1's slurmctld and registered:
        # Slurm reports its state, drained by llmgw as a node new to slurm.conf.
        try:
            wait_for(
                lambda: (site.node("n2")["state"] or "").find("DRAIN") >= 0,
                90,
                "n2 to register with slurmctld, drained",
            )
        except AssertionError as exc:
            # What each agent says it is doing, and why not, for the next look.
            said = [
                {k: n.get(k) for k in ("node", "part", "doing", "problem", "running", "state")}
                for n in site.status()["nodes"]
            ]
            raise AssertionError(f"{exc}; the agents say {said}") from None
        yield site
    finally:
        with contextlib.suppress(Exception):
            ctl(cluster, "slurm", "off", "--now")
            wait_for(lambda: not _ours(root, ctld_port), 30, "the agents to stop Slurm")
        for proc in _ours(root, ctld_port):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        cluster.stop()
        if not munge_before:
            for proc in psutil.process_iter(["name"]):
                if proc.info["name"] == "munged":
                    with contextlib.suppress(psutil.Error):
                        proc.terminate()


@pytest.fixture
def tiny(site: Site) -> Iterator[str]:
    """``tiny`` served with its one replica on n2 (n1 cordoned while it is placed)."""
    cluster = site.cluster
    ctl(cluster, "node", "cordon", "n1")
    try:
        serve(cluster, write_tiny_model(site.root / "tiny.gguf"), "tiny")
        (first,) = wait_ready(cluster, "tiny", 1)
        assert first["node"] == "n2"
    finally:
        ctl(cluster, "node", "uncordon", "n1")
    yield "tiny"
    ctl(cluster, "model", "remove", "tiny", check=False)
    wait_for(lambda: not replicas(cluster, "tiny"), 30, "tiny's replicas to go")


def _back_in_llmgw(site: Site) -> None:
    """n2 is llmgw's again: stage serving, not cordoned, drained in Slurm."""
    row = wait_for(
        lambda: (r := site.node("n2"))["stage"] == "serving" and r,
        60,
        "n2 back in llmgw",
    )
    assert "DRAIN" in (row["state"] or "")
    assert site.cluster.nodes()["n2"]["cordoned"] is False


def test_setup_writes_a_configuration_slurmctld_takes_and_slurmd_registers(site: Site) -> None:
    status = site.status()
    assert status["enabled"] is True and status["controller"] == "n1"
    parts = {n["node"]: n["part"] for n in status["nodes"]}
    assert parts == {"n1": "slurmctld", "n2": "slurmd"}
    files = site.cluster.api("/api/v1/slurm/conf")
    assert "NodeName=n2" in files["slurm_conf"] and "enable_configless" in files["slurm_conf"]
    assert f"SlurmctldPort={site.ctld_port}" in files["slurm_conf"]
    n2 = site.node("n2")
    assert n2["version"] and n2["version"].startswith(("22.", "23.", "24.", "25.", "26."))
    assert n2["reason"] and n2["reason"].startswith("llmgw:")
    # Slurm itself says so, to anyone on the node (configless: /run/slurm/conf).
    line = site.scontrol_node()
    assert "NodeName=n2" in line and "DRAIN" in line
    # The munge key the agents wrote is in no answer.
    key = base64.b64encode(Path("/etc/munge/munge.key").read_bytes()).decode()
    assert len(key) > 100
    for path in ("/api/v1/slurm", "/api/v1/slurm/conf", "/api/v1/nodes"):
        assert key[:40] not in json.dumps(site.cluster.api(path))


def test_lend_moves_the_replica_first_then_slurm_runs_jobs_there(site: Site, tiny: str) -> None:
    cluster = site.cluster
    (before,) = replicas(cluster, tiny)
    ctl(cluster, "slurm", "lend", "n2")
    # The replica is placed on n1 before the one on n2 stops: at every look there is a
    # ready replica until n2 is lent.
    moved = wait_for(
        lambda: [r for r in replicas(cluster, tiny) if r["node"] == "n1" and r["state"] == "ready"],
        90,
        "tiny's replica to be placed on n1",
    )
    assert moved[0]["replica_id"] != before["replica_id"]
    wait_for(lambda: site.node("n2")["stage"] == "lent", 60, "n2 to be lent")
    wait_for(lambda: "DRAIN" not in site.scontrol_node(), 60, "Slurm to resume n2")
    assert not psutil.pid_exists(before["pid"])
    assert cluster.nodes()["n2"]["slurm"] == "lent"
    assert cluster.nodes()["n2"]["cordoned"] is True
    ran = subprocess.run(
        ["srun", "-N1", "-w", "n2", "hostname"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip()
    metrics = metrics_text(cluster)
    assert 'llmgw_slurm_node_lent{node="n2"} 1' in metrics
    # llmgw still serves tiny, from n1.
    key = ctl_json(cluster, "keys", "create", "--name", "slurm-e2e")["key"]
    client = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key)
    reply = client.chat.completions.create(
        model=tiny, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices
    ctl(cluster, "slurm", "reclaim", "n2", "--wait", "--timeout", "60")
    _back_in_llmgw(site)


def test_reclaim_waits_for_the_running_job_then_gives_the_node_back(site: Site) -> None:
    cluster = site.cluster
    ctl(cluster, "slurm", "lend", "n2")
    wait_for(lambda: site.node("n2")["stage"] == "lent", 60, "n2 to be lent")
    wait_for(lambda: "DRAIN" not in site.scontrol_node(), 60, "Slurm to resume n2")
    # The job runs until the test lets it end (a file it waits for), however slow the
    # machine: the steps below must all see it running.
    done = site.root / "job-may-end"
    done.unlink(missing_ok=True)
    job = subprocess.Popen(
        ["srun", "-N1", "-w", "n2", "sh", "-c", f"until [ -e {done} ]; do sleep 0.2; done"],
        # srun hands its stdin to the job: none, so it never reads the test's.
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    reclaim: subprocess.Popen[str] | None = None
    try:
        # Slurm first: a job it holds pending (its scheduler passes every minute on a busy
        # machine) is on no node yet, so llmgw rightly shows none.
        def running_in_slurm() -> str:
            if job.poll() is not None:
                raise AssertionError(f"srun ended before its job ran: {job.communicate()}")
            return site.squeue("-t", "RUNNING")

        try:
            wait_for(running_in_slurm, 90, "Slurm to run the job on n2")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {site.squeue_all()}") from None
        wait_for(lambda: site.node("n2")["jobs"], 30, "llmgw to see the job running on n2")
        reclaim = subprocess.Popen(
            ctl_command(cluster, "slurm", "reclaim", "n2", "--wait", "--timeout", "90"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

        # Drained in Slurm at once (no new job lands), yet cordoned in llmgw while the
        # job's step runs.
        def reclaiming() -> dict[str, Any] | None:
            if reclaim.poll() is not None:
                raise AssertionError(f"reclaim --wait ended early: {reclaim.communicate()}")
            row = site.node("n2")
            return row if row["stage"] == "reclaiming" else None

        row = wait_for(reclaiming, 30, "n2 to be reclaiming")
        assert row["jobs"] and row["waiting_for"]
        wait_for(lambda: "DRAIN" in site.scontrol_node(), 30, "Slurm to drain n2")
        assert "llmgw: reclaimed" in site.scontrol_node()
        assert job.poll() is None, "the job must still run while n2 is reclaimed"
        assert cluster.nodes()["n2"]["cordoned"] is True
        assert site.node("n2")["stage"] == "reclaiming"
        # The job ends; only then does --wait return, and n2 is llmgw's.
        done.touch()
        _, job_err = job.communicate(timeout=60)
        assert job.returncode == 0, job_err
        out, _ = reclaim.communicate(timeout=90)
        assert reclaim.returncode == 0, out
        _back_in_llmgw(site)
    finally:
        done.touch()
        for proc in (job, reclaim):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                proc.communicate()


def ctl_command(cluster: Cluster, *args: str) -> list[str]:
    return [sys.executable, "-m", "llmgw", "ctl", *args, "--data-dir", str(cluster.data_dir)]


def test_an_administrators_drain_survives_lend_and_reclaim(site: Site) -> None:
    cluster = site.cluster
    subprocess.run(
        ["scontrol", "update", "nodename=n2", "state=drain", "reason=maintenance"],
        check=True,
        timeout=20,
    )
    try:
        wait_for(lambda: site.node("n2")["admin_drain"], 40, "llmgw to see the admin's drain")
        ctl(cluster, "slurm", "lend", "n2")
        wait_for(lambda: site.node("n2")["stage"] == "lent", 60, "n2 to be lent")
        # The agent has acted on lent=True (its report says lent, after the message).
        first = site.node("n2")
        assert first["lent"] is True
        wait_for(
            lambda: site.node("n2")["part"] == "slurmd" and site.node("n2")["state"],
            30,
            "a report of n2 after the lend",
        )
        assert "Reason=maintenance" in site.scontrol_node()
        ctl(cluster, "slurm", "reclaim", "n2", "--wait", "--timeout", "60")
        assert "Reason=maintenance" in site.scontrol_node()
    finally:
        subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], timeout=20)
    # Back to llmgw's own drain for the next test: the agent drains a node not lent.
    wait_for(lambda: "llmgw: reclaimed" in site.scontrol_node(), 60, "llmgw's drain again")
    _back_in_llmgw(site)


def test_refusals_change_nothing(site: Site, tiny: str) -> None:
    cluster = site.cluster
    before = site.status()
    unknown = ctl(cluster, "slurm", "lend", "nosuch", check=False)
    assert unknown.returncode != 0 and "nosuch" in unknown.stderr
    # With n1 cordoned, tiny's replica on n2 has nowhere else to go.
    ctl(cluster, "node", "cordon", "n1")
    try:
        nowhere = ctl(cluster, "slurm", "lend", "n2", check=False)
        assert nowhere.returncode != 0
        assert "tiny" in nowhere.stderr and "n1" in nowhere.stderr
    finally:
        ctl(cluster, "node", "uncordon", "n1")
    after = site.status()
    assert [(n["node"], n["stage"]) for n in after["nodes"]] == [
        (n["node"], n["stage"]) for n in before["nodes"]
    ]
    assert cluster.nodes()["n2"]["cordoned"] is False


def test_a_dead_slurmctld_keeps_nothing_from_llmgw(site: Site, tiny: str) -> None:
    """Last: it stops the module's slurmctld."""
    cluster = site.cluster
    (ctld,) = [p for p in _ours(site.root, site.ctld_port) if p.name() == "slurmctld"]
    ctld.send_signal(signal.SIGKILL)
    warning = wait_for(
        lambda: [w for w in site.status()["warnings"] if "slurmctld" in w],
        60,
        "a warning that slurmctld does not answer",
    )
    assert "n1" in warning[0] or str(site.ctld_port) in warning[0]
    # llmgw serves on, n2 included.
    nodes = cluster.nodes()
    assert nodes["n2"]["state"] == "Ready" and nodes["n2"]["cordoned"] is False
    key = ctl_json(cluster, "keys", "create", "--name", "slurm-e2e-dead")["key"]
    client = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key)
    started = time.monotonic()
    reply = client.chat.completions.create(
        model=tiny, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices and time.monotonic() - started < 30
