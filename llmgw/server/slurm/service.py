"""Every Slurm workflow of the control plane (``llmgw ctl slurm``): handlers, pages and
the console call these and nothing else.

``setup`` turns Slurm on (or changes what it names and keeps the rest), ``lend`` moves
nodes to Slurm (their replicas placed elsewhere first: drained in llmgw, cordoned when
they run none), ``reclaim`` takes them back, ``off`` reclaims every lent node and turns
Slurm off once none is left (at once with ``now``), ``policy`` sets lending by policy.
Each is refused with nothing changed when it cannot be done, and audited when done.
What is read (stages, parts, files, messages, the status answer) is ``SlurmView``'s
(``view.py``): worked out from the settings and the registry, never kept apart, so a
new leader is where the last one was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import replace

from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.fleet.service import FleetService
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import SlurmNodes, SlurmPolicySet, SlurmSetup
from llmgw.server.slurm.settings import KeptSlurm, SlurmPolicy, SlurmSettings
from llmgw.server.slurm.view import SlurmView, drained, too_old
from llmgw.wire.admin import SlurmJson
from llmgw.wire.states import NodeState

log = logging.getLogger("llmgw.slurm")

# Every replica on some nodes placed on the fleet without them, or a Refusal.
CheckLeaving = Callable[[Collection[str]], None]


class SlurmService(SlurmView):
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
        super().__init__(kept, registry)
        self.fleet = fleet
        self.check_leaving = check_leaving
        self.changed = changed

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

    async def lend(self, ask: SlurmNodes, by: Principal, reason: str | None = None) -> SlurmJson:
        """Lend nodes to Slurm: their replicas are placed elsewhere before they stop
        (refused, naming where each would have to go, when one fits nowhere else).
        ``reason``: the audit's words (lending by policy's), else the nodes named."""
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
            said = reason or ", ".join(v.id for v in new)
            await self.kept.write(changed, by, "slurm.lend", said)
        for view in ours:
            await self.fleet.mark(view.id, "drain" if view.shards else "cordon", by)
        self.changed()
        return self.status()

    async def reclaim(self, ask: SlurmNodes, by: Principal, reason: str | None = None) -> SlurmJson:
        """Take nodes back: drained in Slurm, cordoned in llmgw until their last job
        step ends (the keeper gives each back). ``reason`` as for ``lend``."""
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
            await self.kept.write(changed, by, "slurm.reclaim", reason or ", ".join(taken))
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
        # Uncordoned first, then out of ``reclaim``: a node shown back in llmgw is
        # placeable, and a pass cut between the two does the rest next time.
        for node_id in sorted(node_ids):
            view = self.registry.nodes.get(node_id)
            if node_id in s.cordoned and view is not None and (view.cordoned or view.draining):
                await self.fleet.mark(node_id, "uncordon", by)
        s = self.settings
        changed = replace(
            s,
            reclaim=tuple(n for n in s.reclaim if n not in node_ids),
            cordoned=tuple(n for n in s.cordoned if n not in node_ids),
        )
        await self.kept.write(changed, by, "slurm.reclaimed", ", ".join(sorted(node_ids)))
        if changed.turning_off and not changed.reclaim:
            await self._turn_off(by, "every lent node is back")
