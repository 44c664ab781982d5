"""The agent's end of the stream: connect, register, heartbeat, and notice a dead peer.

One POST over HTTP/2 with mutual TLS stays open for the life of the connection. The agent
PINGs every couple of seconds; a PING unanswered in a few seconds means the control plane
is gone (stopped, partitioned, or wedged), and the session ends so the caller can move on
to the next control plane in seconds rather than after TCP's fifteen minutes.

The stream's rules live in ``AgentStream`` (``llmgw.agent.stream``, no IO); this is the
socket loop around it: read and feed it, keep its clock, gather heartbeat figures, and
write what it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from llmgw import __version__
from llmgw.agent.stream import Accepted, AgentStream, Deliver
from llmgw.config import parse_hostport
from llmgw.wire import HostFacts, Register
from llmgw.wire.hardware import GPU, Disk, GpuHealth, IbPort, NodeVitals
from llmgw.wire.messages import EngineInfo, Message, ShardStatus, ShardUsage

log = logging.getLogger("llmgw.agent.session")

# What this agent can answer; the control plane asks for nothing not listed.
FEATURES = ["heartbeat.v1", "restart.v1", "upgrade.v1"]


class SessionEnded(ConnectionError):
    """The stream ended; ``registered`` tells whether it ever got as far as Registered."""

    def __init__(self, reason: str, registered: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.registered = registered


class LiveFigures(Protocol):
    @property
    def memory_available(self) -> int | None: ...
    @property
    def cpu_percent(self) -> float | None: ...
    @property
    def load(self) -> list[float] | None: ...
    @property
    def disks(self) -> list[Disk] | None: ...
    @property
    def gpus(self) -> list[GPU] | None: ...
    @property
    def gpu_health(self) -> list[GpuHealth] | None: ...
    @property
    def vitals(self) -> NodeVitals | None: ...
    @property
    def health_warnings(self) -> list[str] | None: ...
    @property
    def ib_ports(self) -> list[IbPort] | None: ...
    @property
    def ages(self) -> dict[str, float] | None: ...
    @property
    def unread(self) -> list[str] | None: ...


class FactSource(Protocol):
    async def facts(self, hostname: str) -> HostFacts: ...

    async def live(self) -> LiveFigures: ...

    # Returns when something is worth a heartbeat before its time (a tool failing).
    async def news(self) -> None: ...


class RegisterFields(TypedDict, total=False):
    """What the node's hooks add to Register."""

    engines: list[EngineInfo]
    engines_probed: bool
    installable_engines: list[str]
    settings: dict[str, object] | None
    shards: list[ShardStatus]


class HeartbeatFields(TypedDict, total=False):
    """What the node's hooks add to a Heartbeat (the session reads the rest)."""

    shards: list[ShardUsage]
    memory_read_gbs: float
    memory_read_one_core_gbs: float
    settings: dict[str, object] | None


class NodeHooks(Protocol):
    """What the rest of the agent adds to the stream: shards, engines, requests."""

    def register_fields(self) -> RegisterFields:
        """Extra Register fields (engines, shards to adopt)."""

    def heartbeat_fields(self) -> HeartbeatFields:
        """Extra Heartbeat fields (per-shard usage)."""

    def attach(self, send: Callable[[Message], None] | None) -> None:
        """Where to send messages while connected; None while not."""

    async def handle(self, msg: Message) -> None:
        """A message from the control plane other than Registered and Goodbye."""


@dataclass
class SessionSettings:
    heartbeat_interval: float = 5.0
    # A PING also goes with every heartbeat; this is the longest gap between PINGs.
    ping_interval: float = 2.5
    # Longer than the pauses a busy control plane has (thousands of agents reconnecting),
    # short enough that a stopped one is noticed within 10 s.
    ping_timeout: float = 5.0
    connect_timeout: float = 5.0
    features: list[str] = field(default_factory=lambda: list(FEATURES))


class AgentSession:
    def __init__(
        self,
        node_id: str,
        tls: ssl.SSLContext,
        source: FactSource,
        settings: SessionSettings | None = None,
        hooks: NodeHooks | None = None,
    ) -> None:
        self.node_id = node_id
        self.tls = tls
        self.source = source
        self.settings = settings or SessionSettings()
        self.hooks = hooks
        self.control_planes: list[str] = []
        self.registered_at: float | None = None
        self.address: str | None = None
        # Where the last control plane sent this agent (a standby naming its leader).
        self.redirect: str | None = None
        self._handling: set[asyncio.Task[None]] = set()
        # Told of what goes to the control plane (Register, heartbeats, the node's other
        # messages): the node's own metrics are written from it (agent/metricsport.py).
        self.sent: Callable[[Message], None] = lambda msg: None

    async def run(self, address: str) -> None:
        """Run one stream to ``address`` until it ends; always raises SessionEnded."""
        host, port = parse_hostport(address)
        s = self.settings
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
            # lands as its inner call finishes, and a cancelled session must end.
            async with asyncio.timeout(s.connect_timeout + 1):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    ssl=self.tls,
                    server_hostname=host,
                    ssl_handshake_timeout=s.connect_timeout,
                )
        except ssl.SSLCertVerificationError as exc:
            raise SessionEnded(
                f"{address}: the control plane's certificate is not trusted: {exc.verify_message}"
            ) from exc
        except (OSError, TimeoutError) as exc:
            raise SessionEnded(f"{address}: cannot connect: {exc or 'timed out'}") from exc
        ssl_obj = writer.get_extra_info("ssl_object")
        if ssl_obj is None or ssl_obj.selected_alpn_protocol() != "h2":
            writer.close()
            raise SessionEnded(f"{address}: the server did not agree to HTTP/2")
        self.address = writer.get_extra_info("sockname")[0]
        self.registered_at = None
        self.redirect = None
        pipe = _Pipe(
            AgentStream(ping_interval=s.ping_interval, ping_timeout=s.ping_timeout),
            writer,
            self.sent,
        )
        try:
            await self._stream(pipe, reader, address)
        finally:
            self.redirect = pipe.proto.redirect
            pipe.close()

    async def _stream(self, pipe: _Pipe, reader: asyncio.StreamReader, address: str) -> None:
        # The machine's own name (its node id may be another): Slurm's SlurmctldHost
        # must be it, and the pages show both.
        facts = await self.source.facts(socket.gethostname())
        extra = self.hooks.register_fields() if self.hooks else {}
        register = Register(
            node_id=self.node_id,
            version=__version__,
            host=facts,
            address=self.address,
            features=self.settings.features,
            **extra,
        )
        pipe.proto.connect(address, register)
        self.sent(register)
        pipe.flush()
        registered = asyncio.Event()
        tasks = [
            asyncio.create_task(self._read(pipe, reader, address, registered)),
            asyncio.create_task(self._heartbeats(pipe, registered)),
            asyncio.create_task(self._ticks(pipe)),
            asyncio.create_task(pipe.over.wait()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            registered_ever = self.registered_at is not None
            if pipe.proto.ended is not None:
                raise SessionEnded(f"{address}: {pipe.proto.ended}", registered_ever)
            for task in done:
                exc = task.exception()
                if exc is not None:
                    raise SessionEnded(
                        f"{address}: {type(exc).__name__}: {exc}", registered_ever
                    ) from exc
            raise SessionEnded(f"{address}: the stream ended", registered_ever)
        finally:
            if self.hooks:
                self.hooks.attach(None)
            for task in tasks:
                task.cancel()
            # Bounded: a task that ignores its cancel must not keep the session alive.
            await asyncio.wait(tasks, timeout=5)
            for task in tasks:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved, so asyncio does not log it as lost

    async def _read(
        self,
        pipe: _Pipe,
        reader: asyncio.StreamReader,
        address: str,
        registered: asyncio.Event,
    ) -> None:
        proto = pipe.proto
        while proto.ended is None:
            data = await reader.read(65536)
            events = proto.receive(data) if data else proto.connection_lost()
            for event in events:
                if isinstance(event, Accepted):
                    msg = event.registered
                    self.control_planes = msg.control_planes
                    self.settings.heartbeat_interval = msg.heartbeat_interval
                    self.registered_at = time.monotonic()
                    registered.set()
                    if self.hooks is not None:
                        self.hooks.attach(pipe.send)
                    log.info("registered with %s as %s", address, self.node_id)
                elif isinstance(event, Deliver) and self.hooks is not None:
                    # Handled beside the reader: a slow handler must not stall the
                    # stream (pings, heartbeats, other requests).
                    task = asyncio.create_task(self.hooks.handle(event.message))
                    self._handling.add(task)
                    task.add_done_callback(self._handling.discard)
            pipe.flush()

    async def _heartbeats(self, pipe: _Pipe, registered: asyncio.Event) -> None:
        await registered.wait()
        while True:
            # Every interval, and at once when a tool stops or starts answering: its
            # figures' absence and its warning do not wait for the next beat.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.heartbeat_interval):
                    await self.source.news()
            live = await self.source.live()
            beat = pipe.proto.heartbeat(
                time.monotonic(),
                memory_available=live.memory_available,
                cpu_percent=live.cpu_percent,
                load=live.load,
                disks=live.disks,
                gpus=live.gpus,
                gpu_health=live.gpu_health,
                vitals=live.vitals,
                health_warnings=live.health_warnings,
                ib_ports=live.ib_ports,
                ages=live.ages,
                unread=live.unread,
                **(self.hooks.heartbeat_fields() if self.hooks else {}),
            )
            self.sent(beat)
            pipe.flush()

    async def _ticks(self, pipe: _Pipe) -> None:
        """The protocol's clock: PINGs when nothing else went, and their deadline."""
        while True:
            pipe.proto.tick(time.monotonic())
            pipe.flush()
            await asyncio.sleep(min(0.25, self.settings.ping_interval))


class _Pipe:
    """An AgentStream and the socket it writes to. Writing never blocks: what the
    control plane's window does not take waits in the stream's bounded outbox, and a
    control plane that stops reading stops answering PINGs too."""

    def __init__(
        self,
        proto: AgentStream,
        writer: asyncio.StreamWriter,
        sent: Callable[[Message], None] = lambda msg: None,
    ) -> None:
        self.proto = proto
        self.writer = writer
        self.over = asyncio.Event()
        self.sent = sent

    def send(self, msg: Message) -> None:
        self.proto.send(msg)
        self.sent(msg)
        self.flush()

    def flush(self) -> None:
        data = self.proto.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)
        if self.proto.ended is not None:
            self.over.set()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if not self.writer.is_closing():
                self.writer.write(self.proto.close())
        self.writer.close()
