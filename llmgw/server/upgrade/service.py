"""``llmgw ctl upgrade``: the run started after every check, and driven a step at a time.

``start`` refuses, with nothing changed, a version that does not parse, a control plane
not run from a zipapp (a source install is upgraded by its installer), a version older
than the cluster's (the highest among the control planes and agents) unless
``downgrade``, a release the source does not have (404), a source that answers
garbage, a bad signature or stalls, and a zipapp that does not match the signed sums
(502: this control plane's is fetched and checked here, and kept hidden beside the
running one for step 1), and a release with no build for this control plane's
platform. Then it keeps the run (``run.py``) and the leader's keeper drives it:
``advance`` does one pass of the current step (``keeper.py``).

The steps, each done when what it moved is seen back on the version:

1. the leading control plane fetches its platform's zipapp beside its own, checks it,
   swaps it in (the old one kept), records ``restarting`` and starts again in place
   (``ControlPlane.relaunch``, its listeners handed over); back on the version, it
   waits until every node that was Ready is Ready again;
2. each standby is asked over the control planes' link (``POST /peer/upgrade``: it
   fetches and checks the release itself, and does 1. for itself); done when its
   ``/peer/state`` says the version;
3. node by node, by id: the agent is asked over its stream (``upgrade``); done when it
   is back on a new stream, on the version, Ready, with at least the Ready replicas it
   had when the run began. One not back within ``node_timeout`` fails the run there.

Processes already on the version are skipped, so the same version started again after a
failure resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from llmgw import __version__, release
from llmgw.jsonvalue import JSON
from llmgw.releasekey import PUBLIC_KEYS
from llmgw.server.fleet.nodeview import NodeView, Session
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.ha.peerlink import PeerError, Refused
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import UpgradeStart
from llmgw.server.store import Store
from llmgw.server.upgrade.run import SETTING, RunJson, Step, UpgradeRun
from llmgw.wire.states import NodeState, ShardState

log = logging.getLogger("llmgw.upgrade")

NODE_TIMEOUT = 300.0
# What an agent that answers ``upgrade`` lists in its Register (llmgw/agent/upgrade.py).
FEATURE = "upgrade.v1"
# A standby's answer to /peer/upgrade has this long to leave before it starts again.
LINGER = 0.5


class ControlPlanes(Protocol):
    """The control planes of the cluster, as the upgrade sees them (``keeper.py``'s
    adapter over the leadership)."""

    @property
    def name(self) -> str:
        """This control plane's."""

    def others(self) -> list[str]:
        """Every other current control plane, by name."""

    def version_of(self, name: str) -> str | None:
        """The version another says it runs (its ``/peer/state``); None when not heard."""

    async def upgrade(self, name: str, version: str, source: str) -> None:
        """Ask another to upgrade itself (``POST /peer/upgrade``); raises with words."""


def ready_replicas(view: NodeView) -> int:
    return sum(1 for s in view.shards.values() if s.state == ShardState.READY)


def cluster_version(versions: list[str]) -> release.Version | None:
    """The highest of the versions that parse."""
    parsed = []
    for text in versions:
        try:
            parsed.append(release.Version.parse(text))
        except release.ReleaseError:
            continue
    return max(parsed, default=None)


class UpgradeService:
    def __init__(
        self,
        store: Store,
        registry: NodeRegistry,
        planes: ControlPlanes,
        relaunch: Callable[[str], None],
        default_source: Callable[[], str],
        changed: Callable[[], None] = lambda: None,
        keys: tuple[str, ...] | None = None,
        clock: Callable[[], float] = time.time,
        timeout: float = release.READ_TIMEOUT,
    ) -> None:
        """``relaunch``: this control plane stops and starts again in place;
        ``changed``: after a run is started (the keeper looks at once)."""
        self.store = store
        self.registry = registry
        self.planes = planes
        self.relaunch = relaunch
        self.default_source = default_source
        self.changed = changed
        self.keys = keys if keys is not None else PUBLIC_KEYS
        self.clock = clock
        # A read from the release source that moves no byte this long: a stalled source.
        self.timeout = timeout
        self.run: UpgradeRun | None = None
        # This control plane is starting again (the keeper's passes are over).
        self.relaunching = False
        # The stream each node was asked on: it is back once on another.
        self.asked_on: dict[str, Session | None] = {}

    async def load(self) -> UpgradeRun | None:
        raw = await self.store.get_setting(SETTING)
        self.run = UpgradeRun.read(json.loads(raw)) if raw else None
        return self.run

    async def _write(self, run: UpgradeRun) -> None:
        await self.store.put_setting(SETTING, json.dumps(run.document(), sort_keys=True))
        self.run = run

    async def status(self) -> RunJson:
        run = await self.load()
        if run is None:
            raise Refusal(404, "not_found", "no upgrade has run: see `llmgw ctl upgrade --help`")
        return run.as_json()

    # ------------------------------------------------------------------ start

    def versions(self) -> dict[str, str]:
        """Every process's version as last heard: control planes by name, nodes by id."""
        out = {self.planes.name: __version__}
        for name in self.planes.others():
            seen = self.planes.version_of(name)
            if seen:
                out[name] = seen
        for node_id, view in self.registry.nodes.items():
            if view.version:
                out[node_id] = view.version
        return out

    async def start(self, ask: UpgradeStart, by: Principal) -> RunJson:
        try:
            version = str(release.Version.parse(ask.version))
        except release.ReleaseError as exc:
            raise Refusal(400, "bad_request", str(exc), "version") from None
        source = (ask.source or self.default_source()).rstrip("/")
        run = await self.load()
        if run is not None and run.state == "running":
            raise Refusal(
                409,
                "upgrade_running",
                f"an upgrade to {run.version} is under way: follow it with "
                "`llmgw ctl upgrade status`",
            )
        if release.running_zipapp() is None:
            raise Refusal(
                409,
                "not_zipapp",
                "this control plane does not run from an llmgw zipapp (a source or pip "
                "install): upgrade it with the tool that installed it (pip install -U "
                f"llmgw=={version}), restart it, then upgrade the nodes",
            )
        here = release.running_zipapp()
        if here is not None and not os.access(here.parent, os.W_OK):
            raise Refusal(
                409,
                "not_writable",
                f"this control plane cannot replace {here}: its folder is not writable by "
                "the user it runs as (in a container image, upgrade the image instead: "
                "`helm upgrade` with the new tag, docs/kubernetes.md)",
            )
        highest = cluster_version(list(self.versions().values()))
        if highest is not None and release.Version.parse(version) < highest and not ask.downgrade:
            raise Refusal(
                409,
                "downgrade",
                f"{version} is older than the cluster's {highest}: give --downgrade to go "
                "back to it",
                "version",
            )
        try:
            sums = await asyncio.to_thread(
                release.checked_sums, source, version, keys=self.keys, timeout=self.timeout
            )
        except release.ReleaseNotFound as exc:
            raise Refusal(404, "unknown_version", str(exc), "version") from None
        except release.ReleaseError as exc:
            raise Refusal(502, "release_source", str(exc), "source") from None
        asset = release.asset_name(version)
        sha256 = sums.get(asset)
        if sha256 is None:
            raise Refusal(
                409,
                "no_build",
                f"release {version} at {source} has no {asset} (it has "
                f"{', '.join(sorted(sums))}): no build for this control plane's platform",
            )
        # This control plane's zipapp, fetched and checked now (a corrupt or tampered one
        # is refused before anything changes), kept hidden beside the running one for the
        # first step; not when it is on the version already (its step is skipped).
        if version != __version__:
            try:
                await asyncio.to_thread(self._fetch, version, source, sha256)
            except release.ReleaseError as exc:
                raise Refusal(502, "release_source", str(exc), "source") from None
        if run is not None and run.version == version and run.state == "failed":
            run = replace(
                run.resumed(),
                source=source,
                by=by.name,
                asset=asset,
                sha256=sha256,
                node_timeout=ask.node_timeout or run.node_timeout,
                downgrade=ask.downgrade,
            )
            words = f"resumed the upgrade to {version}"
        else:
            run = self._new_run(version, source, by, ask, asset, sha256)
            words = f"to {version} from {source}"
        await self._write(run)
        await self.store.audit(by.name, "upgrade.start", SETTING, words)
        log.info("upgrade %s (by %s)", words, by.name)
        self.changed()
        return run.as_json()

    def _new_run(
        self, version: str, source: str, by: Principal, ask: UpgradeStart, asset: str, sha: str
    ) -> UpgradeRun:
        nodes = self.registry.nodes
        ready = {
            node_id: ready_replicas(view)
            for node_id, view in sorted(nodes.items())
            if view.state == NodeState.READY and view.session is not None
        }
        steps = [Step("control-plane", self.planes.name, wait_nodes=True)]
        steps += [Step("control-plane", name) for name in sorted(self.planes.others())]
        steps += [Step("node", node_id) for node_id, view in sorted(nodes.items()) if view.session]
        return UpgradeRun(
            version=version,
            source=source,
            by=by.name,
            started=self.clock(),
            node_timeout=ask.node_timeout or NODE_TIMEOUT,
            downgrade=ask.downgrade,
            ready=ready,
            steps=tuple(steps),
            asset=asset,
            sha256=sha,
        )

    # --------------------------------------------------------- this control plane

    def _fetch(self, version: str, source: str, sha256: str | None) -> release.Fetched:
        """``version``'s zipapp for this platform, checked, hidden beside the running
        one: the one fetched before when it is there and still checks out."""
        zipapp = release.running_zipapp()
        if zipapp is None:
            raise release.ReleaseError("this control plane does not run from an llmgw zipapp")
        name = release.asset_name(version)
        part = zipapp.parent / f".{name}.part"
        if sha256 and part.is_file() and release.sha256_file(part) == sha256:
            return release.Fetched(version, name, part, sha256, part.stat().st_size)
        return release.fetch(
            source,
            version,
            zipapp.parent,
            keys=self.keys,
            timeout=self.timeout,
            expect_sha256=sha256,
        )

    async def install_here(self, version: str, source: str, sha256: str | None) -> Path:
        """This control plane's zipapp swapped for ``version``'s, checked; where the old
        one is kept. Raises ReleaseError (nothing changed)."""

        def install() -> Path:
            fetched = self._fetch(version, source, sha256)
            zipapp = release.running_zipapp()
            assert zipapp is not None  # _fetch refused otherwise
            return release.swap_in_started(fetched, zipapp, __version__)

        return await asyncio.to_thread(install)

    async def peer_upgrade(self, version: str, source: str) -> JSON:
        """``POST /peer/upgrade``: this control plane (a standby) on ``version``, started
        again once the answer has left."""
        try:
            version = str(release.Version.parse(version))
        except release.ReleaseError as exc:
            raise ValueError(str(exc)) from None
        if version == __version__:
            return {"version": version, "restarting": False}
        try:
            kept = await self.install_here(version, source, None)
        except release.ReleaseError as exc:
            raise Refused(str(exc)) from None
        log.info("llmgw %s is in place (%s kept); starting again", version, kept.name)
        self.relaunching = True
        asyncio.get_running_loop().call_later(LINGER, self.relaunch, f"upgrade to {version}")
        return {"version": version, "restarting": True}

    # ------------------------------------------------------------------ steps

    async def advance(self) -> None:
        """One pass of the run's current step (the leader's keeper, every second)."""
        run = self.run
        if run is None or run.state != "running" or self.relaunching:
            return
        at = run.current
        if at is None:
            await self._finish(replace(run, state="done", ended=self.clock()))
            return
        step = run.steps[at]
        if step.kind == "control-plane":
            await self._plane(run, at, step)
        else:
            await self._node(run, at, step)

    async def _set(self, run: UpgradeRun, at: int, **changes: object) -> UpgradeRun:
        step = run.steps[at]
        if "state" in changes and changes["state"] in ("done", "skipped", "failed"):
            changes.setdefault("ended", self.clock())
        if changes.get("state") == "running" and step.started is None:
            changes.setdefault("started", self.clock())
        changed = run.with_step(at, **changes)
        if changed != run:
            await self._write(changed)
        return changed

    async def _fail(self, run: UpgradeRun, at: int, words: str) -> None:
        run = await self._set(run, at, state="failed", detail=words)
        await self._finish(replace(run, state="failed", error=words, ended=self.clock()))

    async def _finish(self, run: UpgradeRun) -> None:
        await self._write(run)
        words = run.error or f"every process on {run.version}"
        await self.store.audit("llmgw", f"upgrade.{run.state}", SETTING, words)
        log.info("upgrade to %s %s: %s", run.version, run.state, words)

    def _late(self, run: UpgradeRun, step: Step) -> bool:
        return step.started is not None and self.clock() - step.started > run.node_timeout

    async def _plane(self, run: UpgradeRun, at: int, step: Step) -> None:
        v = run.version
        if step.target != self.planes.name:
            seen = self.planes.version_of(step.target)
            if seen == v:
                state = "skipped" if step.state == "pending" else "done"
                await self._set(run, at, state=state, detail=f"on {v}")
            elif step.state == "pending":
                try:
                    await self.planes.upgrade(step.target, v, run.source)
                except (PeerError, LookupError) as exc:
                    await self._fail(run, at, f"control plane {step.target} refused: {exc}")
                    return
                await self._set(run, at, state="running", detail=f"restarting on {v}")
            elif self._late(run, step):
                await self._fail(
                    run,
                    at,
                    f"control plane {step.target} did not come back on {v} within "
                    f"{run.node_timeout:g}s (last seen: {seen or 'not answering'})",
                )
            return
        if __version__ == v:
            await self._back_here(run, at, step)
        elif step.state == "running" and step.detail.startswith("restarting"):
            await self._fail(
                run, at, f"control plane {step.target} started again on {__version__}, not {v}"
            )
        else:
            run = await self._set(run, at, state="running", detail=f"fetching {run.asset}")
            try:
                kept = await self.install_here(v, run.source, run.sha256 or None)
            except release.ReleaseError as exc:
                await self._fail(run, at, f"control plane {step.target}: {exc}")
                return
            await self._set(run, at, detail=f"restarting on {v} ({kept.name} kept)")
            self.relaunching = True
            self.relaunch(f"upgrade to {v}")

    async def _back_here(self, run: UpgradeRun, at: int, step: Step) -> None:
        v = run.version
        if not step.wait_nodes:
            state = "skipped" if step.state == "pending" else "done"
            await self._set(run, at, state=state, detail=f"on {v}")
            return
        missing = [n for n in run.ready if not self._ready_again(run, n)]
        if not missing:
            await self._set(run, at, state="done", detail=f"on {v}; every Ready node back")
        elif self._late(run, step):
            await self._fail(
                run,
                at,
                f"control plane {step.target} is on {v}, but {', '.join(missing)} did not "
                f"come back Ready within {run.node_timeout:g}s",
            )
        else:
            await self._set(
                run, at, state="running", detail=f"on {v}; waiting for {', '.join(missing)}"
            )

    def _ready_again(self, run: UpgradeRun, node_id: str) -> bool:
        view = self.registry.nodes.get(node_id)
        return (
            view is not None
            and view.session is not None
            and view.state == NodeState.READY
            and ready_replicas(view) >= run.ready.get(node_id, 0)
        )

    # ------------------------------------------------------------------ nodes

    async def _node(self, run: UpgradeRun, at: int, step: Step) -> None:
        v = run.version
        view = self.registry.nodes.get(step.target)
        if view is None:
            await self._set(run, at, state="skipped", detail="no longer in the cluster")
            return
        if step.state == "pending":
            if view.version == v and self._ready_again(run, step.target):
                await self._set(run, at, state="skipped", detail=f"on {v}")
                return
            await self._ask_node(run, at, step, view)
            return
        back = (
            view.session is not None
            and view.session is not self.asked_on.get(step.target)
            and view.version == v
            and self._ready_again(run, step.target)
        )
        if back:
            await self._set(
                run,
                at,
                state="done",
                detail=f"back on {v}, Ready, {ready_replicas(view)} Ready replicas",
            )
        elif self._late(run, step):
            await self._fail(
                run,
                at,
                f"node {step.target} did not come back on {v} within {run.node_timeout:g}s "
                f"(last seen: {self._seen(run, view)})",
            )

    def _seen(self, run: UpgradeRun, view: NodeView) -> str:
        stream = "connected" if view.session is not None else "not connected"
        return (
            f"{view.version or 'unknown version'}, {view.state}, {stream}, "
            f"{ready_replicas(view)} of {run.ready.get(view.id, 0)} Ready replicas"
        )

    async def _ask_node(self, run: UpgradeRun, at: int, step: Step, view: NodeView) -> None:
        v = run.version
        session = view.session
        if session is None:
            await self._fail(run, at, f"node {step.target} is not connected: {view.reason}")
            return
        if FEATURE not in view.features:
            await self._set(
                run,
                at,
                state="skipped",
                detail=f"its agent ({view.version}) cannot be upgraded over its stream: "
                "upgrade it by hand (llmgw node add)",
            )
            return
        run = await self._set(run, at, state="running", detail=f"asked to upgrade to {v}")
        self.asked_on[step.target] = session
        args: dict[str, object] = {
            "version": v,
            "source": run.source,
            "sha256": run.sha256,
            "asset": run.asset,
        }
        try:
            async for answer in session.ask("upgrade", dict(args), timeout=run.node_timeout):
                if not answer.ok:
                    await self._fail(run, at, f"node {step.target} refused: {answer.error}")
                    return
                break
        except ConnectionError:
            pass  # gone while answering: it may be starting again; its return tells
        except TimeoutError:
            await self._fail(
                run,
                at,
                f"node {step.target} did not answer the upgrade within {run.node_timeout:g}s",
            )
            return
        await self._set(run, at, detail=f"restarting on {v}")
