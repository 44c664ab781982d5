"""A ``GET /api/v1/slurm`` answer as the control plane gives it, for the console's and
the pages' tests: n1 runs slurmctld and slurmd and serves llmgw, n2 is lent with a job
running, n3 is being reclaimed with slurmctld not answering (jobs not read) and munge
broken on it, n4 is drained by a Slurm administrator; a warning, and the policy on with
its next step."""

from __future__ import annotations

from typing import Any

from llmgw.wire.admin import SlurmJson, SlurmNodeJson

NOW = 1_900_000_000.0
PROBLEM = (
    "munge: munged is not running (the key at /etc/munge/munge.key is not the cluster's). "
    "Fix: restart the agent, which writes the key the control plane sends"
)
WARNING = (
    "slurmctld on n1 does not answer. Fix: see `journalctl -u slurmctld` on n1; llmgw "
    "keeps serving on every node"
)
NEXT = "lend n1: its cards served nothing for 31 min (policy: 30 min)"
JOB_END = NOW + 600


def slurm_node(node: str, part: str, stage: str, **given: Any) -> SlurmNodeJson:
    n: SlurmNodeJson = {
        "node": node,
        "name": node,
        "part": part,
        "stage": stage,
        "lent": stage == "lent",
        "connected": True,
        "state": "IDLE+DRAIN",
        "reason": "llmgw: not lent",
        "admin_drain": False,
        "jobs": [],
        "steps": 0,
        "version": "22.05.8",
        "running": ["munge", "slurmd"],
        "problem": None,
        "doing": None,
        "waiting_for": None,
    }
    n.update(given)  # type: ignore[typeddict-item]
    return n


def slurm_json() -> SlurmJson:
    return {
        "enabled": True,
        "controller": "n1",
        "conf_server": "10.0.0.1:6817",
        "partition": "llmgw",
        "ctld_port": 6817,
        "slurmd_port": 6818,
        "root": "",
        "nodes": [
            slurm_node("n1", "both", "serving", running=["munge", "slurmctld", "slurmd"]),
            slurm_node(
                "n2",
                "slurmd",
                "lent",
                state="MIXED",
                reason=None,
                jobs=[
                    {
                        "id": "41",
                        "name": "train",
                        "user": "ayse",
                        "state": "RUNNING",
                        "end": JOB_END,
                    }
                ],
                steps=1,
            ),
            slurm_node(
                "n3",
                "slurmd",
                "reclaiming",
                state="ALLOCATED+DRAIN",
                reason="llmgw: reclaimed",
                jobs=None,
                steps=None,
                waiting_for="job 42 to end (srun sleep)",
                problem=PROBLEM,
            ),
            slurm_node("n4", "slurmd", "serving", reason="maintenance", admin_drain=True),
        ],
        "policy": {"lend_idle_after": 1800.0, "keep_free_gpus": 2, "reclaim_when_queued": 60.0},
        "next": [NEXT],
        "warnings": [WARNING],
    }


def slurm_off() -> SlurmJson:
    off = slurm_json()
    off.update(enabled=False, controller=None, conf_server=None, nodes=[], next=[], warnings=[])
    off["policy"] = {"lend_idle_after": None, "keep_free_gpus": 0, "reclaim_when_queued": None}
    return off
