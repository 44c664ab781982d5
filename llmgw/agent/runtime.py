"""The agent's work beyond the stream: shards, engines, weights and the requests the
control plane makes of the node (logs, the weights list, collecting, a model's shape).

``NodeRuntime`` is what the session calls: it adds engines and running shards to
Register, per-shard usage and the memory read rate to heartbeats, and handles
StartShard, StopShard, Slurm and Request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmgw.agent import upgrade
from llmgw.agent.cachewatch import CacheWatch
from llmgw.agent.clustersettings import ClusterSettings
from llmgw.agent.discovery.ibwatch import parse_smir, run_ibnetdiscover
from llmgw.agent.engines.converge import EngineConvergence
from llmgw.agent.engines.install import LlamaCppInstaller
from llmgw.agent.engines.provision import NodeEngines
from llmgw.agent.engines.pyinstall import PACKAGES, PythonEngineInstaller, find_uv
from llmgw.agent.fabricprobe import BandwidthServers, run_client
from llmgw.agent.finetune import runner as finetune
from llmgw.agent.finetune.adapters import FinetunedWeights, StoredAdapters
from llmgw.agent.finetune.kit import TrainEnvKit
from llmgw.agent.logbook import AGENT_LINES, LogRing, RingHandler
from llmgw.agent.memrate import MemoryRateProbe
from llmgw.agent.nodewall import NodeFirewall
from llmgw.agent.session import HeartbeatFields, RegisterFields
from llmgw.agent.slurmnode import SlurmNode
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.weights import HubClient, WeightStore
from llmgw.agent.weights.cache import manifest_holds, read_manifest
from llmgw.config import AgentConfig
from llmgw.modelkit.files import ShapeError, inspect_local
from llmgw.modelkit.sources import SourceError, cache_name, parse_source
from llmgw.reexec import exec_again
from llmgw.tracing import OFF, Tracing, install_log_filter
from llmgw.wire.messages import (
    AdapterPiece,
    AgentSettings,
    EngineInfo,
    EngineStatus,
    Firewall,
    Message,
    MetricsAccess,
    Request,
    Response,
    ShardStatus,
    Slurm,
    StartShard,
    StopShard,
    WantedEngines,
)
from llmgw.wire.states import ShardState

log = logging.getLogger("llmgw.agent.runtime")

PROBE_EVERY = 600.0
FOLLOW_FLUSH = 0.5
FOLLOW_KEEPALIVE = 20.0
# How long the answer to a restart has to leave before the exec (seconds).
RESTART_GRACE = 0.3


@dataclass(frozen=True)
class RuntimeOptions:
    state_dir: Path
    weights_dir: Path
    release_source: str
    llamacpp_version: str | None = None
    converter_source: str | None = None
    engines: dict[str, str] = field(default_factory=dict)
    hf_endpoint: str | None = None
    engine_user: str | None = None
    engine_host: str = "0.0.0.0"
    # Measure the memory read rate once in the background (cached in the state dir).
    measure_memory: bool = True
    # The cluster's settings (ctl config) and what the agent runs with; a change of the
    # latter starts the agent again (``restart``: the same program, its engines adopted).
    settings: ClusterSettings | None = None
    running: AgentConfig | None = None
    restart: Callable[[], None] | None = None
    # Where the spans of replica starts go (``run_agent`` starts it).
    tracing: Tracing = OFF


class NodeRuntime:
    def __init__(self, opts: RuntimeOptions) -> None:
        self.opts = opts
        self.agent_log = LogRing(AGENT_LINES)
        self._handler = RingHandler(self.agent_log)
        logging.getLogger().addHandler(self._handler)
        if opts.tracing.enabled:
            install_log_filter()  # the tail `ctl logs` reads carries trace ids too
        self._send: Callable[[Message], None] | None = None
        self.installer = LlamaCppInstaller(
            opts.state_dir / "engines",
            opts.release_source,
            opts.llamacpp_version,
            progress=self._engine_words,
        )
        # vLLM and SGLang are installed with uv, when the node has it.
        python = (
            {
                name: PythonEngineInstaller(
                    opts.state_dir / "engines", name, progress=self._engine_words
                )
                for name in PACKAGES
            }
            if find_uv()
            else {}
        )
        self.engines = NodeEngines(opts.engines, self.installer, python)
        self.engine_list: list[EngineInfo] = []
        self.hub = HubClient(opts.hf_endpoint, allow_http=_loopback(opts.hf_endpoint))
        self.weights = WeightStore(opts.weights_dir, self.hub)
        # vLLM replicas' KV-cache events (kv_events), netted and sent up the stream.
        self.cache = CacheWatch(opts.state_dir / "kvevents", self.emit)
        # Fine-tunes' stored adapters (finetune:NAME), fetched from the control plane.
        self.stored_adapters = StoredAdapters(opts.state_dir / "finetuned", self.emit)
        self.supervisor = Supervisor(
            opts.state_dir / "shards",
            self,
            FinetunedWeights(self.weights, self.stored_adapters),
            self.emit,
            host=opts.engine_host,
            engine_user=opts.engine_user,
            cache=self.cache,
            tracing=opts.tracing,
        )
        self._follows: dict[str, asyncio.Task[None]] = {}
        # Fine-tune jobs the control plane sends (``finetune.*`` requests).
        self.finetunes = finetune.FinetuneRunner(
            opts.state_dir / "finetunes",
            self.weights,
            TrainEnvKit(opts.state_dir / "trainer", opts.converter_source),
            self.emit,
            engine_user=opts.engine_user,
        )
        # The engines the fleet wants, installed in the background.
        self.convergence = EngineConvergence(
            self.engines,
            opts.state_dir,
            self.probe,
            self.supervisor.binaries,
            said=self._report_engines,
        )
        self.firewall = NodeFirewall(opts.state_dir)
        # Told the cluster's metrics token when the control plane gives it; None: this
        # agent serves no metrics of its own (agent/metricsport.py).
        self.metrics_token: Callable[[str], None] | None = None
        # This node's part in the cluster's Slurm, kept in the background.
        self.slurm = SlurmNode(opts.state_dir, self.emit)
        # ib_write_bw servers started for the control plane's fabric tests.
        self.bw_servers = BandwidthServers()
        self._probe_task: asyncio.Task[None] | None = None
        self.memrate = MemoryRateProbe(opts.state_dir)
        # The cluster's settings changed without a restart: the next heartbeat says so.
        self._settings_changed = False
        self._progress_sent: dict[str, str] = {}

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Adopt what a previous agent left running, then look at the engines."""
        if self.opts.measure_memory:
            self.memrate.start()
        adopted = await self.supervisor.adopt()
        if adopted:
            log.info("adopted %d running shard(s): %s", len(adopted), ", ".join(adopted))
        await self.probe()
        self._probe_task = asyncio.create_task(self._probe_forever())

    async def probe(self) -> None:
        found = await self.engines.probe()
        progress = dict(self.convergence.progress)
        if (found, progress) != (self.engine_list, self._progress_sent):
            self.engine_list = found
            self._report_engines()

    def _report_engines(self, message: str | None = None) -> None:
        self._progress_sent = dict(self.convergence.progress)
        self.emit(
            EngineStatus(
                engines=self.engine_list,
                probed=self.engines.probed,
                message=message,
                progress=self._progress_sent,
            )
        )

    async def ensure(
        self, name: str, report: Callable[[str], None], version: str | None = None
    ) -> EngineInfo:
        """The supervisor's engine provider: an install it caused is reported at once."""
        info = await self.engines.ensure(name, report, version)
        if info not in self.engine_list:
            self.engine_list = [*self.engine_list, info]
            self._report_engines()
        return info

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(PROBE_EVERY)
            try:
                await self.probe()
            except Exception:
                log.exception("probing engines failed; will try again")

    async def close(self) -> None:
        """The agent is going: stop watching; engines keep serving for the next agent."""
        if self._probe_task is not None:
            self._probe_task.cancel()
        await self.convergence.close()
        await self.slurm.close()  # its daemons keep running, as engines do
        await self.bw_servers.close()
        await self.memrate.close()
        for task in self._follows.values():
            task.cancel()
        await self.finetunes.close()
        await self.supervisor.close()
        await self.cache.close()
        await self.weights.close()
        with contextlib.suppress(Exception):
            await self.hub.close()
        logging.getLogger().removeHandler(self._handler)

    def _engine_words(self, words: str) -> None:
        log.info("%s", words)
        self._report_engines(words)

    # --- the session's hooks ----------------------------------------------------------

    def emit(self, msg: Message) -> None:
        if isinstance(msg, ShardStatus) and msg.state == ShardState.STOPPED:
            self.convergence.poke()
        if self._send is not None:
            self._send(msg)

    def attach(self, send: Callable[[Message], None] | None) -> None:
        self._send = send
        self.finetunes.attach(send is not None)
        if send is None:
            self.stored_adapters.detached()
        if send is not None:
            self.cache.attach()  # a control plane new to this stream knows no cache
            self.slurm.report_soon()  # what Slurm is here, before any Slurm message

    def register_fields(self) -> RegisterFields:
        settings, running = self.opts.settings, self.opts.running
        return {
            # The wire's field is a plain map of the report.
            "settings": dict(settings.report(running)) if settings and running else None,
            "engines": self.engine_list,
            "engines_probed": self.engines.probed,
            "installable_engines": self.engines.installable,
            "shards": self.supervisor.statuses(),
        }

    def engine_groups(self) -> set[int]:
        """The process groups of the engines this node runs (each engine leads its own)."""
        return {s.pid for s in self.supervisor.shards.values() if s.pid is not None}

    def heartbeat_fields(self) -> HeartbeatFields:
        self.finetunes.beat()  # each live fine-tune's word goes with the heartbeat
        fields: HeartbeatFields = {"shards": self.supervisor.usage()}
        fields.update(self.memrate.heartbeat_fields())
        settings, running = self.opts.settings, self.opts.running
        if self._settings_changed and settings and running:
            self._settings_changed = False
            fields["settings"] = dict(settings.report(running))
        return fields

    async def handle(self, msg: Message) -> None:
        if isinstance(msg, StartShard):
            self.supervisor.start(msg.spec, msg.traceparent)
            await self.firewall.peers(self.supervisor.peers(), self.supervisor.collective_peers())
        elif isinstance(msg, StopShard):
            await self.supervisor.stop(msg.replica_id, msg.grace)
            await self.firewall.peers(self.supervisor.peers(), self.supervisor.collective_peers())
        elif isinstance(msg, AgentSettings):
            self._settings(msg)
        elif isinstance(msg, WantedEngines):
            self.convergence.want(msg)
        elif isinstance(msg, Firewall):
            await self.firewall.keep(msg)
        elif isinstance(msg, MetricsAccess):
            if self.metrics_token is not None:
                self.metrics_token(msg.token)
        elif isinstance(msg, Slurm):
            self.slurm.want(msg)
        elif isinstance(msg, AdapterPiece):
            self.stored_adapters.piece(msg)
        elif isinstance(msg, Request):
            try:
                await self._answer(msg)
            except Exception as exc:
                log.exception("request %s (%s) failed", msg.id, msg.kind)
                self.emit(Response(id=msg.id, ok=False, error=f"{type(exc).__name__}: {exc}"))

    def _settings(self, msg: AgentSettings) -> None:
        settings = self.opts.settings
        if settings is None:
            return
        before = (settings.version, settings.problem)
        if not settings.accept(msg.version, msg.default, msg.node):
            # Taken without a change to what runs (or refused): said with the next beat.
            self._settings_changed = (settings.version, settings.problem) != before
            return
        log.info(
            "the cluster's settings (version %d) change what this agent runs with: "
            "starting again (the engines keep serving)",
            msg.version,
        )
        (self.opts.restart or restart_self)()

    # --- requests ---------------------------------------------------------------------

    async def _answer(self, req: Request) -> None:
        if req.kind == "logs":
            await self._logs(req)
        elif req.kind == "cancel":
            task = self._follows.pop(str(req.args.get("id")), None)
            if task is not None:
                task.cancel()
        elif req.kind == "weights.list":
            listing = await self.weights.list_cache()
            self.emit(Response(id=req.id, result=[asdict(s) for s in listing]))
        elif req.kind == "weights.collect":
            names = [str(n) for n in req.args.get("names", [])]
            done = await self.weights.collect(names)
            self.emit(
                Response(
                    id=req.id,
                    result={
                        "removed": done.removed,
                        "kept": [{"path": p, "reason": r} for p, r in done.kept],
                        "freed_bytes": done.freed_bytes,
                    },
                )
            )
        elif req.kind == "weights.inspect":
            await self._inspect(req)
        elif req.kind == "fabric.discover":
            await self._discover_fabric(req)
        elif req.kind in ("fabric.bw_serve", "fabric.bw_run"):
            await self._bandwidth(req)
        elif req.kind == "upgrade":
            await upgrade.answer(req, self.emit, self.opts.restart or restart_self)
        elif req.kind == "restart":
            await self._restart(req)
        elif req.kind in finetune.KINDS:
            await self.finetunes.answer(req)
        else:
            self.emit(
                Response(id=req.id, ok=False, error=f"this agent does not answer {req.kind!r}")
            )

    async def _restart(self, req: Request) -> None:
        """``llmgw restart``: said yes to first, then this agent again in place (its
        engines keep serving and are adopted)."""
        log.info("asked to start again in place (llmgw restart); the engines keep serving")
        self.emit(Response(id=req.id, result={"restarting": True}))
        # The answer is on the socket once written; a moment for it to leave before the
        # exec closes every descriptor (the control plane waits for the new stream anyway).
        await asyncio.sleep(RESTART_GRACE)
        (self.opts.restart or restart_self)()

    async def _discover_fabric(self, req: Request) -> None:
        """The control plane's map of an InfiniBand fabric, read from this node."""
        port = req.args.get("port")
        device = str(req.args.get("device") or "") or None
        at = int(port) if isinstance(port, int) else None
        try:
            text = await run_ibnetdiscover(device, at)
        except RuntimeError as exc:
            self.emit(Response(id=req.id, ok=False, error=str(exc)))
            return
        # Every SM the fabric's SA knows, where saquery is there too; None when not read.
        smir = None
        with contextlib.suppress(RuntimeError):
            smir = parse_smir(
                await run_ibnetdiscover(device, at, tool="saquery", extra=("SMIR",), timeout=30)
            )
        self.emit(Response(id=req.id, result={"text": text, "smir": smir}))

    async def _bandwidth(self, req: Request) -> None:
        """One rail of a fabric test: this node's ``ib_write_bw`` server, or its client."""
        a = req.args
        try:
            device, ib_port = str(a["device"]), int(a["ib_port"])
            tcp_port, seconds = int(a["tcp_port"]), int(a.get("seconds", 5))
            if req.kind == "fabric.bw_serve":
                await self.bw_servers.serve(device, ib_port, tcp_port, seconds)
                self.emit(Response(id=req.id, result={"listening": True}))
                return
            run = await run_client(device, ib_port, tcp_port, str(a["server"]), seconds)
        except (KeyError, ValueError, RuntimeError) as exc:
            self.emit(Response(id=req.id, ok=False, error=str(exc)))
            return
        self.emit(
            Response(
                id=req.id,
                result={
                    "gbps": run.bw_average_gbps,
                    "peak": run.bw_peak,
                    "unit": run.bw_unit,
                    "size_bytes": run.size_bytes,
                },
            )
        )

    async def _inspect(self, req: Request) -> None:
        """A model's shape from files this node holds: a local path, or the cache."""
        source = str(req.args.get("source", ""))
        try:
            result = await asyncio.to_thread(self._inspect_held, source)
        except (ShapeError, SourceError) as exc:
            self.emit(Response(id=req.id, ok=False, error=str(exc)))
            return
        self.emit(Response(id=req.id, result=result))

    def _inspect_held(self, source: str) -> dict[str, object]:
        src = parse_source(source, allow_http=True)
        path: Path | None = None
        if src.kind == "local":
            assert src.path is not None
            path = src.path if src.path.exists() else None
        else:
            name = cache_name(src)
            directory = self.weights.cache_dir / name
            manifest = read_manifest(directory)
            # Read only, never repaired here: fetching owns the cache's markers.
            if (
                manifest is not None
                and manifest.name == name
                and manifest_holds(directory, manifest)
            ):
                path = directory / manifest.entry if manifest.entry else directory
        if path is None:
            raise ShapeError(
                f"{src.text} is not on this node (neither a local path nor whole in its "
                "weights cache)"
            )
        # Pickles are only named, never loaded: the control plane applies the rule.
        return inspect_local(path, allow_pickle=True)

    def _ring(self, source: str) -> LogRing | None:
        if source == "agent":
            return self.agent_log
        shard = self.supervisor.shards.get(source)
        return shard.ring if shard is not None else None

    async def _logs(self, req: Request) -> None:
        source = str(req.args.get("source", "agent"))
        ring = self._ring(source)
        if ring is None:
            known = ", ".join(["agent", *sorted(self.supervisor.shards)])
            self.emit(
                Response(
                    id=req.id, ok=False, error=f"no log {source!r} on this node (it has: {known})"
                )
            )
            return
        n = int(req.args.get("n", 100))
        follow = bool(req.args.get("follow"))
        self.emit(Response(id=req.id, result=ring.tail(n), more=follow))
        if follow:
            self._follows[req.id] = asyncio.create_task(self._follow(req.id, ring))

    async def _follow(self, request_id: str, ring: LogRing) -> None:
        """Send new lines in small batches until cancelled; an empty batch now and then
        tells the control plane the node is still there."""
        pending: list[str] = []
        stop = ring.listen(pending.append)
        try:
            quiet = 0.0
            while True:
                await asyncio.sleep(FOLLOW_FLUSH)
                quiet += FOLLOW_FLUSH
                if pending or quiet >= FOLLOW_KEEPALIVE:
                    batch, pending[:] = list(pending), []
                    self.emit(Response(id=request_id, result=batch, more=True))
                    quiet = 0.0
        finally:
            stop()
            self._follows.pop(request_id, None)


def _loopback(endpoint: str | None) -> bool:
    """Plain http is allowed only to a hub on this machine (a mirror in tests)."""
    return bool(endpoint) and any(
        h in str(endpoint) for h in ("://127.", "://localhost", "://[::1]")
    )


def restart_self() -> None:
    """This agent again, as it was started: the same process id, so its engines stay its
    children, and the new agent adopts them (supervisor.py)."""
    exec_again()
