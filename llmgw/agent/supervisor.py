"""Engine processes on this node: start, watch, stop, and adopt after an agent restart.

Each shard's engine runs in its own session (process group), writes its output to a
file in the state dir, and has its spec (with its pid) kept beside it. So an agent that
is killed leaves its engines serving, and the next agent finds them again: same replica,
same process, no restart. The engine's key reaches it in its environment, never on its
command line (SGLang, which takes it only as an argument, excepted).

The shard's record and the probes of its process and port are in ``llmgw.agent.shard``;
here is the order of a shard's life: install, fetch, launch, wait, watch, stop, adopt.

With tracing on, a start is a span (``replica start``) continued from the control
plane's (the StartShard's traceparent), with a child for each step up to ready:
``install``, ``fetch``, ``engine start``, ``ready``; each ends when its step does, and
the failure that ends a start is recorded on the step and the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import NotRequired, Protocol, TypedDict

import aiohttp
import psutil

from llmgw.agent.cachewatch import CacheWatch, wants_events
from llmgw.agent.engines import EngineError, adapter
from llmgw.agent.engines.base import EngineAdapter
from llmgw.agent.logbook import ENGINE_LINES, follow_file, last_lines_of
from llmgw.agent.shard import Shard, accepts, port_in_use, split_endpoint, still_ours
from llmgw.agent.weights import WeightsError, lora, parse_source, projector
from llmgw.agent.weights.fetch import Fetcher
from llmgw.config import format_hostport
from llmgw.modelkit.sources import check_named_pickle
from llmgw.pki import write_private
from llmgw.tracing import OFF, Tracing
from llmgw.wire.messages import (
    Compute,
    EngineInfo,
    Message,
    ShardSpec,
    ShardStatus,
    ShardUsage,
    to_map,
)
from llmgw.wire.messages import from_map as message_from_map
from llmgw.wire.states import ShardState

log = logging.getLogger("llmgw.agent.supervisor")

CRASH_LINES = 30
HEALTH_POLL = 0.5
WATCH_POLL = 1.0
# A stopped or crashed engine is reported once the loop knows it ended (killed, it may
# take the kernel a moment): every process started here is waited for.
REAP_WAIT = 5.0


class ShardRecord(TypedDict):
    """A shard's file in the state dir, so a new agent adopts the engine left running."""

    spec: dict[str, object]  # the ShardSpec as its wire map
    pid: int | None
    create_time: float | None
    started_at: float | None
    # What the engine said it runs on, once it was ready (Compute's wire map): kept
    # here because its start-up lines leave the log's tail as requests are logged.
    compute: NotRequired[dict[str, object] | None]
    # Whether it takes images, as found when its weights were fetched.
    vision: NotRequired[bool | None]


class EngineProvider(Protocol):
    async def ensure(
        self, name: str, report: Callable[[str], None], version: str | None = None
    ) -> EngineInfo:
        """The engine, installed first if it must be; raises with the reason if it cannot."""


class Supervisor:
    def __init__(
        self,
        root: Path,
        engines: EngineProvider,
        weights: Fetcher,
        emit: Callable[[Message], None],
        *,
        host: str = "0.0.0.0",
        engine_user: str | None = None,
        cache: CacheWatch | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        self.root = root
        self.tracing = tracing
        self.engines = engines
        self.weights = weights
        self.emit = emit
        self.host = host
        self.engine_user = engine_user
        self.shards: dict[str, Shard] = {}
        # vLLM replicas' KV-cache events, for the router (kv_events).
        self.cache = cache

    # --- files ------------------------------------------------------------------------

    def _spec_path(self, replica_id: str) -> Path:
        return self.root / f"{replica_id}.json"

    def log_path(self, replica_id: str) -> Path:
        return self.root / f"{replica_id}.log"

    def workdir(self, replica_id: str) -> Path:
        """The replica's directory: its engine's working directory."""
        return self.root / "work" / replica_id

    def _save(self, shard: Shard) -> None:
        record: ShardRecord = {
            "spec": to_map(shard.spec),
            "pid": shard.pid,
            "create_time": shard.create_time,
            "started_at": shard.started_at,
            "compute": to_map(shard.compute) if shard.compute is not None else None,
            "vision": shard.vision,
        }
        # The spec holds the engine key: readable by the agent's user alone.
        write_private(self._spec_path(shard.spec.replica_id), json.dumps(record).encode())

    def _forget(self, replica_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._spec_path(replica_id).unlink()
        # Whatever the engine left in its directory goes with it (the log stays).
        shutil.rmtree(self.workdir(replica_id), ignore_errors=True)

    # --- reporting --------------------------------------------------------------------

    def _set(
        self,
        shard: Shard,
        state: ShardState,
        reason: str = "",
        last_lines: list[str] | None = None,
    ) -> None:
        shard.state, shard.reason = state, reason
        log.info("shard %s: %s%s", shard.spec.replica_id, state, f" ({reason})" if reason else "")
        self.emit(shard.status(last_lines))

    def statuses(self) -> list[ShardStatus]:
        return [s.status() for s in self.shards.values() if s.state != ShardState.STOPPED]

    def engine_targets(self) -> list[tuple[str, str, str, str]]:
        """(model, replica, metrics URL, key) of each Ready engine that serves the API
        (a whole replica, or rank 0 of one spanning nodes): the node's own metrics
        scrape them (agent/metricsport.py)."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        out = []
        for shard in self.shards.values():
            spec = shard.spec
            if shard.state != ShardState.READY or (spec.group and spec.group.rank):
                continue
            url = f"http://{format_hostport(host, spec.port)}/metrics"
            out.append((spec.model or spec.source, spec.replica_id, url, spec.key))
        return out

    def usage(self) -> list[ShardUsage]:
        out = []
        for shard in self.shards.values():
            proc = shard.process
            if proc is None or shard.state in (ShardState.FAILED, ShardState.STOPPED):
                continue
            try:
                procs = [proc, *proc.children(recursive=True)]
                cpu = sum(p.cpu_percent(interval=None) for p in procs)
                rss = sum(p.memory_info().rss for p in procs)
            except psutil.Error:
                continue
            out.append(ShardUsage(replica_id=shard.spec.replica_id, cpu_percent=cpu, rss=rss))
        return out

    # --- start ------------------------------------------------------------------------

    def start(self, spec: ShardSpec, traceparent: str | None = None) -> None:
        """Start a shard in the background; a second start of a live one only reports it.
        ``traceparent``: the control plane's span of the start, carried on here."""
        current = self.shards.get(spec.replica_id)
        if current is not None and current.state not in (ShardState.FAILED, ShardState.STOPPED):
            if current.spec.fingerprint == spec.fingerprint:
                self.emit(current.status())
                return
            log.warning(
                "shard %s asked to start with a new profile; stopping the old one", spec.replica_id
            )
        shard = Shard(spec=spec)
        shard.task = asyncio.create_task(self._run(shard, current, traceparent))
        self.shards[spec.replica_id] = shard

    async def _run(self, shard: Shard, previous: Shard | None, traceparent: str | None) -> None:
        spec = shard.spec
        attributes = {"llmgw.replica": spec.replica_id, "llmgw.engine": spec.engine}
        try:
            with self.tracing.span(
                "replica start", attributes, parent=traceparent, kind="server"
            ) as span:
                span.set("llmgw.source", spec.source)
                await self._bring_up(shard, previous)
            await self._watch(shard)
        except asyncio.CancelledError:
            raise
        except (EngineError, WeightsError, OSError, RuntimeError, ValueError) as exc:
            await self._fail(shard, str(exc))
        except Exception as exc:
            log.exception("shard %s failed unexpectedly", spec.replica_id)
            await self._fail(shard, f"{type(exc).__name__}: {exc}")

    async def _bring_up(self, shard: Shard, previous: Shard | None) -> None:
        """From a StartShard to a Ready engine (or a worker up); raises why not."""
        spec = shard.spec
        step = self.tracing.span
        if previous is not None:
            await self._terminate(previous, grace=10.0)
        engine = adapter(spec.engine)
        engine.check(spec)
        # A malformed or pickled source is refused before anything is installed or
        # fetched for it.
        check_named_pickle(
            parse_source(spec.source, allow_http=True), allow_pickle=spec.allow_pickle
        )
        lora.check(spec)  # its LoRA adapters' sources, likewise
        self._set(shard, ShardState.INSTALLING, f"making sure {spec.engine} is installed")
        with step("install") as span:
            info = await self.engines.ensure(
                spec.engine,
                lambda words: self._set(shard, ShardState.INSTALLING, words),
                spec.engine_version,
            )
            span.set("llmgw.engine.version", info.version)
        shard.binary = info.path
        model = Path()
        with step("fetch", {"llmgw.source": spec.source}):
            if not shard.worker or engine.worker_needs_weights:
                self._set(shard, ShardState.DOWNLOADING, f"fetching {spec.source}")
                model = await self.weights.fetch(
                    spec.source,
                    allow_pickle=spec.allow_pickle,
                    replica_id=spec.replica_id,
                    progress=self.emit,
                    vouched=spec.sha256,
                    hub=spec.hub,
                )
            if not shard.worker:
                spec, shard.vision = await asyncio.to_thread(
                    projector.prepare, spec, engine.images, model
                )
                shard.spec = spec
            if spec.adapters and not shard.worker:
                spec = shard.spec = await lora.fetch(self.weights, spec, engine, self.emit)
        port_in_use(self.host, spec.port)
        with step("engine start", {"llmgw.port": spec.port}) as span:
            if spec.group is not None and spec.group.rank == 0 and engine.leader_waits:
                await self._await_workers(shard, spec.group.workers)
            await self._launch(shard, engine, info, model)
            span.set("llmgw.pid", shard.pid)
        with step("ready"):
            if shard.worker:
                await self._until_worker_up(shard, engine)
            else:
                await self._until_ready(shard, engine)

    async def _launch(
        self, shard: Shard, engine: EngineAdapter, info: EngineInfo, model: Path
    ) -> None:
        spec = shard.spec
        self.root.mkdir(parents=True, exist_ok=True)
        build = engine.worker_command if shard.worker else engine.command
        argv = build(info.path, spec, str(model), self.host)
        env = {**os.environ, **engine.environment(spec)}
        if self.cache is not None and wants_events(spec):
            flags, extra = await self.cache.prepare(spec.replica_id)
            argv += flags
            env.update(extra)
        log_path = self.log_path(spec.replica_id)
        # The replica's own directory is the engine's working directory: a relative
        # path in its profile's environment (``engineenv``) is read from there.
        workdir = self.workdir(spec.replica_id)
        workdir.mkdir(mode=0o755, parents=True, exist_ok=True)
        if self.engine_user is not None:
            shutil.chown(workdir, user=self.engine_user)  # the engine may write there
        with log_path.open("ab") as out:
            out.write(f"--- llmgw: starting {' '.join(argv[:1])} at {time.ctime()}\n".encode())
            out.flush()
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=workdir,
                start_new_session=True,
                user=self.engine_user,
            )
        shard.pid = proc.pid
        shard.child = proc
        shard.process = psutil.Process(proc.pid)
        shard.create_time = shard.process.create_time()
        shard.started_at = time.time()
        self._save(shard)
        shard.helpers.append(
            asyncio.create_task(follow_file(log_path, shard.ring, shard.stop_tail))
        )
        # Reap our own child so it never lingers as a zombie that looks alive.
        shard.helpers.append(asyncio.create_task(proc.wait()))
        self._set(shard, ShardState.LOADING, f"{spec.engine} started, pid {proc.pid}")

    async def _until_ready(self, shard: Shard, engine: EngineAdapter) -> None:
        url = f"http://127.0.0.1:{shard.spec.port}{engine.health_path}"
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                if not shard.alive():
                    raise RuntimeError(shard.exit_reason() + " before it was ready")
                try:
                    async with http.get(url) as resp:
                        body = await resp.read()
                        if engine.ready(resp.status, body):
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(HEALTH_POLL)
        await asyncio.sleep(0.3)  # let the tail catch the last start-up lines
        shard.compute = engine.parse_startup(list(shard.ring.lines))
        problem = self._compute_problem(shard)
        if problem:
            raise RuntimeError(problem)
        self._save(shard)  # with its compute, for the agent that adopts it
        self._set(shard, ShardState.READY)

    async def _await_workers(self, shard: Shard, workers: list[str]) -> None:
        """Hold the leader until every worker takes connections: llama-server gives up
        on an RPC server it cannot reach at start-up."""
        said = ""
        while True:
            up = [w for w in workers if await accepts(*split_endpoint(w))]
            if len(up) == len(workers):
                return
            down = ", ".join(w for w in workers if w not in up)
            words = f"waiting for {len(workers) - len(up)} of {len(workers)} workers ({down})"
            if words != said:
                self._set(shard, ShardState.LOADING, words)
                said = words
            await asyncio.sleep(HEALTH_POLL)

    async def _until_worker_up(self, shard: Shard, engine: EngineAdapter) -> None:
        """A worker is up when its port takes connections ("tcp"), its health path
        answers ("http"), or it is still running a moment after it started."""
        group = shard.spec.group
        assert group is not None
        if engine.worker_probe == "http":
            await self._until_ready(shard, engine)
            return
        while True:
            if not shard.alive():
                raise RuntimeError(shard.exit_reason() + " before it was up")
            if engine.worker_probe == "process" or await accepts(
                group.bind or "127.0.0.1", shard.spec.port
            ):
                break
            await asyncio.sleep(HEALTH_POLL)
        await asyncio.sleep(0.3)
        if not shard.alive():
            raise RuntimeError(shard.exit_reason() + " as it started")
        self._set(shard, ShardState.READY, f"rank {group.rank} of {group.size}, up")

    @staticmethod
    def _compute_problem(shard: Shard) -> str | None:
        """A shard given cards must be on them: a CPU fallback is a failure, not a success."""
        if not shard.spec.cards or shard.compute is None:
            return None
        c = shard.compute
        if c.offloaded_layers == 0:
            return f"the engine offloaded no layer to the {len(shard.spec.cards)} card(s) given"
        if c.backend is not None and c.backend.upper() == "CPU" and not c.devices:
            return "the engine found no usable GPU"
        return None

    async def _watch(self, shard: Shard) -> None:
        while shard.alive():
            await asyncio.sleep(WATCH_POLL)
        if not shard.stopping:
            await self._fail(shard, shard.exit_reason())

    async def _fail(self, shard: Shard, reason: str) -> None:
        await asyncio.sleep(0.3)  # the tail may still be catching the last words
        last = shard.ring.tail(CRASH_LINES)
        if shard.alive():
            await self._terminate(shard, grace=5.0, report=False)
        await shard.reaped(REAP_WAIT)
        shard.stop_tail.set()
        self._forget(shard.spec.replica_id)
        if self.cache is not None:
            await self.cache.drop(shard.spec.replica_id)
        self._set(shard, ShardState.FAILED, reason, last_lines=last)

    # --- stop -------------------------------------------------------------------------

    async def stop(self, replica_id: str, grace: float = 10.0) -> None:
        shard = self.shards.get(replica_id)
        if shard is None:
            self.emit(
                ShardStatus(replica_id=replica_id, state=ShardState.STOPPED, reason="not running")
            )
            return
        await self._terminate(shard, grace)

    async def _terminate(self, shard: Shard, grace: float, report: bool = True) -> None:
        """SIGTERM the engine's process group, SIGKILL it after ``grace`` seconds."""
        shard.stopping = True
        task = shard.task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if shard.pid is not None and shard.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(shard.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while shard.alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if shard.alive():
                log.warning(
                    "shard %s did not stop in %.0f s; killing it", shard.spec.replica_id, grace
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(shard.pid, signal.SIGKILL)
        await shard.reaped(REAP_WAIT)
        shard.stop_tail.set()
        self._forget(shard.spec.replica_id)
        if self.cache is not None:
            await self.cache.drop(shard.spec.replica_id)
        if report:
            self._set(shard, ShardState.STOPPED)

    # --- adoption ---------------------------------------------------------------------

    async def adopt(self) -> list[str]:
        """Find the engines a previous agent left running; returns the adopted replica ids."""
        adopted: list[str] = []
        if not self.root.exists():
            return adopted
        for path in sorted(self.root.glob("*.json")):
            try:
                record: ShardRecord = json.loads(path.read_text())
                spec = message_from_map(ShardSpec, record["spec"])
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable shard file %s: %s", path, exc)
                continue
            shard = Shard(
                spec=spec,
                pid=record.get("pid"),
                create_time=record.get("create_time"),
                started_at=record.get("started_at"),
                adopted=True,
                vision=record.get("vision"),
            )
            if await still_ours(shard):
                shard.state = ShardState.READY
                engine = adapter(spec.engine)
                shard.helpers.append(
                    asyncio.create_task(
                        follow_file(self.log_path(spec.replica_id), shard.ring, shard.stop_tail)
                    )
                )
                shard.compute = self._compute_of(record, engine, spec.replica_id)
                shard.task = asyncio.create_task(self._watch(shard))
                if self.cache is not None and wants_events(spec):
                    self.cache.adopt(spec.replica_id)
                self.shards[spec.replica_id] = shard
                adopted.append(spec.replica_id)
                log.info(
                    "adopted shard %s (pid %s, port %d)", spec.replica_id, shard.pid, spec.port
                )
            else:
                log.info("shard %s from before is gone; forgetting it", spec.replica_id)
                self._forget(spec.replica_id)
        return adopted

    def _compute_of(self, record: ShardRecord, engine: EngineAdapter, replica_id: str) -> Compute:
        """An adopted shard's compute: as kept when it became ready; read again from its
        log's tail only for a record an older agent wrote without it."""
        kept = record.get("compute")
        if isinstance(kept, dict):
            try:
                return message_from_map(Compute, kept)
            except (ValueError, TypeError) as exc:
                log.warning("shard %s: its kept compute is unreadable (%s)", replica_id, exc)
        return engine.parse_startup(last_lines_of(self.log_path(replica_id), ENGINE_LINES))

    def peers(self) -> dict[int, tuple[str, ...]]:
        """Ports of this node's shards that a replica's other nodes must reach (a
        worker's, the leader's rendezvous), with the addresses allowed to."""
        out: dict[int, tuple[str, ...]] = {}
        for shard in self.shards.values():
            group = shard.spec.group
            if group is None or shard.state in (ShardState.FAILED, ShardState.STOPPED):
                continue
            if group.rank > 0:
                out[shard.spec.port] = tuple(group.peers)
            elif group.rendezvous_port is not None:
                out[group.rendezvous_port] = tuple(group.peers)
        return out

    def collective_peers(self) -> tuple[str, ...]:
        """The member nodes of this node's replicas spanning nodes whose ranks meet over
        NCCL and gloo (vLLM, SGLang): those listen on ports the kernel picks, which the
        firewall must let the members reach (``llmgw.agent.ephemeral``)."""
        found: set[str] = set()
        for shard in self.shards.values():
            group = shard.spec.group
            if group is None or shard.state in (ShardState.FAILED, ShardState.STOPPED):
                continue
            try:
                collective = adapter(shard.spec.engine).collective
            except EngineError:
                continue
            if collective:
                found.update(group.peers)
        return tuple(sorted(found))

    def binaries(self) -> list[str]:
        """What the shards still here run from: the binary each was started with, or,
        for one adopted, the first words of its process's command line."""
        found: list[str] = []
        for shard in self.shards.values():
            if shard.state == ShardState.STOPPED:
                continue
            if shard.binary:
                found.append(shard.binary)
            elif shard.process is not None:
                with contextlib.suppress(psutil.Error):
                    found.extend(shard.process.cmdline()[:2])
        return found

    async def close(self) -> None:
        """The agent is going: stop watching, leave every engine running."""
        tasks: list[asyncio.Task[object]] = []
        for shard in self.shards.values():
            shard.stop_tail.set()
            tasks += [t for t in (shard.task, *shard.helpers) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)


def on_disk(root: Path) -> dict[str, ShardRecord]:
    """The shard records in ``root``, for tests and the doctor."""
    out: dict[str, ShardRecord] = {}
    for path in root.glob("*.json"):
        with contextlib.suppress(ValueError, OSError):
            out[path.stem] = json.loads(path.read_text())
    return out
