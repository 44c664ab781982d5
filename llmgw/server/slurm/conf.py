"""slurm.conf, gres.conf and cgroup.conf written from what the agents report: pure
functions, no IO (the Slurm service sends the text to the controller's node).

- ``conf_node`` makes one node of slurm.conf from its reports: ``slurmd -C``'s figures
  (``SlurmStatus.facts``) when the agent gave them, else the host facts (CPU count and
  memory), and its cards from the host facts. A node that says neither how many CPUs it
  has is left out (None) until it does: Slurm would take it for a one-CPU node.
- ``gres_type`` names a card as Slurm's own AutoDetect does, so a gres.conf written by
  llmgw and one a Slurm administrator wrote with ``AutoDetect=nvml`` ask for the same
  ``--gres=gpu:<type>:N``.
- ``render`` writes the three files. Every node enters drained with our reason: Slurm
  keeps a known node's state in its state files across restarts, so ``State=`` only
  says how a *new* node enters, and lending one is a resume, done by its agent.
- gres.conf lists each card by its device file. A MIG instance is a gres of its own
  (``<card type>_<profile>``) whose file is its card's; slurmd 22.05 refuses a gpu file
  named twice and a node mixing records with and without files, so a node whose cards
  share a file has them counted by type (``Count=``) instead. A card in MIG mode is its
  instances: its own record is no gres.
- A value that would break a file (a NodeName with a space or '=', a partition with a
  space, a relative root) raises ValueError naming it, and so does a cluster of no node
  (slurmctld will not start without a partition): the service turns it into a refusal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from llmgw.server.requests import NODE_ID, SLURM_PARTITION
from llmgw.wire.hardware import GPU, HostFacts
from llmgw.wire.messages import OUR_REASON_PREFIX, SlurmStatus
from llmgw.wire.slurmpaths import slurm_paths

MiB = 1 << 20
# How a node llmgw has not lent enters slurm.conf (a drain of ours: its agent may resume it).
NOT_LENT_REASON = f"{OUR_REASON_PREFIX} not lent"
# A gres type, a NodeAddr and a device file: no blank, '=', ',', ':', '#' or quote, each
# of which ends a value or a list in Slurm's parser.
_GRES_TYPE = re.compile(r"[a-z0-9][a-z0-9._+-]*")
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_DEVICE = re.compile(r"/[A-Za-z0-9._/-]+")
_CLUSTER = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
_PATH_BREAKERS = re.compile(r"[\s#\",=]")
WRITTEN_BY = (
    "# Written by llmgw from its agents' reports: do not edit by hand\n"
    "# (`llmgw ctl slurm setup` writes it again)."
)


@dataclass(frozen=True)
class ConfCard:
    """One gres line: a card, or one MIG instance, as Slurm counts it."""

    type: str  # "nvidia_h100_80gb_hbm3"; a MIG instance "<card type>_<profile>"
    files: tuple[str, ...]  # File= (one) or MultipleFiles= (several)


@dataclass(frozen=True)
class ConfNode:
    """One node of slurm.conf; a figure not known is left out of its line."""

    name: str  # NodeName (the llmgw node id)
    address: str  # NodeAddr
    cpus: int
    boards: int | None = None
    sockets_per_board: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    real_memory: int | None = None  # MiB
    gpus: tuple[ConfCard, ...] = ()


@dataclass(frozen=True)
class ConfCluster:
    """The whole of a cluster's Slurm as llmgw writes it."""

    controller_host: str  # the controller node's short hostname: slurmctld runs only there
    controller_address: str
    ctld_port: int
    slurmd_port: int
    partition: str
    root: str  # "" : the system's own paths (see llmgw.wire.slurmpaths)
    nodes: tuple[ConfNode, ...]
    cgroups: bool  # every node can confine jobs with cgroup v2
    cluster_name: str = "llmgw"


@dataclass(frozen=True)
class SlurmFiles:
    slurm_conf: str
    gres_conf: str
    cgroup_conf: str


def gres_type(gpu_name: str) -> str:
    """A card's gres type as Slurm's AutoDetect names it: the product name lower-cased,
    its spaces made "_" ("NVIDIA A100-SXM4-80GB" -> "nvidia_a100-sxm4-80gb")."""
    return "_".join(gpu_name.strip().lower().split())


def _card(gpu: GPU) -> ConfCard | None:
    # The device file is the card's index as the agent reports it: for a MIG instance,
    # its parent card's (instances have no /dev/nvidiaN of their own).
    files = (f"/dev/nvidia{gpu.index}",)
    if gpu.mig_parent is not None:
        return ConfCard(f"{gres_type(gpu.name)}_{gpu.mig_profile or 'mig'}", files)
    if gpu.mig_mode:
        return None  # a card in MIG mode is its instances; with none carved, nothing to run on
    return ConfCard(gres_type(gpu.name), files)


def conf_node(
    name: str, address: str, facts: HostFacts | None, status: SlurmStatus | None
) -> ConfNode | None:
    """The node's slurm.conf entry from ``slurmd -C`` (``status.facts``) or, before the
    agent ran it, the host facts; None when neither says how many CPUs it has."""
    cards = tuple(c for c in map(_card, facts.gpus if facts else ()) if c is not None)
    host_memory = (
        facts.memory_total // MiB if facts is not None and facts.memory_total is not None else None
    )
    slurmd = status.facts if status is not None else None
    if slurmd is not None:
        return ConfNode(
            name,
            address,
            slurmd.cpus,
            boards=slurmd.boards,
            sockets_per_board=slurmd.sockets_per_board,
            cores_per_socket=slurmd.cores_per_socket,
            threads_per_core=slurmd.threads_per_core,
            real_memory=slurmd.real_memory if slurmd.real_memory is not None else host_memory,
            gpus=cards,
        )
    if facts is None or facts.cpu_count is None:
        return None
    return ConfNode(name, address, facts.cpu_count, real_memory=host_memory, gpus=cards)


# --- checks: a value that would break a file is refused, named ---------------------------


def _check(value: str, pattern: re.Pattern[str], what: str, allowed: str) -> str:
    if not pattern.fullmatch(value):
        raise ValueError(f"{what} {value!r} cannot be written into Slurm's files: {allowed}")
    return value


def _check_cluster(cluster: ConfCluster) -> None:
    _check(
        cluster.cluster_name,
        _CLUSTER,
        "cluster name",
        "use lower-case letters, digits, '_' or '-', up to 40",
    )
    _check(
        cluster.controller_host,
        NODE_ID,
        "controller host name",
        "SlurmctldHost is a short host name (letters, digits, '.', '_' or '-')",
    )
    _check(cluster.controller_address, _ADDRESS, "controller address", "give an IP address")
    _check(
        cluster.partition,
        SLURM_PARTITION,
        "partition",
        "use letters, digits, '_' or '-', up to 32, without spaces",
    )
    for port, what in ((cluster.ctld_port, "slurmctld port"), (cluster.slurmd_port, "slurmd port")):
        if not 1 <= port <= 65535:
            raise ValueError(f"{what} {port} is not a TCP port: give one from 1 to 65535")
    if _PATH_BREAKERS.search(cluster.root):
        raise ValueError(
            f"root {cluster.root!r} cannot be written into Slurm's files: "
            "give an absolute path without spaces, '#', ',', '=' or quotes"
        )
    if cluster.root and not PurePosixPath(cluster.root).is_absolute():
        raise ValueError(f"root {cluster.root!r} is not an absolute path: give one from /")
    if not cluster.nodes:
        # slurmctld 22.05 stops at once without a partition ("No PartitionName
        # information available!"), and a partition without nodes is not one.
        raise ValueError(
            "no node to write into slurm.conf: slurmctld needs at least one; "
            "give nodes whose agents have reported their CPUs"
        )
    names: set[str] = set()
    for node in cluster.nodes:
        _check(node.name, NODE_ID, "node name", "a NodeName is letters, digits, '.', '_' or '-'")
        if node.name in names:
            raise ValueError(f"node name {node.name!r} is given twice: each NodeName once")
        names.add(node.name)
        _check(node.address, _ADDRESS, f"address of node {node.name}", "give an IP address")
        if node.cpus < 1:
            raise ValueError(f"node {node.name} has {node.cpus} CPUs: Slurm needs at least one")
        for card in node.gpus:
            _check(
                card.type,
                _GRES_TYPE,
                f"gres type of node {node.name}",
                "use lower-case letters, digits, '.', '_', '+' or '-'",
            )
            if not card.files:
                raise ValueError(f"a {card.type} card of node {node.name} has no device file")
            for path in card.files:
                _check(path, _DEVICE, f"device file of node {node.name}", "give an absolute path")


# --- the files ---------------------------------------------------------------------------


def _node_line(node: ConfNode) -> str:
    figures = (
        ("CPUs", node.cpus),
        ("Boards", node.boards),
        ("SocketsPerBoard", node.sockets_per_board),
        ("CoresPerSocket", node.cores_per_socket),
        ("ThreadsPerCore", node.threads_per_core),
        ("RealMemory", node.real_memory),
    )
    words = [f"NodeName={node.name}", f"NodeAddr={node.address}"]
    words += [f"{key}={value}" for key, value in figures if value is not None]
    counts: dict[str, int] = {}
    for card in node.gpus:
        counts[card.type] = counts.get(card.type, 0) + 1
    if counts:
        words.append("Gres=" + ",".join(f"gpu:{t}:{n}" for t, n in counts.items()))
    words += ["State=DRAIN", f'Reason="{NOT_LENT_REASON}"']
    return " ".join(words)


def _slurm_conf(cluster: ConfCluster) -> str:
    paths = slurm_paths(cluster.root)
    gres = any(node.gpus for node in cluster.nodes)
    if cluster.cgroups:
        confine = ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup,task/affinity"]
    else:
        confine = [
            "# Not every node can confine jobs with cgroup v2: processes are tracked by",
            "# their parent (no limits on cores, memory or devices).",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
        ]
    lines = [
        "# slurm.conf",
        WRITTEN_BY,
        f"ClusterName={cluster.cluster_name}",
        f"SlurmctldHost={cluster.controller_host}({cluster.controller_address})",
        f"SlurmctldPort={cluster.ctld_port}",
        f"SlurmdPort={cluster.slurmd_port}",
        "# The agent runs slurmctld as root and makes its state directory as root: a",
        "# SlurmUser of another name would have slurmctld drop to a user that may not exist",
        "# yet on the node and cannot write there.",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "# slurmd on every node is started with --conf-server and fetches these files.",
        "SlurmctldParameters=enable_configless",
        f"StateSaveLocation={paths.state_save}",
        f"SlurmdSpoolDir={paths.slurmd_spool}",
        f"SlurmctldLogFile={paths.ctld_log}",
        f"SlurmdLogFile={paths.slurmd_log}",
        f"SlurmctldPidFile={paths.ctld_pid}",
        f"SlurmdPidFile={paths.slurmd_pid}",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "MpiDefault=none",
        *confine,
    ]
    if gres:
        lines.append("GresTypes=gpu")
    lines += [
        "",
        "# Nodes enter drained; llmgw resumes the ones it lends. Slurm keeps a known node's",
        "# state across restarts, so State= here only says how a new node enters.",
        *(_node_line(node) for node in cluster.nodes),
    ]
    names = ",".join(node.name for node in cluster.nodes)
    lines.append(
        f"PartitionName={cluster.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


def _gres_lines(node: ConfNode) -> list[str]:
    head = f"NodeName={node.name} Name=gpu"
    files = [path for card in node.gpus for path in card.files]
    if len(set(files)) < len(files):
        # Cards that share a device file (a card's MIG instances all have the card's):
        # slurmd refuses a gpu file named twice ("gpu duplicate device file name") and
        # a node whose gpu records mix File= and none ("some records have File
        # specification while others do not"), so such a node's cards are counted.
        counts: dict[str, int] = {}
        for card in node.gpus:
            counts[card.type] = counts.get(card.type, 0) + 1
        return [f"{head} Type={t} Count={n}" for t, n in counts.items()]
    return [
        f"{head} Type={card.type} "
        + (
            f"File={card.files[0]}"
            if len(card.files) == 1
            else f"MultipleFiles={','.join(card.files)}"
        )
        for card in node.gpus
    ]


def _gres_conf(cluster: ConfCluster) -> str:
    lines = [
        "# gres.conf",
        WRITTEN_BY,
        "# Each card is listed by its device file, so NVML is not needed on the nodes.",
        "# A MIG instance is a gres of its own (<card type>_<profile>). Slurm confines a",
        "# job to one instance only with AutoDetect=nvml, which Debian's Slurm is built",
        "# without; and as all instances of a card have the card's device file, a node",
        "# with MIG instances has its cards counted (Count=), not tracked by file.",
    ]
    if any(node.gpus for node in cluster.nodes):
        lines.append("AutoDetect=off")
    for node in cluster.nodes:
        lines += _gres_lines(node)
    return "\n".join(lines) + "\n"


def _cgroup_conf(cluster: ConfCluster) -> str:
    lines = ["# cgroup.conf", WRITTEN_BY]
    if cluster.cgroups:
        lines += [
            "CgroupPlugin=cgroup/v2",
            "ConstrainCores=yes",
            "ConstrainRAMSpace=yes",
            "ConstrainDevices=yes",
        ]
    else:
        lines += [
            "# Not used: not every node can confine jobs with cgroup v2 (its controllers",
            "# mounted and systemd running), so slurm.conf tracks jobs with",
            "# proctrack/linuxproc and task/none.",
        ]
    return "\n".join(lines) + "\n"


def render(cluster: ConfCluster) -> SlurmFiles:
    """The three files for ``cluster``; ValueError naming any value that would break one."""
    _check_cluster(cluster)
    return SlurmFiles(_slurm_conf(cluster), _gres_conf(cluster), _cgroup_conf(cluster))
