"""What Slurm beside llmgw is now, read from the settings and the registry alone (so a
new leader reads the same): each node's stage and part, the files slurmctld reads as
the nodes report themselves, the message each agent is told, ``GET /api/v1/slurm``'s
answer and ``/metrics``' lines. ``SlurmService`` (``service.py``) adds the workflows.

Stages: ``serving`` (in Slurm's set, llmgw's), ``lending`` (wanted in Slurm, replicas
still on it), ``lent`` (wanted in Slurm, no replica left), ``reclaiming`` (being taken
back; the keeper gives it back to llmgw once its agent reports no job step).
"""

from __future__ import annotations

import base64
import logging
from dataclasses import replace

from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.slurm.conf import ConfCluster, SlurmFiles, conf_node, render
from llmgw.server.slurm.settings import KeptSlurm, SlurmSettings
from llmgw.wire.admin import SlurmFilesJson, SlurmJobJson, SlurmJson, SlurmNodeJson
from llmgw.wire.messages import OUR_REASON_PREFIX, Slurm, SlurmStatus

log = logging.getLogger("llmgw.slurm")

# Slurm before 22.05 cannot run configless beside cgroup v2 as llmgw writes it.
OLDEST = (22, 5)


def version_tuple(version: str) -> tuple[int, ...] | None:
    parts: list[int] = []
    for piece in version.split(".")[:2]:
        if not piece.isdigit():
            return None
        parts.append(int(piece))
    return tuple(parts) if parts else None


def too_old(status: SlurmStatus | None) -> str | None:
    """The Slurm version a node's agent reported, when it is older than 22.05."""
    if status is None or not status.installed:
        return None
    found = version_tuple(status.installed)
    return status.installed if found is not None and found < OLDEST else None


def admin_drain(status: SlurmStatus | None) -> bool:
    """Drained in Slurm by someone else than llmgw: never resumed, never overwritten."""
    if status is None or not status.state or "DRAIN" not in status.state.upper():
        return False
    return not (status.reason or "").startswith(OUR_REASON_PREFIX)


def drained(status: SlurmStatus | None) -> bool:
    return status is not None and "DRAIN" in (status.state or "").upper()


def short_host(view: NodeView) -> str:
    name = view.facts.hostname if view.facts and view.facts.hostname else view.id
    return name.split(".")[0]


class SlurmView:
    def __init__(self, kept: KeptSlurm, registry: NodeRegistry) -> None:
        self.kept = kept
        self.registry = registry
        # What lending by policy would do at its next pass, in words (set by its pass).
        self.next: list[str] = []

    @property
    def settings(self) -> SlurmSettings:
        return self.kept.now

    # ------------------------------------------------------------------ reading

    def members(self, s: SlurmSettings | None = None) -> list[str]:
        """The nodes in Slurm's set, sorted."""
        s = s or self.settings
        if not s.enabled:
            return []
        every = sorted(self.registry.nodes)
        return every if s.nodes is None else [n for n in every if n in s.nodes]

    def stage_of(self, node_id: str) -> str | None:
        """The node's stage when it is in Slurm's set (or being taken back), else None."""
        s = self.settings
        if node_id in s.reclaim:
            return "reclaiming"
        if node_id in s.lend:
            view = self.registry.nodes.get(node_id)
            return "lending" if view is not None and view.shards else "lent"
        return "serving" if s.in_set(node_id) else None

    def part_of(self, node_id: str, s: SlurmSettings | None = None) -> str:
        s = s or self.settings
        if not s.enabled:
            return "none"
        ctld = node_id == s.controller
        slurmd = s.in_set(node_id) or node_id in s.reclaim or node_id in s.lend
        return (
            "both" if ctld and slurmd else "slurmctld" if ctld else "slurmd" if slurmd else "none"
        )

    def _cluster(self, s: SlurmSettings) -> ConfCluster | None:
        """slurm.conf's cluster as the nodes report themselves now; None without a
        controller heard from."""
        views = self.registry.nodes
        ctld = views.get(s.controller or "")
        if ctld is None or ctld.address is None:
            return None
        nodes = []
        statuses = []
        for node_id in self.members(s):
            view = views[node_id]
            if view.address is None:
                continue  # never registered: no NodeAddr to write yet
            found = conf_node(node_id, view.address, view.facts, view.slurm)
            if found is not None:
                nodes.append(found)
                statuses.append(view.slurm)
        cgroups = bool(statuses) and all(st is not None and st.cgroup_v2 for st in statuses)
        return ConfCluster(
            controller_host=short_host(ctld),
            controller_address=ctld.address,
            ctld_port=s.ctld_port,
            slurmd_port=s.slurmd_port,
            partition=s.partition,
            root=s.root,
            nodes=tuple(nodes),
            cgroups=cgroups,
        )

    def rendered(self, s: SlurmSettings | None = None) -> SlurmFiles | None:
        """The files slurmctld reads, as the nodes report themselves now."""
        s = s or self.settings
        cluster = self._cluster(s) if s.enabled else None
        return render(cluster) if cluster is not None else None

    def files(self) -> SlurmFilesJson:
        try:
            files = self.rendered()
        except ValueError:
            files = None
        if files is None:
            return {"slurm_conf": "", "gres_conf": "", "cgroup_conf": ""}
        return {
            "slurm_conf": files.slurm_conf,
            "gres_conf": files.gres_conf,
            "cgroup_conf": files.cgroup_conf,
        }

    def conf_server(self, s: SlurmSettings | None = None) -> str | None:
        s = s or self.settings
        view = self.registry.nodes.get(s.controller or "")
        if not s.enabled or view is None:
            return None
        host = view.address or short_host(view)
        return f"[{host}]:{s.ctld_port}" if ":" in host else f"{host}:{s.ctld_port}"

    def message_for(self, node_id: str, files: SlurmFiles | None = None) -> Slurm:
        """The node's part as its agent is told it (part "none": Slurm off, or the
        node not in it). ``files``: rendered once for a whole pass."""
        s = self.settings
        part = self.part_of(node_id, s)
        if part == "none":
            return Slurm(version=s.version)
        key = self.kept.munge_key()
        message = Slurm(
            version=s.version,
            part=part,
            lent=self.stage_of(node_id) == "lent",
            name=node_id,
            conf_server=self.conf_server(s),
            munge_key=base64.b64encode(key).decode() if key else None,
            root=s.root,
        )
        if part in ("slurmctld", "both"):
            try:
                files = files or self.rendered(s)
            except ValueError as exc:
                log.warning("slurm.conf cannot be written: %s", exc)
                files = None
            if files is not None:
                message = replace(
                    message,
                    slurm_conf=files.slurm_conf,
                    gres_conf=files.gres_conf,
                    cgroup_conf=files.cgroup_conf,
                )
        return message

    def waiting_for(self, node_id: str) -> str | None:
        """What a lending or reclaiming node waits on, in words."""
        stage = self.stage_of(node_id)
        view = self.registry.nodes.get(node_id)
        if view is None or stage not in ("lending", "reclaiming"):
            return None
        if stage == "lending":
            return f"its {len(view.shards)} replica(s) to move to other nodes"
        status = view.slurm
        if status is None:
            return "its agent to report Slurm's state of it"
        jobs = status.jobs or []
        if jobs or (status.steps or 0) > 0:
            names = ", ".join(j.id for j in jobs) or f"{status.steps} job step(s)"
            return f"its jobs to end ({names})"
        if not drained(status) and not status.problem:
            return "Slurm to drain it"
        return None

    def node_json(self, node_id: str) -> SlurmNodeJson:
        view = self.registry.nodes.get(node_id)
        status = view.slurm if view is not None else None
        jobs: list[SlurmJobJson] | None = None
        if status is not None and status.jobs is not None:
            jobs = [
                {"id": j.id, "name": j.name, "user": j.user, "state": j.state, "end": j.end}
                for j in status.jobs
            ]
        return {
            "node": node_id,
            "name": node_id,
            "part": self.part_of(node_id),
            "stage": self.stage_of(node_id) or "serving",
            "lent": self.stage_of(node_id) == "lent",
            "connected": view is not None and view.session is not None,
            "state": status.state if status else None,
            "reason": status.reason if status else None,
            "admin_drain": admin_drain(status),
            "jobs": jobs,
            "steps": status.steps if status else None,
            "version": status.installed if status else None,
            "running": list(status.running) if status else [],
            "problem": status.problem if status else None,
            "doing": status.doing if status else None,
            "waiting_for": self.waiting_for(node_id),
        }

    def warnings(self) -> list[str]:
        s = self.settings
        if not s.enabled:
            return []
        out: list[str] = []
        ctld = self.registry.nodes.get(s.controller or "")
        if ctld is None or ctld.session is None:
            out.append(
                f"slurmctld's node {s.controller} is not connected: Slurm runs no job "
                "until it is back (or pick another with `llmgw ctl slurm setup --controller`)"
            )
        for node_id in sorted({*self.members(s), *s.lend, *s.reclaim, s.controller or ""}):
            view = self.registry.nodes.get(node_id)
            if view is not None and view.slurm is not None and view.slurm.problem:
                out.append(f"{node_id}: {view.slurm.problem}")
        try:
            self.rendered(s)
        except ValueError as exc:
            out.append(f"slurm.conf cannot be written: {exc}")
        return out

    def status(self) -> SlurmJson:
        s = self.settings
        shown = sorted(
            {*self.members(s), *s.lend, *s.reclaim}
            | ({s.controller} if s.enabled and s.controller else set())
        )
        return {
            "enabled": s.enabled,
            "controller": s.controller if s.enabled else None,
            "conf_server": self.conf_server(s),
            "partition": s.partition,
            "ctld_port": s.ctld_port,
            "slurmd_port": s.slurmd_port,
            "root": s.root,
            "nodes": [self.node_json(n) for n in shown],
            "policy": {
                "lend_idle_after": s.policy.lend_idle_after,
                "keep_free_gpus": s.policy.keep_free_gpus,
                "reclaim_when_queued": s.policy.reclaim_when_queued,
            },
            "next": list(self.next) if s.enabled else [],
            "warnings": self.warnings(),
        }

    def metrics(self) -> list[str]:
        """``/metrics``' lines: each node of Slurm's set, lent (1) or not (0), and the
        jobs on each lent node (absent where its agent could not read them)."""
        s = self.settings
        nodes = sorted({*self.members(s), *s.lend, *s.reclaim})
        if not nodes:
            return []
        lent = [n for n in nodes if self.stage_of(n) == "lent"]
        lines = [
            "# HELP llmgw_slurm_node_lent Whether the node is lent to Slurm (1) or llmgw's (0)",
            "# TYPE llmgw_slurm_node_lent gauge",
            *(f'llmgw_slurm_node_lent{{node="{n}"}} {int(n in lent)}' for n in nodes),
            "# HELP llmgw_slurm_node_jobs Slurm jobs with a step on a lent node",
            "# TYPE llmgw_slurm_node_jobs gauge",
        ]
        for node_id in lent:
            view = self.registry.nodes.get(node_id)
            jobs = view.slurm.jobs if view is not None and view.slurm is not None else None
            if jobs is not None:
                lines.append(f'llmgw_slurm_node_jobs{{node="{node_id}"}} {len(jobs)}')
        return lines
