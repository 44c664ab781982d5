"""The node's own metrics, served by its agent on ``agent.metrics_listen`` for
Prometheus to scrape where they live (docs/telemetry.md).

The figures are those the agent's heartbeats carry, taken as each message goes out on
its stream (``NodeMetrics.sent``), so that the agent reads nothing twice and its
heartbeats' own bookkeeping (what changed since the last one) is left alone. They are
written by ``llmgw.metricstext``, the same writer as the control plane's ``/metrics``:
the same family names and labels, so that one dashboard reads either. ``llmgw_node_up``
is left to the control plane (whether it holds the node Ready is its word); a figure
older than ``STALE_AFTER`` seconds, or one the agent could not read lately, is left out.

A scrape sends the cluster's metrics token as a bearer token; the agent is given it
over its stream (``MetricsAccess``) and keeps it only in memory. Without a token the
answer is 401, with a wrong one 403, and 503 until the control plane has given it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from llmgw import metricstext, pki
from llmgw.config import parse_hostport
from llmgw.enginefamilies import scrape
from llmgw.wire.hardware import GPU, Disk, GpuHealth, HostFacts, IbPort, NodeVitals, with_figures
from llmgw.wire.messages import AGED_FIGURES, Heartbeat, Message, Register, ShardStatus

log = logging.getLogger("llmgw.agent.metrics")

STALE_AFTER = 30.0
MEDIA = "text/plain; version=0.0.4; charset=utf-8"


class NodeMetrics:
    """The latest of each figure this agent sent, with when it was read."""

    def __init__(self, node_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self.clock = clock
        self.facts: HostFacts | None = None
        self.memory_available: int | None = None
        self.cpu_percent: float | None = None
        self.load: list[float] | None = None
        self.disks: list[Disk] | None = None
        self.gpus: list[GPU] | None = None
        self.gpu_health: list[GpuHealth] | None = None
        self.vitals: NodeVitals | None = None
        self.ib_ports: list[IbPort] | None = None
        # Discovery's warnings at Register, then the heartbeats' (the cards' health).
        self.warnings: list[str] = []
        self.health_warnings: list[str] = []
        self.read_at: dict[str, float] = {}
        self.unread: frozenset[str] = frozenset()
        self.usage: dict[str, tuple[float | None, int | None]] = {}
        self.sources: dict[str, str] = {}

    def sent(self, msg: Message) -> None:
        """A message went to the control plane: keep what it says of the node."""
        try:
            if isinstance(msg, Heartbeat):
                self._beat(msg)
            elif isinstance(msg, ShardStatus):
                if msg.source:
                    self.sources[msg.replica_id] = msg.source
            elif isinstance(msg, Register):
                self._register(msg)
        except Exception:
            # Called on the stream's way out: the node's own metrics must never end it.
            log.exception("this node's metrics could not take a %s message", msg.TYPE)

    def _register(self, msg: Register) -> None:
        now = self.clock()
        facts = self.facts = msg.host
        self.memory_available, self.cpu_percent = facts.memory_available, facts.cpu_percent
        self.load, self.disks, self.gpus = facts.load, facts.disks, facts.gpus
        self.warnings = list(facts.warnings)
        for name in ("memory_available", "cpu_percent", "load", "disks", "gpus"):
            self.read_at[name] = now
        self.sources.update({s.replica_id: s.source for s in msg.shards if s.source})

    def _beat(self, beat: Heartbeat) -> None:
        now = self.clock()
        ages = beat.ages or {}
        # A heartbeat of the cards' moving figures alone (``gpu_figures``, to a control
        # plane that takes them) goes only while every card's steady facts are as last
        # sent whole: laid over those cards, in order, as the control plane lays them.
        moving = beat.gpu_figures
        cards = self.gpus
        if moving is not None and cards is not None and len(moving) == len(cards):
            self.gpus = [with_figures(c, f) for c, f in zip(cards, moving, strict=True)]
            self.read_at["gpus"] = now - max(0.0, ages.get("gpus", 0.0))
        elif moving is not None:
            # Figures for cards this side never had whole: none to show as now.
            self.read_at.pop("gpus", None)
            ages = {k: v for k, v in ages.items() if k != "gpus"}
        for name in AGED_FIGURES:
            value = getattr(beat, name)
            if value is not None:
                setattr(self, name, value)
            age = ages.get(name)
            if age is not None:
                self.read_at[name] = now - max(0.0, age)
            elif value is not None:
                self.read_at[name] = now
        self.unread = frozenset(beat.unread or ())
        if beat.health_warnings is not None:
            self.health_warnings = list(beat.health_warnings)
        if beat.shards is not None:
            self.usage = {u.replica_id: (u.cpu_percent, u.rss) for u in beat.shards}

    def _live(self, name: str, now: float) -> bool:
        at = self.read_at.get(name)
        return at is not None and now - at <= STALE_AFTER and name not in self.unread

    def sample(self) -> metricstext.NodeSample:
        """The node as of now: what is not live is left out."""
        now = self.clock()
        facts = self.facts

        def live(name: str) -> bool:
            return self._live(name, now)

        shards = tuple(
            metricstext.ShardUsage(
                replica,
                self.sources.get(replica, ""),
                None if cpu is None else cpu / 100,
                rss,
            )
            for replica, (cpu, rss) in sorted(self.usage.items())
        )
        return metricstext.NodeSample(
            id=self.node_id,
            up=True,
            cpu_count=facts.cpu_count if facts else None,
            memory_total=facts.memory_total if facts else None,
            memory_available=self.memory_available if live("memory_available") else None,
            cpu_percent=self.cpu_percent if live("cpu_percent") else None,
            load=tuple(self.load) if self.load is not None and live("load") else None,
            gpus=tuple(self.gpus or ()) if live("gpus") else (),
            disks=tuple(self.disks) if self.disks is not None and live("disks") else None,
            cuda_version=facts.cuda_version if facts else None,
            warnings=tuple(dict.fromkeys([*self.warnings, *self.health_warnings])),
            gpu_health=tuple(self.gpu_health or ()) if live("gpu_health") else (),
            vitals=self.vitals if live("vitals") else None,
            ib_ports=tuple(self.ib_ports or ()) if live("ib_ports") else (),
            shards=shards,
        )

    def text(self) -> str:
        """The exposition: every family declared, this node's samples, no node_up."""
        texts = metricstext.node_text(self.sample())
        return "".join(
            f"# HELP {name} {text}\n# TYPE {name} {kind}\n{texts[i]}"
            for i, (name, kind, text) in enumerate(metricstext.FAMILIES)
            if name != "llmgw_node_up"
        )


# (model, replica, url, key) of each engine of the node that answers the API.
Engines = Callable[[], list[tuple[str, str, str, str]]]


class MetricsPort:
    """``GET /metrics`` on ``listen`` (HOST:PORT), guarded by the metrics token: the
    node's families, then its engines' own (``engines``), relabelled with ``model``
    and ``replica`` as the control plane writes them."""

    def __init__(self, listen: str, metrics: NodeMetrics, engines: Engines = list) -> None:
        self.listen = listen
        self.metrics = metrics
        self.engines = engines
        # Given by the control plane over the stream; None until then.
        self.token: str | None = None
        self.refused = 0
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    def take_token(self, token: str) -> None:
        """The cluster's metrics token, as the control plane gave it."""
        self.token = token

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, port = parse_hostport(self.listen)
        try:
            await web.TCPSite(runner, host or None, port).start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(
                f"agent.metrics_listen {self.listen}: cannot listen there ({exc.strerror}); "
                "choose a free port, or unset it"
            ) from exc
        self._runner = runner
        log.info("serving this node's metrics on %s", self.listen)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _refuse(self, status: int, text: str) -> web.Response:
        self.refused += 1
        return web.Response(status=status, text=text + "\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        if header[:7].lower() != "bearer ":
            return self._refuse(
                401,
                "send the cluster's metrics token: 'Authorization: Bearer <token>' (the "
                "control plane's data dir holds it in metrics.token)",
            )
        if self.token is None:
            return self._refuse(
                503, "this agent has not been given the cluster's metrics token yet"
            )
        if not pki.same(header[7:].strip(), self.token):
            return self._refuse(403, "wrong token: send the cluster's metrics token")
        text = self.metrics.text()
        targets = self.engines()
        if targets:
            if self._http is None:
                self._http = aiohttp.ClientSession()
            engines = await scrape(self._http, targets)
            text += "".join(line + "\n" for line in engines)
        body = text.encode()
        return web.Response(body=body, headers={"Content-Type": MEDIA})
