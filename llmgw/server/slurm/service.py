"""Every Slurm workflow of the control plane (``llmgw ctl slurm``): handlers, pages and
the console call these and nothing else.

``setup`` turns Slurm on (or changes what it names and keeps the rest), ``lend`` moves
nodes to Slurm (their replicas placed elsewhere first: drained in llmgw, cordoned when
they run none), ``reclaim`` takes them back, ``off`` reclaims every lent node and turns
Slurm off once none is left (at once with ``now``), ``policy`` sets lending by policy.
Each is refused with nothing changed when it cannot be done, and audited when done.

A node's stage is worked out from the settings and the registry, never kept apart:
``serving`` (in Slurm's set, llmgw's), ``lending`` (wanted in Slurm, replicas still on
it), ``lent`` (wanted in Slurm, no replica left), ``reclaiming`` (being taken back; the
keeper gives it back to llmgw once its agent reports no job step). So a new leader,
reading the same settings and the agents' reports, is where the last one was.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Collection
from dataclasses import replace

from llmgw.server.fleet.registry import NodeRegistry, NodeView
from llmgw.server.fleet.service import FleetService
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import SlurmNodes, SlurmPolicySet, SlurmSetup
from llmgw.server.slurm.conf import ConfCluster, SlurmFiles, conf_node, render
from llmgw.server.slurm.settings import KeptSlurm, SlurmPolicy, SlurmSettings
from llmgw.wire.admin import SlurmFilesJson, SlurmJobJson, SlurmJson, SlurmNodeJson
from llmgw.wire.messages import OUR_REASON_PREFIX, Slurm, SlurmStatus
from llmgw.wire.states import NodeState

log = logging.getLogger("llmgw.slurm")

# Slurm before 22.05 cannot run configless beside cgroup v2 as llmgw writes it.
OLDEST = (22, 5)
# Every replica on some nodes placed on the fleet without them, or a Refusal.
CheckLeaving = Callable[[Collection[str]], None]


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


class SlurmService:
    def __init__(
        self,
        kept: KeptSlurm,
        registry: NodeRegistry,
        fleet: FleetService,
        check_leaving: CheckLeaving,
        changed: Callable[[], None],
    ) -> None:
        """``check_leaving``: the catalog's judge of whether the nodes' replicas fit
        elsewhere (``Room.check_leaving``); ``changed``: after every change (the keeper
        runs a pass and sends the nodes their messages)."""
        self.kept = kept
        self.registry = registry
        self.fleet = fleet
        self.check_leaving = check_leaving
        self.changed = changed
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

    # ---------------------------------------------------------------- refusals

    def _views(self, nodes: Collection[str]) -> list[NodeView]:
        unknown = [n for n in nodes if n not in self.registry.nodes]
        if unknown:
            raise Refusal(
                404,
                "not_found",
                f"no node {', '.join(repr(n) for n in unknown)}; see `llmgw ctl nodes`",
                "nodes",
            )
        return [self.registry.nodes[n] for n in nodes]

    def _check_versions(self, nodes: Collection[str]) -> None:
        for view in self._views(nodes):
            old = too_old(view.slurm)
            if old is not None:
                raise Refusal(
                    409,
                    "slurm_too_old",
                    f"{view.id} has Slurm {old}; llmgw needs Slurm 22.05 or newer: upgrade "
                    "it on that node, or leave the node out with --nodes",
                    "nodes",
                )

    def _on(self) -> SlurmSettings:
        s = self.settings
        if not s.enabled:
            raise Refusal(409, "slurm_off", "Slurm is off: run `llmgw ctl slurm setup` first")
        return s

    def _check_files(self, s: SlurmSettings) -> None:
        try:
            self.rendered(s)
        except ValueError as exc:
            said = str(exc)
            field = next((f for f in ("root", "partition", "controller") if f in said), "nodes")
            raise Refusal(
                400, "bad_request", f"Slurm's files cannot take this: {said}", field
            ) from None

    # --------------------------------------------------------------- workflows

    async def setup(self, ask: SlurmSetup, by: Principal) -> SlurmJson:
        """Turn Slurm on, or change what ``ask`` names and keep the rest."""
        s = self.settings
        nodes = tuple(sorted(set(ask.nodes))) if ask.nodes is not None else s.nodes
        if nodes is not None:
            self._views(nodes)
        root = s.root if ask.root is None else ask.root.rstrip("/") or "/"
        if ask.root == "":
            root = ""
        if root and not root.startswith("/"):
            raise Refusal(400, "bad_request", f"root: {root!r} is not an absolute path", "root")
        members = [n for n in sorted(self.registry.nodes) if nodes is None or n in nodes]
        controller = ask.controller or s.controller
        if controller is None:
            ready = [n for n in members if self._ready(self.registry.nodes[n])]
            if not ready:
                raise Refusal(
                    409,
                    "no_controller",
                    "no node of Slurm's set is Ready to run slurmctld: name one with "
                    "--controller once it is",
                    "controller",
                )
            controller = ready[0]
        (view,) = self._views([controller])
        if not self._ready(view):
            why = f"{view.state}{': ' + view.reason if view.reason else ''}"
            raise Refusal(
                409,
                "controller_not_ready",
                f"the controller {controller} is not Ready ({why}); pick a Ready node "
                "with --controller",
                "controller",
            )
        self._check_versions([*members, controller])
        changed = replace(
            self.kept.with_key(s),
            enabled=True,
            controller=controller,
            partition=ask.partition or s.partition,
            nodes=nodes,
            ctld_port=ask.ctld_port or s.ctld_port,
            slurmd_port=ask.slurmd_port or s.slurmd_port,
            root=root,
            turning_off=False,
        )
        # A lent node left out of the set is taken back.
        leaving = [n for n in changed.lend if not changed.in_set(n)]
        changed = replace(
            changed,
            lend=tuple(n for n in changed.lend if n not in leaving),
            reclaim=tuple(sorted({*changed.reclaim, *leaving})),
        )
        self._check_files(changed)
        said = (
            f"controller {controller}, partition {changed.partition}, nodes "
            f"{', '.join(nodes) if nodes is not None else 'every node'}, ports "
            f"{changed.ctld_port}/{changed.slurmd_port}, root {root or 'the system paths'}"
        )
        await self.kept.write(changed, by, "slurm.setup", said)
        log.info("Slurm set up by %s: %s", by.name, said)
        self.changed()
        return self.status()

    @staticmethod
    def _ready(view: NodeView) -> bool:
        return view.state == NodeState.READY and view.session is not None

    async def lend(self, ask: SlurmNodes, by: Principal) -> SlurmJson:
        """Lend nodes to Slurm: their replicas are placed elsewhere before they stop
        (refused, naming where each would have to go, when one fits nowhere else)."""
        s = self._on()
        views = self._views(ask.nodes)
        outside = [v.id for v in views if not s.in_set(v.id)]
        if outside:
            raise Refusal(
                409,
                "not_in_slurm",
                f"{', '.join(outside)} is not one of Slurm's nodes: add it with "
                "`llmgw ctl slurm setup --nodes ...`",
                "nodes",
            )
        self._check_versions(ask.nodes)
        new = [v for v in views if v.id not in s.lend]
        self.check_leaving([v.id for v in new if v.shards and v.id not in s.reclaim])
        ours = [v for v in new if v.id not in s.reclaim and not (v.cordoned or v.draining)]
        changed = replace(
            s,
            lend=tuple(sorted({*s.lend, *(v.id for v in new)})),
            reclaim=tuple(n for n in s.reclaim if n not in ask.nodes),
            cordoned=tuple(sorted({*s.cordoned, *(v.id for v in ours)})),
        )
        if changed != s:
            await self.kept.write(changed, by, "slurm.lend", ", ".join(v.id for v in new))
        for view in ours:
            await self.fleet.mark(view.id, "drain" if view.shards else "cordon", by)
        self.changed()
        return self.status()

    async def reclaim(self, ask: SlurmNodes, by: Principal) -> SlurmJson:
        """Take nodes back: drained in Slurm, cordoned in llmgw until their last job
        step ends (the keeper gives each back)."""
        s = self._on()
        self._views(ask.nodes)
        not_lent = [n for n in ask.nodes if n not in s.lend and n not in s.reclaim]
        if not_lent:
            stages = ", ".join(f"{n} ({self.stage_of(n) or 'not in Slurm'})" for n in not_lent)
            raise Refusal(409, "not_lent", f"not lent to Slurm: {stages}", "nodes")
        taken = [n for n in ask.nodes if n in s.lend]
        if taken:
            changed = replace(
                s,
                lend=tuple(n for n in s.lend if n not in taken),
                reclaim=tuple(sorted({*s.reclaim, *taken})),
            )
            await self.kept.write(changed, by, "slurm.reclaim", ", ".join(taken))
        self.changed()
        return self.status()

    async def off(self, now: bool, by: Principal) -> SlurmJson:
        """Reclaim every lent node; Slurm is off once none is left reclaiming (at once
        with ``now``: every node back in llmgw whatever Slurm runs on it)."""
        s = self.settings
        if not s.enabled:
            return self.status()
        if now or not (s.lend or s.reclaim):
            await self._turn_off(by, "now" if now else "no node lent")
        else:
            changed = replace(
                s, lend=(), reclaim=tuple(sorted({*s.lend, *s.reclaim})), turning_off=True
            )
            await self.kept.write(
                changed, by, "slurm.off", f"reclaiming {', '.join(changed.reclaim)} first"
            )
        self.changed()
        return self.status()

    async def _turn_off(self, by: Principal, why: str) -> None:
        s = self.settings
        off = replace(s, enabled=False, lend=(), reclaim=(), cordoned=(), turning_off=False)
        await self.kept.write(off, by, "slurm.off", why)
        for node_id in s.cordoned:
            view = self.registry.nodes.get(node_id)
            if view is not None and view.cordoned:
                await self.fleet.mark(node_id, "uncordon", by)

    async def policy(self, ask: SlurmPolicySet, by: Principal) -> SlurmJson:
        s = self.settings
        if ask.off:
            policy = SlurmPolicy()
        elif (ask.lend_idle_after, ask.keep_free_gpus, ask.reclaim_when_queued) == (None,) * 3:
            raise Refusal(
                400,
                "bad_request",
                "give --lend-idle-after, --keep-free-gpus, --reclaim-when-queued or --off",
                "lend_idle_after",
            )
        else:
            old = s.policy
            policy = SlurmPolicy(
                lend_idle_after=ask.lend_idle_after or old.lend_idle_after,
                keep_free_gpus=old.keep_free_gpus
                if ask.keep_free_gpus is None
                else ask.keep_free_gpus,
                reclaim_when_queued=ask.reclaim_when_queued or old.reclaim_when_queued,
            )
        said = (
            "off"
            if not policy.on
            else f"lend idle after {policy.lend_idle_after} s, keep {policy.keep_free_gpus} "
            f"card(s) free, reclaim when queued {policy.reclaim_when_queued} s"
        )
        await self.kept.write(replace(s, policy=policy), by, "slurm.policy", said)
        self.changed()
        return self.status()

    # ------------------------------------------------------ the keeper's steps

    def returnable(self, node_id: str) -> bool:
        """A reclaiming node llmgw may have back: its agent reports no job step, and
        Slurm drained it or is broken there (a broken Slurm never keeps a node)."""
        view = self.registry.nodes.get(node_id)
        if view is None:
            return True  # removed from the fleet: nothing to wait for
        status = view.slurm
        if status is None:
            return False
        idle = (status.steps or 0) == 0 and not status.jobs
        return idle and (drained(status) or bool(status.problem))

    async def give_back(self, node_ids: Collection[str], by: Principal) -> None:
        """Reclaimed nodes back in llmgw: uncordoned where llmgw cordoned them for Slurm."""
        s = self.settings
        changed = replace(
            s,
            reclaim=tuple(n for n in s.reclaim if n not in node_ids),
            cordoned=tuple(n for n in s.cordoned if n not in node_ids),
        )
        await self.kept.write(changed, by, "slurm.reclaimed", ", ".join(sorted(node_ids)))
        for node_id in sorted(node_ids):
            view = self.registry.nodes.get(node_id)
            if node_id in s.cordoned and view is not None and (view.cordoned or view.draining):
                await self.fleet.mark(node_id, "uncordon", by)
        if changed.turning_off and not changed.reclaim:
            await self._turn_off(by, "every lent node is back")
