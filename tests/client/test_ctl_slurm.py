"""``llmgw ctl slurm`` against a real control plane's admin API over HTTP, with fake
agents registered on it: the status table and ``--json`` (SlurmJson exactly), setup,
lend, ``reclaim --wait`` printing what it waits for, off, policy, conf, a refusal in
the control plane's words, and ``ctl nodes`` marking a lent node."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.cli import main
from llmgw.client.ctl_slurm import wait_back
from llmgw.wire.admin import SlurmJson
from llmgw.wire.messages import SlurmJob
from tests.server.slurm.fleet import register_node
from tests.server.slurm.fleet import report_slurm as report_now
from tests.support.adminserver import Served, serving


@pytest.fixture
def cp(tmp_path: Path) -> Iterator[Served]:
    with serving(tmp_path / "data") as served:
        served.run(register_node(served.cp, "a", "127.0.0.1"))
        served.run(register_node(served.cp, "b", "127.0.0.2", cpus=8))
        yield served


def report_slurm(served: Served, node_id: str, **said: Any) -> None:
    """The node's agent reports Slurm, on the control plane's own loop."""

    async def report() -> None:
        report_now(served.cp, node_id, **said)

    served.run(report())


class Ctl:
    def __init__(self, served: Served, capsys: pytest.CaptureFixture[str]) -> None:
        self.served = served
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        given = ["--server", self.served.base, "--token", self.served.token]
        try:
            code = main(["ctl", *argv, *given])
        except SystemExit as exc:
            code = 1 if exc.code else 0
            print(exc.code, file=sys.stderr)
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> Any:
        code, out, err = self(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def ctl(cp: Served, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(cp, capsys)


def test_status_setup_lend_and_off_print_the_nodes_and_json_is_the_api(
    ctl: Ctl, cp: Served
) -> None:
    code, out, _ = ctl("slurm", "status")
    assert code == 0 and "Slurm is off" in out and "llmgw ctl slurm setup" in out
    shown = ctl.json("slurm", "setup", "--controller", "a", "--partition", "gpu")
    assert shown["controller"] == "a" and shown["partition"] == "gpu"
    report_slurm(cp, "b", state="IDLE+DRAIN", reason="bad DIMM")
    lent = ctl.json("slurm", "lend", "b")
    assert {n["node"]: n["stage"] for n in lent["nodes"]} == {"a": "serving", "b": "lent"}
    code, out, _ = ctl("slurm", "status")
    assert code == 0
    head, table = out.split("\n\n")[:2]
    assert "slurmctld on a (127.0.0.1:6817), partition gpu" in head
    heads, *rows = table.splitlines()
    assert heads.split()[:4] == ["NODE", "PART", "STAGE", "SLURM"]
    row_b = next(r for r in rows if r.startswith("b "))
    assert row_b.split()[:4] == ["b", "slurmd", "lent", "IDLE+DRAIN"]
    assert "an administrator's drain" in row_b and "22.05.8" in row_b
    # --json is GET /api/v1/slurm exactly.
    api = cp.run(_get(cp))
    assert ctl.json("slurm", "status") == api
    # ctl nodes marks the lent node.
    code, out, _ = ctl("nodes")
    assert code == 0
    marks = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:] if line.strip()}
    assert marks["b"].endswith(",lent") and "lent" not in marks["a"]
    policy = ctl.json(
        "slurm",
        "policy",
        "--lend-idle-after",
        "30m",
        "--keep-free-gpus",
        "2",
        "--reclaim-when-queued",
        "60s",
    )
    assert policy["policy"] == {
        "lend_idle_after": 1800.0,
        "keep_free_gpus": 2,
        "reclaim_when_queued": 60.0,
    }
    code, out, _ = ctl("slurm", "status")
    assert "Policy: lend after 30 min idle, keep 2 card(s) free" in out
    code, out, _ = ctl("slurm", "conf")
    assert code == 0 and "# ---- slurm.conf" in out and "NodeName=b" in out
    off = ctl.json("slurm", "off", "--now")
    assert off["enabled"] is False
    assert not cp.cp.registry.nodes["b"].cordoned


async def _get(cp: Served) -> SlurmJson:
    return cp.cp.slurm.service.status()


def test_a_refusal_is_the_control_planes_words(ctl: Ctl) -> None:
    code, _, err = ctl("slurm", "lend", "a")
    assert code != 0 and "Slurm is off" in err and "llmgw ctl slurm setup" in err
    ctl.json("slurm", "setup", "--controller", "a", "--nodes", "a")
    code, _, err = ctl("slurm", "lend", "b")
    assert code != 0 and "not one of Slurm's nodes" in err


def test_reclaim_wait_says_what_it_waits_for_until_the_node_is_back(ctl: Ctl, cp: Served) -> None:
    ctl.json("slurm", "setup", "--controller", "a")
    ctl.json("slurm", "lend", "b")
    report_slurm(
        cp,
        "b",
        state="MIXED+DRAIN",
        reason="llmgw: reclaimed",
        jobs=[SlurmJob(id="42")],
        steps=1,
    )
    asked: list[int] = []

    def status() -> SlurmJson:
        asked.append(1)
        if len(asked) == 3:  # the job ends; the keeper's pass gives the node back
            report_slurm(cp, "b", state="IDLE+DRAIN", reason="llmgw: reclaimed")
            cp.run(cp.cp.slurm.keeper.pass_once())
        return cp.run(_get(cp))

    code, _, _ = ctl("slurm", "reclaim", "b")
    assert code == 0
    said: list[str] = []
    assert wait_back(status, ["b"], 60, said.append, pause=lambda s: None)
    assert said == ["b: waiting for its jobs to end (42)"]
    assert len(asked) == 3 and not cp.cp.registry.nodes["b"].cordoned


def test_reclaim_wait_gives_up_after_its_timeout(ctl: Ctl, cp: Served) -> None:
    ctl.json("slurm", "setup", "--controller", "a")
    ctl.json("slurm", "lend", "b")
    report_slurm(cp, "b", state="ALLOCATED", reason=None, jobs=[SlurmJob(id="5")], steps=1)
    code, out, err = ctl("slurm", "reclaim", "b", "--wait", "--timeout", "0")
    assert code != 0
    assert "b: waiting for Slurm to drain it" in out or "b: waiting for its jobs" in out
    assert "still reclaiming after 0 s" in err
