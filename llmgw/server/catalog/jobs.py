"""Serve jobs: what ``ctl model serve`` started, followed step by step until its
replicas answer or a step fails (``jobview.py`` has the steps).

The serve itself resolves and plans (``ModelService.serve``, refusing at once what
cannot be served) and hands the model here; from then on ``ServeJobs`` reads, on the
leader and about twice a second, what the reconciler and the nodes say of the model's
replicas, and moves the job along:

- place: a replica tracked for the model (on which node); failed when the reconciler's
  pass has placed none for ``PLACE_PATIENCE`` seconds, with the reconciler's reason.
- fetch: the shard pending, installing its engine or fetching (each node's bytes, of
  the total, and the rate over the last seconds); failed by a fetch error the node
  reported (``DownloadProgress.error``) or the start timeout (which counts from when the
  download last moved: the reconciler's ``Track.moved_at``).
- start: the engine launched and loading; failed when it exits or times out.
- ready: every replica the model wants answers: the job succeeded.

A failure is the reconciler's (``Reconciler.health``: a replica failed, timed out, or
could not be sent) after the job began; the step it failed at is the one the job was at,
or fetch where the node reported a fetch error. A model removed, stopped or parked
meanwhile fails its job.
An on-demand model succeeds once planned: it starts on its first request.

Jobs are written to the store (``jobs`` table) when they begin and end, and in between
at most every ``WRITE_EVERY`` seconds (never per byte), so any control plane answers
``GET /api/v1/jobs``; a new leader reads the running ones and carries them on. The store
keeps the newest 200, none older than 7 days (``store/jobrows.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from llmgw.server.catalog.jobview import STEPS, Job, NodeDownload, Step, job_of, new_job_id
from llmgw.server.catalog.model import Model
from llmgw.server.catalog.reconciler import Reconciler, Track
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
from llmgw.server.store import Store, StoreError
from llmgw.server.store.jobrows import KEEP, JobRecord
from llmgw.wire.admin import JobJson, StepName
from llmgw.wire.states import ShardState

log = logging.getLogger("llmgw.jobs")

# How often the leader looks at its running jobs.
FOLLOW_EVERY = 0.5
# A running job's progress reaches the store at most this often.
WRITE_EVERY = 2.0
# A model none of whose replicas the reconciler could place this long fails its job.
PLACE_PATIENCE = 60.0
# The download rate is measured over this many seconds of reports.
RATE_WINDOW = 10.0

_FETCHING = {ShardState.PENDING, ShardState.STARTING, ShardState.INSTALLING}


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


@dataclass
class _Following:
    """What the leader keeps of a running job beyond the job itself."""

    job: Job
    # The reconciler's clock when following began: failures before it are not this job's.
    since: float
    written_at: float | None = None
    dirty: bool = False
    unplaced_since: float | None = None
    # (reconciler clock, bytes) reported per replica, for the rate.
    samples: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)


class ServeJobs:
    def __init__(
        self,
        store: Store,
        reconciler: Reconciler,
        registry: NodeRegistry,
        models: Mapping[str, Model],
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``models``: the catalog as it stands; ``wall``: the clock the jobs' times are
        written in (the reconciler's own clock measures the rest)."""
        self.store = store
        self.reconciler = reconciler
        self.registry = registry
        self.models = models
        self.wall = wall
        self.running: dict[str, _Following] = {}
        # Looks made at the running jobs: a test waits for this to move on.
        self.looks = 0

    # ------------------------------------------------------------------ beginning

    async def begin(self, model: Model, steps: list[Step]) -> Job:
        """A job for a model just served, its resolve and plan steps as the serve did
        them; written to the store at once (kept in memory if the store refuses now)."""
        now = self.wall()
        job = Job(new_job_id(), model.name, steps[0].started or now, now)
        for step in steps:
            job.steps[STEPS.index(step.name)] = step
        job.reach("place", now, "")
        following = _Following(job, self.reconciler.now())
        self.running[job.id] = following
        await self._write(following, prune=True)
        return job

    # ------------------------------------------------------------------- reading

    async def get(self, job_id: str) -> JobJson:
        following = self.running.get(job_id)
        if following is not None:
            return following.job.as_json()
        record = await self.store.jobs.get(job_id)
        if record is None:
            raise Refusal(
                404, "not_found", f"no job {job_id!r}; `llmgw ctl jobs` lists the jobs kept"
            )
        return self._json(record)

    async def newest(self, limit: int = KEEP, model: str | None = None) -> list[JobJson]:
        """The newest jobs first (those running here as they are now)."""
        kept = {r.id: self._json(r) for r in await self.store.jobs.newest(limit, model)}
        for following in self.running.values():
            if model is None or following.job.model == model:
                kept[following.job.id] = following.job.as_json()
        ordered = sorted(kept.values(), key=lambda j: (j["created"], j["id"]), reverse=True)
        return ordered[:limit]

    async def latest_for(self, model: str) -> JobJson | None:
        """A model's newest job, or None."""
        jobs = await self.newest(1, model)
        return jobs[0] if jobs else None

    @staticmethod
    def _json(record: JobRecord) -> JobJson:
        return job_of(record.body).as_json()

    # ----------------------------------------------------------------- following

    async def run(self, stop: asyncio.Event) -> None:
        """While this control plane leads: carry on the jobs the store says are running,
        and follow every job until it ends."""
        try:
            try:
                await self.carry_on()
            except Exception:  # never the reconcile loop's end: it runs beside this
                log.exception("carrying on the running serve jobs failed")
            while not stop.is_set():
                try:
                    await self.follow()
                except Exception:
                    log.exception("following the serve jobs failed; trying again")
                try:
                    await asyncio.wait_for(stop.wait(), FOLLOW_EVERY)
                except TimeoutError:
                    pass
        finally:
            # No longer the leader: another follows them now, from the store.
            self.running.clear()

    async def carry_on(self) -> None:
        """Follow the jobs the store says are running (a new leader's first step)."""
        try:
            records = await self.store.jobs.running()
        except StoreError as exc:
            log.warning("the running serve jobs could not be read: %s", exc)
            return
        for record in records:
            if record.id in self.running:
                continue
            try:
                job = job_of(record.body)
            except ValueError as exc:
                log.error("serve job %s in the store cannot be read (%s)", record.id, exc)
                continue
            self.running[job.id] = _Following(job, self.reconciler.now())

    async def follow(self) -> None:
        """One look at every running job; each written when due, those ended let go."""
        self.looks += 1
        for following in list(self.running.values()):
            if self.look(following):
                following.dirty = True
            due = following.written_at is None or (
                self.reconciler.now() - following.written_at >= WRITE_EVERY
            )
            if following.dirty and (due or following.job.ended):
                await self._write(following)
            if following.job.ended and not following.dirty:
                del self.running[following.job.id]

    async def _write(self, following: _Following, prune: bool = False) -> None:
        job = following.job
        body = dict(job.as_json())
        record = JobRecord(job.id, "serve", job.model, job.state, body, job.created, job.updated)
        try:
            await self.store.jobs.put(record)
            if prune:
                await self.store.jobs.prune(self.wall())
        except StoreError as exc:
            log.warning("serve job %s not written (trying again): %s", job.id, exc)
            following.dirty = True
            return
        following.written_at = self.reconciler.now()
        following.dirty = False

    # ------------------------------------------------------------------ one look

    def look(self, following: _Following) -> bool:
        """Move a job along from what the reconciler and the nodes say now; True when
        anything of it changed."""
        job = following.job
        if job.ended:
            return False
        now, wall = self.reconciler.now(), self.wall()
        model = self.models.get(job.model)
        if model is None:
            job.fail(job.current, "the model was removed from the catalog", wall)
            return True
        tracks = sorted(
            (t for t in self.reconciler.tracks.values() if t.model == model.name),
            key=lambda t: t.replica_id,
        )
        changed = self._downloads(following, tracks, now)
        failed = self._failure(following, model, {t.replica_id for t in tracks})
        if failed is not None:
            step, reason = failed
            job.fail(step, reason, wall)
            return True
        if model.stopped or model.parked:
            why = "stopped by an operator" if model.stopped else f"parked: {model.parked}"
            job.fail(job.current, f"the model was {why}", wall)
            return True
        desired = sum(self.reconciler.desired(model, p, now) for p in model.profiles)
        if model.on_demand and desired == 0:
            job.finish(wall, "on demand: started on its first request")
            return True
        live = [t for t in tracks if t.stop_sent is None]
        if not live:
            return self._unplaced(following, model, now, wall) or changed
        following.unplaced_since = None
        ready = sum(1 for t in live if t.state == ShardState.READY)
        where = ", ".join(sorted({n for t in live for n in t.nodes}))
        changed = job.reach("place", wall, f"on {where}") or changed
        if len(live) < desired:
            return changed
        slowest = min(self._stage(t) for t in live)
        if slowest == 0:
            return job.reach("fetch", wall, self._fetch_detail(job, live)) or changed
        job.reach("fetch", wall)
        if job.step("fetch").detail == "":
            job.step("fetch").detail = self._fetch_detail(job, live)
        if slowest == 1:
            loading = next(t for t in live if self._stage(t) == 1)
            return job.reach("start", wall, loading.reason or "the engine is loading") or changed
        if ready >= desired:
            job.finish(wall, f"{ready} replica(s) ready on {where}")
            return True
        return changed

    @staticmethod
    def _stage(track: Track) -> int:
        """0 fetching (or not begun), 1 the engine loading, 2 ready; for a replica
        spanning nodes, the least of its shards (a leader loads while a worker fetches)."""
        states = [track.state, *(w.state for w in track.workers)]
        if any(s in _FETCHING or s == ShardState.DOWNLOADING for s in states):
            return 0
        return 2 if track.state == ShardState.READY else 1

    def _unplaced(self, following: _Following, model: Model, now: float, wall: float) -> bool:
        """No replica placed yet: the reconciler's reason, and the job failed at place
        when it stays so past ``PLACE_PATIENCE``."""
        job = following.job
        note = self.reconciler.unplaced.get(model.name)
        if note is None:
            following.unplaced_since = None
            status = next(
                (
                    s
                    for p in model.profiles
                    if (s := self.reconciler.status_of(model.name, p.name)) is not None
                ),
                None,
            )
            return job.reach("place", wall, status.note if status is not None else "")
        if following.unplaced_since is None:
            following.unplaced_since = now
        if now - following.unplaced_since >= PLACE_PATIENCE:
            job.fail("place", note, wall)
            return True
        return job.reach("place", wall, note)

    def _failure(
        self, following: _Following, model: Model, replicas: set[str]
    ) -> tuple[StepName, str] | None:
        """The step and reason of a failure of the model's replicas since the job began."""
        for profile in model.profiles:
            health = self.reconciler.health.get((model.name, profile.name))
            if health is None or not health.consecutive or health.last_at < following.since:
                continue
            fetch_error = self._fetch_error(model, following.job, replicas)
            if fetch_error is not None:
                return "fetch", fetch_error
            step = following.job.current
            if step == "place" and "progress" in health.last_reason:
                step = "fetch"  # timed out before a look saw it fetching
            return step, health.last_reason
        return None

    def _fetch_error(self, model: Model, job: Job, replicas: set[str]) -> str | None:
        """A fetch error a node reported for the job's replicas (or, where none is named,
        its source)."""
        replicas = replicas | {n.replica_id for n in job.nodes}
        for view in self.registry.nodes.values():
            for progress in view.downloads.values():
                error = progress.get("error")
                named = set(progress.get("replica_ids", []))
                if error and (named & replicas or progress.get("source") == model.source):
                    return f"fetching on {view.id}: {error}"
        return None

    # ----------------------------------------------------------------- downloads

    def _downloads(self, following: _Following, tracks: list[Track], now: float) -> bool:
        """Each replica's node with its download as the node reports it: bytes, total,
        the rate over the last ``RATE_WINDOW`` seconds, the file."""
        job = following.job
        changed = False
        known = {(n.node, n.replica_id): n for n in job.nodes}
        for track in tracks:
            if track.stop_sent is not None:
                continue
            shards = [(track.node, track.replica_id)]
            shards += [(w.node, f"{track.replica_id}~{w.rank}") for w in track.workers]
            for node, rid in shards:
                entry = known.get((node, rid))
                if entry is None:
                    entry = known[(node, rid)] = NodeDownload(node, rid)
                    job.nodes.append(entry)
                    changed = True
                changed = self._read_download(following, entry, now) or changed
        return changed

    def _read_download(self, following: _Following, entry: NodeDownload, now: float) -> bool:
        view = self.registry.nodes.get(entry.node)
        if view is None:
            return False
        progress = next(
            (p for p in view.downloads.values() if entry.replica_id in p.get("replica_ids", [])),
            None,
        )
        if progress is None:
            # Its report gone: the download finished (a failed one keeps its report).
            unfinished = entry.total is not None and entry.done != entry.total
            if entry.rate is None and not unfinished:
                return False
            entry.rate = None
            entry.done = entry.total if entry.total is not None else entry.done
            return True
        done = int(progress.get("done") or 0)
        total = progress.get("total")
        samples = following.samples.setdefault(entry.replica_id, deque())
        if not samples or samples[-1][1] != done:
            samples.append((now, done))
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW:
            samples.popleft()
        rate = entry.rate
        if len(samples) >= 2 and samples[-1][0] > samples[0][0]:
            rate = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
        new = (done, int(total) if total is not None else None, rate, progress.get("file"))
        if new == (entry.done, entry.total, entry.rate, entry.file):
            return False
        entry.done, entry.total, entry.rate, entry.file = new
        return True

    @staticmethod
    def _fetch_detail(job: Job, live: list[Track]) -> str:
        fetched = [n for n in job.nodes if n.done is not None]
        if fetched:
            done = sum(n.done or 0 for n in fetched)
            totals = [n.total for n in fetched]
            total = sum(t for t in totals if t is not None) if None not in totals else None
            return f"{_bytes(done)} of {_bytes(total)}" if total else f"{_bytes(done)}"
        reasons = [t.reason for t in live if t.reason]
        return reasons[0] if reasons else "waiting for the node"
