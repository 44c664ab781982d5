"""Fine-tune jobs, from the request to the stored adapter: ``FinetuneService``.

``create`` checks everything before anything is sent: the model, the adapter's name
(free in the models' namespace, and no other live fine-tune's), the base weights (a
GGUF model needs ``base``), the pairs (``pairs.check``), and a node with the memory
(``placement.choose``); then it keeps the job, sends the pairs in pieces and the spec
over the node's stream, and answers the job. From then on the node's word
(``FinetuneStatus``, through the registry's hook) moves it, and ``tick`` (the leader's
duty, every second) does what follows:

- A job not yet ended whose node has said nothing of it for the registry's node
  timeout (missed heartbeats x interval) fails: its node is lost, or no longer holds it.
  Loading the jobs at a leader change starts every clock again, so a job whose node
  still reports it carries on under the new leader.
- A job the node says is ``uploading`` is taken in ``PIECE``-sized pieces
  (``finetune.piece``), checked against the size and sha256 the node said, stored
  with its succeeded state in one change, and the node told to forget it.
- What changed is written to the store.

``cancel`` tells the node (it kills the trainer's process group) and marks the job
cancelled whether or not the node answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from llmgw.modelkit.sources import WeightsError, parse_source
from llmgw.server.catalog import adapters
from llmgw.server.catalog.model import Model, default_engine
from llmgw.server.finetune import pairs, placement
from llmgw.server.finetune.job import FinetuneJob, new_id
from llmgw.server.finetune.placement import Candidate, Card
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.store import Store
from llmgw.server.store.finetunes import FinetuneRow
from llmgw.server.store.values import Audit
from llmgw.wire.codec import to_map
from llmgw.wire.messages import AdapterAsk, AdapterPiece, FinetuneSpec, FinetuneStatus
from llmgw.wire.states import NodeState

log = logging.getLogger("llmgw.finetune")

# Each piece of the pairs sent down and of the adapter taken back: well inside the
# stream's 4 MiB frame.
PIECE = 1024 * 1024
# Seconds a node has to answer one piece or one order.
ASK_TIMEOUT = 60.0
AGENT_STATES = frozenset(
    {"preparing", "training", "converting", "uploading", "failed", "cancelled"}
)


class Nodes(Protocol):
    """The registry, as read here: the nodes, and its node timeout's two figures."""

    @property
    def nodes(self) -> Mapping[str, NodeView]: ...

    @property
    def interval(self) -> float: ...

    @property
    def missed(self) -> int: ...


@dataclass(frozen=True)
class FinetuneAsk:
    """What ``ctl finetune create`` asks (``requests.FinetuneRequest``'s fields)."""

    model: str
    name: str
    data: str
    node: str | None = None
    mib: int = 8000
    epochs: int = 3
    rank: int = 16
    base: str | None = None


class FinetuneService:
    def __init__(
        self,
        store: Store,
        registry: Nodes,
        models: Callable[[], Mapping[str, Model]],
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.registry = registry
        self.models = models
        self.clock = clock
        self.now = now
        self.jobs: dict[str, FinetuneJob] = {}
        self._dirty: set[str] = set()
        # When each live job was last heard of (the clock's time): its node's word,
        # or its sending, or this control plane's taking it from the store.
        self._heard: dict[str, float] = {}
        self._uploads: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        # The stored adapter last given to a node, by job id: a shard's fetch asks for
        # it a piece at a time, and every replica of the model asks.
        self._given: tuple[str, bytes] | None = None

    async def load(self) -> None:
        """Every job from the store; the live ones' clocks start now."""
        jobs = {}
        for row in await self.store.finetunes.list():
            try:
                jobs[row.id] = FinetuneJob.from_document(row.doc)
            except (ValueError, TypeError) as exc:
                log.warning("fine-tune %s cannot be read from the store: %s", row.id, exc)
        self.jobs = jobs
        at = self.clock()
        self._heard = {j.id: at for j in jobs.values() if not j.ended}

    # --- reading ----------------------------------------------------------------------

    def listed(self) -> list[FinetuneJob]:
        return sorted(self.jobs.values(), key=lambda j: (j.created, j.id))

    def find(self, job_id: str) -> FinetuneJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise Refusal(
                404, "not_found", f"no fine-tune {job_id!r}; `llmgw ctl finetune list` lists them"
            )
        return job

    def succeeded(self, name: str) -> FinetuneJob | None:
        """The newest fine-tune that made the adapter ``name``, if one did."""
        done = [j for j in self.jobs.values() if j.name == name and j.state == "succeeded"]
        return max(done, key=lambda j: j.updated) if done else None

    async def adapter(self, name: str) -> tuple[FinetuneJob, bytes] | None:
        """The stored adapter ``name`` (its job and bytes, checked), or None."""
        job = self.succeeded(name)
        if job is None:
            return None
        data = await self.store.finetunes.adapter(job.id)
        if data is None or hashlib.sha256(data).hexdigest() != job.adapter_sha256:
            log.warning("fine-tune %s: its stored adapter does not match its sha256", job.id)
            return None
        return job, data

    def servable(self, model: str, name: str) -> str | None:
        """Why the fine-tune ``name`` cannot be served as an adapter of ``model`` (its
        source ``finetune:NAME``), in words; None when it can."""
        job = self.succeeded(name)
        if job is None:
            live = [j for j in self.jobs.values() if j.name == name and not j.ended]
            if live:
                return (
                    f"the fine-tune {live[0].id} making {name!r} is {live[0].state}; add it "
                    "once it has succeeded (`llmgw ctl finetune show`)"
                )
            return f"no fine-tune made an adapter {name!r}; see `llmgw ctl finetune list`"
        if job.model != model:
            return f"{name!r} was trained for {job.model}, not {model}"
        return None

    async def _give(self, node_id: str, ask: AdapterAsk) -> None:
        """One piece of a stored adapter, sent to the node that asked."""
        view = self.registry.nodes.get(node_id)
        session = view.session if view is not None else None
        if session is None:
            return
        job = self.succeeded(ask.name)
        piece = AdapterPiece(ask_id=ask.ask_id, name=ask.name, at=ask.at)
        if job is None:
            piece = replace(piece, error=self.servable("", ask.name) or "no such fine-tune")
        else:
            data = self._given[1] if self._given and self._given[0] == job.id else None
            if data is None:
                found = await self.adapter(ask.name)
                data = found[1] if found else None
                self._given = (job.id, data) if data is not None else None
            if data is None:
                piece = replace(piece, error=f"the stored adapter of {job.id} is damaged")
            elif not 0 <= ask.at < len(data):
                piece = replace(piece, error=f"no piece at {ask.at} of {len(data):,} bytes")
            else:
                piece = replace(
                    piece,
                    data=data[ask.at : ask.at + PIECE],
                    total=len(data),
                    sha256=job.adapter_sha256,
                    kind=job.adapter_kind,
                )
        with contextlib.suppress(ConnectionError):
            await session.send(piece)

    # --- creating ---------------------------------------------------------------------

    async def create(self, ask: FinetuneAsk, by: Principal) -> FinetuneJob:
        models = self.models()
        model = models.get(ask.model)
        if model is None:
            raise Refusal(
                404, "not_found", f"no model {ask.model!r} in the catalog; see `llmgw ctl models`"
            )
        taken = adapters.name_taken(models, ask.name, adding_to=model.name)
        if taken is None and any(
            j.name == ask.name and j.state != "failed" and j.state != "cancelled"
            for j in self.jobs.values()
        ):
            taken = f"a fine-tune already makes or made the adapter {ask.name!r}"
        if taken is not None:
            raise Refusal(409, "exists", f"{taken}; give it another --name", "name")
        base = self._base(model, ask.base)
        data = pairs.check(ask.data.encode("utf-8"))
        place = placement.choose(self.candidates(), ask.mib, ask.node)
        at = self.now()
        job = FinetuneJob(
            id=new_id(),
            name=ask.name,
            model=model.name,
            base=base,
            epochs=ask.epochs,
            rank=ask.rank,
            mib=ask.mib,
            pairs=data.count,
            created=at,
            updated=at,
            node=place.node,
            device=place.device,
            cards=place.cards,
            by=by.name,
        )
        detail = f"{job.model} on {job.node} ({job.device}), {job.pairs} pairs"
        await self._put(job, Audit(by.name, "finetune.create", job.id, detail))
        self._heard[job.id] = self.clock()
        spec = FinetuneSpec(
            id=job.id,
            name=job.name,
            model=job.model,
            base=base,
            epochs=job.epochs,
            rank=job.rank,
            device=place.device,
            cards=list(place.cards),
            mib=job.mib,
            data_bytes=len(data.data),
            data_sha256=data.sha256,
            pairs=data.count,
            convert=model.engine == "llama.cpp",
            allow_pickle=model.allow_pickle,
        )
        try:
            await self._send(place.node, spec, data.data)
        except (ConnectionError, TimeoutError, RuntimeError) as exc:
            return await self._fail(self.jobs[job.id], f"could not send it to {place.node}: {exc}")
        job = self.jobs[job.id]
        if job.state == "queued":
            job = job.changed(self.now(), state="preparing")
            self._keep(job)
        return job

    def _base(self, model: Model, base: str | None) -> str:
        """The safetensors checkpoint trained on: ``base``, or the model's own source
        where it is one."""
        source = base or model.source
        try:
            parsed = parse_source(source, allow_http=True)
        except WeightsError as exc:
            raise Refusal(400, "invalid_base", f"--base: {exc}", "base") from None
        gguf = default_engine(parsed.text) == "llama.cpp" or parsed.quant is not None
        if gguf:
            said = "--base" if base else f"{model.name} is served from GGUF ({model.source}); "
            raise Refusal(
                400,
                "invalid_base",
                f"{said} training needs the HF safetensors checkpoint the model was made "
                "from: pass --base hf:ORG/REPO (or a path on the node)",
                "base",
            )
        return parsed.text

    def candidates(self) -> list[Candidate]:
        """The nodes as ``placement`` judges them."""
        training = {j.node: j.id for j in self.jobs.values() if not j.ended and j.node}
        out = []
        for view in self.registry.nodes.values():
            facts, live = view.facts, view.live
            gpus = live.gpus if live.gpus is not None else (facts.gpus if facts else [])
            cards = tuple(
                Card(
                    g.uuid,
                    (g.memory_total - g.memory_used) // placement.MIB
                    if g.memory_total is not None and g.memory_used is not None
                    else None,
                )
                for g in gpus
            )
            ram = live.memory_available
            if ram is None and facts is not None:
                ram = facts.memory_available
            out.append(
                Candidate(
                    node=view.id,
                    ready=view.state == NodeState.READY and view.session is not None,
                    schedulable=not (view.cordoned or view.draining),
                    training=training.get(view.id),
                    cards=cards,
                    ram_free_mib=ram // placement.MIB if ram is not None else None,
                )
            )
        return out

    async def _send(self, node: str, spec: FinetuneSpec, data: bytes) -> None:
        for at in range(0, len(data), PIECE):
            await self._ask(
                node, "finetune.data", {"id": spec.id, "at": at, "data": data[at : at + PIECE]}
            )
        await self._ask(node, "finetune.start", {"spec": to_map(spec)})

    async def _ask(self, node: str, kind: str, args: dict[str, Any]) -> object:
        view = self.registry.nodes.get(node)
        session = view.session if view is not None else None
        if session is None:
            raise ConnectionError(f"node {node} is not connected")
        async for answer in session.ask(kind, args, ASK_TIMEOUT):
            if not answer.ok:
                raise RuntimeError(answer.error or "the node refused it")
            return answer.result
        raise ConnectionError(f"node {node} gave no answer to {kind}")

    # --- the node's word --------------------------------------------------------------

    def report(self, node_id: str, msg: FinetuneStatus | AdapterAsk) -> None:
        """A fine-tune's status, or an ask for a stored adapter, from ``node_id`` (the
        registry's hook)."""
        if isinstance(msg, AdapterAsk):
            self._spawn(self._give(node_id, msg))
            return
        job = self.jobs.get(msg.id)
        if job is None or job.node != node_id:
            log.info("node %s reports fine-tune %s, which it does not run here", node_id, msg.id)
            return
        if job.ended:
            return
        self._heard[job.id] = self.clock()
        if msg.state not in AGENT_STATES:
            return
        loss = (
            job.loss[: msg.loss_at] + tuple(msg.loss) if msg.loss_at <= len(job.loss) else job.loss
        )
        fields: dict[str, Any] = {"loss": loss, "doing": msg.doing}
        for name in (
            "step",
            "steps",
            "peak_mib",
            "adapter_bytes",
            "adapter_sha256",
            "adapter_kind",
        ):
            value = getattr(msg, name)
            if value is not None:
                fields[name] = value
        if msg.state == "failed":
            fields["error"] = msg.error or "the trainer failed and said nothing"
        if job.state != "uploading" or msg.state in ("failed", "cancelled"):
            fields["state"] = msg.state
        changed = job.changed(self.now(), **fields)
        self._keep(changed)
        if changed.ended:
            # Said in the audit log as the control plane's own failures are; the node
            # then deletes what it kept of the job (the pairs among it).
            self._heard.pop(job.id, None)
            action = "finetune.failed" if changed.state == "failed" else "finetune.cancel"
            audit = Audit(job.by or "finetune", action, job.id, changed.error or node_id)
            self._spawn(self._put(changed, audit))
            self._forget_soon(changed)
        if changed.state == "uploading":
            self._wake.set()

    # --- the leader's duty --------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await self.load()
        try:
            while not stop.is_set():
                try:
                    await self.tick()
                except Exception:
                    log.exception("fine-tunes: a pass failed; the next one tries again")
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
        finally:
            pending = [*self._uploads.values(), *self._tasks]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self._uploads.clear()

    async def tick(self) -> None:
        limit = self.registry.interval * self.registry.missed
        now = self.clock()
        for job in list(self.jobs.values()):
            if job.ended:
                continue
            if job.state == "uploading" and job.id not in self._uploads:
                self._uploads[job.id] = asyncio.create_task(self._upload(job.id))
            elif job.id not in self._uploads and now - self._heard.get(job.id, now) > limit:
                await self._fail(
                    job,
                    f"node {job.node} lost: nothing heard of the job for {limit:g} s "
                    "(the node's stream is gone, or it no longer runs the job)",
                )
        for job_id, task in list(self._uploads.items()):
            if task.done():
                del self._uploads[job_id]
        await self.flush()

    async def flush(self) -> None:
        dirty, self._dirty = self._dirty, set()
        rows = [stored_row(self.jobs[i]) for i in sorted(dirty) if i in self.jobs]
        try:
            if rows:
                await self.store.finetunes.put_many(rows)
        except Exception:
            self._dirty |= dirty
            raise

    async def _upload(self, job_id: str) -> None:
        job = self.jobs[job_id]
        size, digest = job.adapter_bytes, job.adapter_sha256
        if size is None or digest is None:
            await self._fail(job, f"node {job.node} said the adapter is ready but not its size")
            return
        assert job.node is not None
        parts = []
        try:
            for at in range(0, size, PIECE):
                piece = await self._ask(job.node, "finetune.piece", {"id": job_id, "at": at})
                if not isinstance(piece, bytes) or not piece:
                    raise RuntimeError(f"the piece at {at} came back empty")
                parts.append(piece)
        except (ConnectionError, TimeoutError, RuntimeError) as exc:
            await self._fail(self.jobs[job_id], f"taking the adapter from {job.node}: {exc}")
            return
        adapter = b"".join(parts)
        got = hashlib.sha256(adapter).hexdigest()
        job = self.jobs[job_id]
        if job.ended:
            return
        if len(adapter) != size or got != digest:
            await self._fail(
                job,
                f"the adapter arrived damaged: {len(adapter):,} bytes with sha256 {got[:12]}, "
                f"the node said {size:,} bytes with sha256 {digest[:12]}",
            )
            return
        done = job.changed(self.now(), state="succeeded", doing=None, error=None)
        audit = Audit(
            job.by or "finetune", "finetune.succeeded", job.id, f"{job.name}: {size:,} bytes"
        )
        await self.store.finetunes.finish(stored_row(done), adapter, PIECE, audit)
        self.jobs[job_id] = done
        self._heard.pop(job_id, None)
        if done.node is not None:
            with contextlib.suppress(ConnectionError, TimeoutError, RuntimeError):
                await self._ask(done.node, "finetune.forget", {"id": job_id})

    # --- ending -------------------------------------------------------------------------

    async def cancel(self, job_id: str, by: Principal) -> FinetuneJob:
        job = self.find(job_id)
        if job.ended:
            raise Refusal(409, "ended", f"fine-tune {job_id} has already {job.state}")
        said = ""
        if job.node is not None:
            try:
                await self._ask(job.node, "finetune.cancel", {"id": job_id})
            except (ConnectionError, TimeoutError, RuntimeError) as exc:
                said = f" (its node was not told: {exc})"
        task = self._uploads.pop(job_id, None)
        if task is not None:
            task.cancel()
        done = self.jobs[job_id].changed(self.now(), state="cancelled", doing=None)
        await self._put(done, Audit(by.name, "finetune.cancel", job_id, said.strip(" ()")))
        self._heard.pop(job_id, None)
        self._forget_soon(done)
        return done

    async def _fail(self, job: FinetuneJob, reason: str) -> FinetuneJob:
        log.warning("fine-tune %s failed: %s", job.id, reason)
        failed = job.changed(self.now(), state="failed", error=reason, doing=None)
        await self._put(failed, Audit(job.by or "finetune", "finetune.failed", job.id, reason))
        self._heard.pop(job.id, None)
        self._forget_soon(failed)
        return failed

    def _forget_soon(self, job: FinetuneJob) -> None:
        """The node deletes what it kept of an ended job (its pairs, its directory), in
        the background: a node that is gone or slow holds nothing up."""
        node = job.node
        if node is None or self.registry.nodes.get(node) is None:
            return

        async def forget() -> None:
            with contextlib.suppress(ConnectionError, TimeoutError, RuntimeError):
                await self._ask(node, "finetune.forget", {"id": job.id})

        self._spawn(forget())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _put(self, job: FinetuneJob, audit: Audit) -> None:
        await self.store.finetunes.put(stored_row(job), audit)
        self.jobs[job.id] = job
        self._dirty.discard(job.id)

    def _keep(self, job: FinetuneJob) -> None:
        self.jobs[job.id] = job
        self._dirty.add(job.id)


def stored_row(job: FinetuneJob) -> FinetuneRow:
    """The store's row of a job."""
    return FinetuneRow(
        job.id, job.name, job.model, job.state, job.document(), job.created, job.updated
    )
