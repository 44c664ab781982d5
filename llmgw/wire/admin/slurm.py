"""The admin API's answers about Slurm beside llmgw (``GET /api/v1/slurm``, ``ctl slurm
status``): each node's part and stage, Slurm's own state of it, and the policy."""

from typing import TypedDict


class SlurmJobJson(TypedDict):
    """A job with a step on a node, as squeue lists it; ``end`` epoch seconds or null."""

    id: str
    name: str | None
    user: str | None
    state: str | None
    end: float | None


class SlurmNodeJson(TypedDict):
    """One node of Slurm's set, or the controller's node.

    ``part``: slurmctld, slurmd, both or none. ``stage`` is llmgw's side: ``serving``
    (llmgw's; drained in Slurm), ``lending`` (its replicas moving away first), ``lent``
    (Slurm's; cordoned in llmgw), ``reclaiming`` (drained in Slurm, cordoned in llmgw
    until its last job step ends). ``state``, ``reason``, ``jobs``, ``version`` are
    what the node's agent last read from Slurm (null: not read); ``waiting_for`` says
    what a lending or reclaiming node waits on; ``problem`` what is wrong, with its fix.
    """

    node: str
    name: str
    part: str
    stage: str
    lent: bool
    connected: bool
    state: str | None
    reason: str | None
    admin_drain: bool
    jobs: list[SlurmJobJson] | None
    steps: int | None
    version: str | None
    running: list[str]
    problem: str | None
    doing: str | None
    waiting_for: str | None


class SlurmPolicyJson(TypedDict):
    """Lending by policy (``ctl slurm policy``); off while ``lend_idle_after`` and
    ``reclaim_when_queued`` are null. Durations in seconds."""

    lend_idle_after: float | None
    keep_free_gpus: int
    reclaim_when_queued: float | None


class SlurmJson(TypedDict):
    """``GET /api/v1/slurm``: whether llmgw runs Slurm's configuration, where, and each
    node's part; ``next`` is what the policy would do at its next pass, in words."""

    enabled: bool
    controller: str | None
    conf_server: str | None
    partition: str
    ctld_port: int
    slurmd_port: int
    root: str
    nodes: list[SlurmNodeJson]
    policy: SlurmPolicyJson
    next: list[str]
    warnings: list[str]


class SlurmFilesJson(TypedDict):
    """``GET /api/v1/slurm/conf``: the files the control plane writes for slurmctld."""

    slurm_conf: str
    gres_conf: str
    cgroup_conf: str
