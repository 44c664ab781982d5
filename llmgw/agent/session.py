"""The agent's end of the stream: connect, register, heartbeat, and notice a dead peer.

One POST over HTTP/2 with mutual TLS stays open for the life of the connection. The agent
PINGs every couple of seconds; a PING unanswered in a few seconds means the control plane
is gone (stopped, partitioned, or wedged), and the session ends so the caller can move on
to the next control plane in seconds rather than after TCP's fifteen minutes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from h2.events import (
    ConnectionTerminated,
    DataReceived,
    PingAckReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
)

from llmgw import __version__
from llmgw.config import parse_hostport
from llmgw.h2link import CONTENT_TYPE, STREAM_PATH, H2Link, header_map
from llmgw.wire import FrameDecoder, Heartbeat, HostFacts, Register, Registered
from llmgw.wire.messages import GPU, Disk, Goodbye, Message, decode_message, encode_message

log = logging.getLogger("llmgw.agent.session")

# What this agent can answer; the control plane asks for nothing not listed.
FEATURES = ["heartbeat.v1"]


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


class FactSource(Protocol):
    async def facts(self, hostname: str) -> HostFacts: ...

    async def live(self) -> LiveFigures: ...


class NodeHooks(Protocol):
    """What the rest of the agent adds to the stream: shards, engines, requests."""

    def register_fields(self) -> dict[str, Any]:
        """Extra Register fields (engines, shards to adopt)."""

    def heartbeat_fields(self) -> dict[str, Any]:
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
        self._handling: set[asyncio.Task[None]] = set()

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
        link = H2Link(reader, writer, client_side=True)
        self.registered_at = None
        try:
            await self._stream(link, address)
        finally:
            link.close()

    async def _stream(self, link: H2Link, address: str) -> None:
        link.start()
        sid = link.conn.get_next_available_stream_id()
        link.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "https"),
                (":authority", address),
                (":path", STREAM_PATH),
                ("content-type", CONTENT_TYPE),
            ],
        )
        facts = await self.source.facts(self.node_id)
        extra = self.hooks.register_fields() if self.hooks else {}
        register = Register(
            node_id=self.node_id,
            version=__version__,
            host=facts,
            address=self.address,
            features=self.settings.features,
            **extra,
        )
        await link.send(sid, encode_message(register))
        registered = asyncio.Event()
        pings = _Pings()
        outbox: asyncio.Queue[Message] = asyncio.Queue()
        tasks = [
            asyncio.create_task(self._read(link, sid, address, registered, pings)),
            asyncio.create_task(self._heartbeats(link, sid, registered, pings)),
            asyncio.create_task(self._pings(link, address, pings)),
        ]
        if self.hooks is not None:
            tasks.append(asyncio.create_task(self._send_outbox(link, sid, registered, outbox)))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if isinstance(exc, SessionEnded):
                    exc.registered = self.registered_at is not None
                    raise exc
                if exc is not None:
                    raise SessionEnded(
                        f"{address}: {type(exc).__name__}: {exc}", self.registered_at is not None
                    ) from exc
            raise SessionEnded(f"{address}: the stream ended", self.registered_at is not None)
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
        link: H2Link,
        sid: int,
        address: str,
        registered: asyncio.Event,
        pings: _Pings,
    ) -> None:
        decoder = FrameDecoder()
        while True:
            data = await link.reader.read(65536)
            if not data:
                raise SessionEnded(f"{address}: the control plane closed the connection")
            for event in link.receive(data):
                if isinstance(event, PingAckReceived):
                    pings.outstanding = None
                elif isinstance(event, ResponseReceived) and event.stream_id == sid:
                    status = header_map(event.headers).get(":status")
                    if status != "200":
                        raise SessionEnded(f"{address}: the stream was refused (HTTP {status})")
                elif isinstance(event, DataReceived) and event.stream_id == sid:
                    for payload in decoder.feed(event.data):
                        msg = decode_message(payload)
                        if isinstance(msg, Registered):
                            self.control_planes = msg.control_planes
                            self.settings.heartbeat_interval = msg.heartbeat_interval
                            self.registered_at = time.monotonic()
                            registered.set()
                            log.info("registered with %s as %s", address, self.node_id)
                        elif isinstance(msg, Goodbye):
                            raise SessionEnded(f"{address}: the control plane said: {msg.reason}")
                        elif msg is not None and self.hooks is not None:
                            # Handled beside the reader: a slow handler must not stall
                            # the stream (pings, heartbeats, other requests).
                            task = asyncio.create_task(self.hooks.handle(msg))
                            self._handling.add(task)
                            task.add_done_callback(self._handling.discard)
                elif isinstance(event, StreamEnded | StreamReset) and event.stream_id == sid:
                    raise SessionEnded(f"{address}: the control plane ended the stream")
                elif isinstance(event, ConnectionTerminated):
                    raise SessionEnded(f"{address}: the control plane closed the connection")

    async def _heartbeats(
        self, link: H2Link, sid: int, registered: asyncio.Event, pings: _Pings
    ) -> None:
        await registered.wait()
        seq = 0
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval)
            seq += 1
            live = await self.source.live()
            beat = Heartbeat(
                seq=seq,
                memory_available=live.memory_available,
                cpu_percent=live.cpu_percent,
                load=live.load,
                disks=live.disks,
                gpus=live.gpus,
                **(self.hooks.heartbeat_fields() if self.hooks else {}),
            )
            # The PING rides in the same write as the heartbeat: one wake-up of the
            # control plane for both, instead of one each.
            pings.send(link, flush=False)
            async with asyncio.timeout(self.settings.ping_timeout):
                await link.send(sid, encode_message(beat))

    async def _send_outbox(
        self, link: H2Link, sid: int, registered: asyncio.Event, outbox: asyncio.Queue[Message]
    ) -> None:
        await registered.wait()
        assert self.hooks is not None
        self.hooks.attach(outbox.put_nowait)
        while True:
            msg = await outbox.get()
            await link.send(sid, encode_message(msg))

    async def _pings(self, link: H2Link, address: str, pings: _Pings) -> None:
        """PING when nothing else did for a while; end the session on one unanswered."""
        s = self.settings
        while True:
            now = time.monotonic()
            if pings.outstanding is not None and now - pings.outstanding > s.ping_timeout:
                raise SessionEnded(
                    f"{address}: no answer to HTTP/2 PING in {s.ping_timeout:g} s; "
                    "the control plane is stopped or unreachable"
                )
            if pings.outstanding is None and now - pings.last_sent >= s.ping_interval:
                pings.send(link)
            await asyncio.sleep(min(0.25, s.ping_interval))


class _Pings:
    """The stream's PING state: at most one unanswered at a time."""

    def __init__(self) -> None:
        self.outstanding: float | None = None  # when the unanswered PING went out
        self.last_sent = 0.0

    def send(self, link: H2Link, flush: bool = True) -> None:
        if self.outstanding is not None:
            return
        self.outstanding = self.last_sent = time.monotonic()
        link.conn.ping(os.urandom(8))
        if flush:
            link.flush()
