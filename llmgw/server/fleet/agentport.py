"""The agents' port: TLS with client certificates, HTTP/2 only, one stream per node.

Each agent POSTs one request to /agent/v1/stream and keeps it open: its messages arrive
in the request body, ours go down the response body, both as length-prefixed msgpack
frames. The node's identity is its certificate's CN, checked against the newest
certificate the store holds for it. Every connection is its own task: a malformed frame
or a slow peer ends or stalls only that one.

We run our own loop over h2 here rather than an ASGI app under Hypercorn: Hypercorn does
not give the application the client certificate, and the node id lives there. The
stream's rules live in ``NodeStream`` (``llmgw.server.fleet.stream``, no IO); this is the
socket loop around it: it feeds it what it reads, hands what it returns to the registry
and to the ``ask()`` that waits, and writes what it has to send.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import logging
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from llmgw import pki
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.fleet.scratch import PAGE, ReadScratch
from llmgw.server.fleet.stream import (
    Answered,
    Ended,
    NodeStream,
    Registering,
    Reported,
    StreamClosed,
    StreamEvent,
    admit,
)
from llmgw.wire import Heartbeat, Registered
from llmgw.wire.hardware import CARD_FIGURES
from llmgw.wire.messages import Message, Request, Response
from llmgw.wire.outbox import OutboxFull

log = logging.getLogger("llmgw.agentport")

READ_SIZE = 65536
# What this control plane takes beyond what every one does (``Registered.features``):
# heartbeats with the cards' moving figures alone (``NodeStream`` makes whole cards).
FEATURES = (CARD_FIGURES,)


def shrink_tls_buffers(size: int = 16 * 1024) -> None:
    """asyncio's TLS layer gives every connection a 256 KiB read buffer up front
    (``SSLProtocol.max_size``, Python 3.11 to 3.13): 1.25 GB for 5,000 agents. A TLS
    record holds at most 16 KiB of plaintext, so reading 16 KiB at a time costs nothing;
    measured at 5,000 agents, 1.7 GB -> 463 MB with no change in CPU. Process-wide, read
    once per new connection."""
    proto = getattr(asyncio.sslproto, "SSLProtocol", None)
    if proto is not None and getattr(proto, "max_size", 0) > size:
        proto.max_size = size


def peer_identity(writer: asyncio.StreamWriter) -> tuple[str, int] | None:
    """(CN, serial) of the client certificate the TLS handshake verified."""
    ssl_obj = writer.get_extra_info("ssl_object")
    if ssl_obj is None:
        return None
    return pki.identity(ssl_obj.getpeercert())


class AgentConnection:
    """One agent's stream, from the control plane's side: the socket loop around a
    NodeStream, which holds the stream's rules (``llmgw.server.fleet.stream``)."""

    def __init__(
        self,
        port: AgentPort,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        node_id: str,
        peer: str,
    ) -> None:
        self.port = port
        self.reader = reader
        self.writer = writer
        self.scratch = ReadScratch.of(writer.transport)
        self.node_id = node_id
        self.peer = peer
        # The address the agent reached this control plane at (the engines' ports are
        # let through from it).
        sock = writer.get_extra_info("sockname")
        self.local: str | None = str(sock[0]) if isinstance(sock, tuple) and sock else None
        self.proto = NodeStream(node_id, redirect=port.redirect())
        self.closing: str | None = None
        # One per ask() waiting, set when its answers arrive or the stream ends.
        self._wakes: dict[str, asyncio.Event] = {}

    def start(self) -> None:
        self.proto.start()
        self._flush()

    def _flush(self) -> None:
        """Write what the protocol has to send. Never blocks: what the agent's window
        does not take waits in the protocol's bounded outbox."""
        data = self.proto.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def send(self, msg: Message) -> None:
        try:
            self.proto.send(msg)
        except OutboxFull as exc:
            self.close(f"the agent is not reading its stream: {exc}")
            raise StreamClosed(f"node {self.node_id} is not reading its stream: {exc}") from exc
        self._flush()

    async def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]:
        """Send a Request and yield its Responses until one says there is no more.

        The timeout runs from the last answer, so a followed log can go on for as long as
        its lines keep coming (and the caller keeps reading).
        """
        wake = asyncio.Event()
        try:
            request_id, answers = self.proto.ask(kind, args)
        except OutboxFull as exc:
            self.close(f"the agent is not reading its stream: {exc}")
            raise StreamClosed(f"node {self.node_id} is not reading its stream: {exc}") from exc
        self._wakes[request_id] = wake
        self._flush()
        try:
            while True:
                answer = answers.pop()
                if answer is None:
                    if answers.over:
                        raise ConnectionError(f"node {self.node_id} went away while answering")
                    wake.clear()
                    try:
                        await asyncio.wait_for(wake.wait(), timeout)
                    except TimeoutError as exc:
                        raise TimeoutError(
                            f"node {self.node_id} did not answer {kind!r} in {timeout:g} s"
                        ) from exc
                    continue
                yield answer
                if not answer.more:
                    return
        finally:
            self.proto.forget(request_id)
            self._wakes.pop(request_id, None)
            if self.proto.stream_id is not None and not self.proto.closed:
                with contextlib.suppress(Exception):
                    await self.send(
                        Request(id=secrets.token_hex(8), kind="cancel", args={"id": request_id})
                    )

    def close(self, reason: str) -> None:
        """End this stream (from any task) with a Goodbye saying why."""
        if self.closing is not None:
            return
        self.closing = reason
        log.info("closing stream of node %s: %s", self.node_id, reason)
        data = self.proto.close(reason)
        self._wake_all()
        if not self.writer.is_closing():
            with contextlib.suppress(Exception):
                self.writer.write(data)
            self.writer.close()

    def _wake_all(self) -> None:
        self.proto.connection_lost()
        for wake in self._wakes.values():
            wake.set()

    async def run(self) -> None:
        registry = self.port.registry
        try:
            while not self.proto.closed:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    break
                start = time.perf_counter()  # heartbeat handling: decoding included
                events = self.proto.receive(data)
                done = self._handle(events, 0, start)
                while done < len(events):
                    await self._register(cast(Registering, events[done]))
                    done = self._handle(events, done + 1, start)
                # The decoded messages go now, not with the next read seconds later.
                del events
                self._flush()
                if len(data) > PAGE and self.scratch is not None:
                    self.scratch.release()
        except (ConnectionError, ssl.SSLError, TimeoutError) as exc:
            log.info("node %s (%s) connection lost: %s", self.node_id, self.peer, exc)
        finally:
            self._wake_all()
            registry.disconnected(self.node_id, self)
            if not self.proto.closed:
                with contextlib.suppress(Exception):
                    self.writer.write(self.proto.channel.close())
            self.writer.close()

    def _handle(self, events: list[StreamEvent], first: int, start: float) -> int:
        """Handle ``events`` from ``first`` up to a Register (awaited by the caller,
        before what follows it); returns its position, or the length when none.
        ``start``: when the read that brought them began to be decoded."""
        registry = self.port.registry
        for i in range(first, len(events)):
            event = events[i]
            if isinstance(event, Reported):
                msg = event.message
                if isinstance(msg, Heartbeat):
                    registry.heartbeat(self.node_id, msg)
                    registry.handle_times.append(time.perf_counter() - start)
                else:
                    registry.report(self.node_id, msg)
            elif isinstance(event, Answered):
                wake = self._wakes.get(event.request_id)
                if wake is not None:
                    wake.set()
            elif isinstance(event, Registering):
                return i
            elif isinstance(event, Ended):
                if event.fault is not None:
                    log.warning("node %s (%s) %s", self.node_id, self.peer, event.fault)
                self.close(event.reason)
        return len(events)

    async def _register(self, event: Registering) -> None:
        msg = event.message
        registry = self.port.registry
        await registry.register(msg, self)
        log.info("node %s registered from %s (agent %s)", self.node_id, self.peer, msg.version)
        await self.send(
            Registered(
                node_id=self.node_id,
                heartbeat_interval=registry.interval,
                control_planes=self.port.control_planes(),
                features=list(FEATURES),
            )
        )
        for decided in self.port.pushed_for(self.node_id, self.local):
            await self.send(decided)


class AgentPort:
    def __init__(
        self,
        registry: NodeRegistry,
        tls: ssl.SSLContext,
        host: str,
        port: int,
        control_planes: Callable[[], list[str]],
        redirect: Callable[[], str | None],
        pushed_for: Callable[[str, str | None], list[Message]],
    ) -> None:
        """``control_planes``: every control plane's agents' port, the leader's first
        (sent in Registered); ``redirect``: on a standby, the leader's agents' port,
        where each agent is sent (None while this one leads); ``pushed_for``: what the
        cluster decides for a node (its settings, engines, firewall), sent after
        Registered and whenever any of it changes (``push_settings``)."""
        self.registry = registry
        self.tls = tls
        self.host = host
        self.port = port
        self.control_planes = control_planes
        self.redirect = redirect
        self.server: asyncio.Server | None = None
        self.connections: set[AgentConnection] = set()
        self.refused = 0
        self.pushed_for = pushed_for

    async def start(self) -> None:
        shrink_tls_buffers()
        self.server = await asyncio.start_server(
            self._accept,
            self.host,
            self.port,
            ssl=self.tls,
            ssl_handshake_timeout=10,
            backlog=4096,
            limit=READ_SIZE * 4,
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(writer.get_extra_info("peername"))
        ssl_obj = writer.get_extra_info("ssl_object")
        alpn = ssl_obj.selected_alpn_protocol() if ssl_obj is not None else None
        identity = peer_identity(writer) if alpn == "h2" else None
        current = identity is not None and self.registry.certificate_ok(*identity)
        refusal = admit(alpn, identity, current)
        if refusal is not None or identity is None:
            log.warning("refused %s: %s", peer, refusal)
            self.refused += 1
            writer.close()
            return
        conn = AgentConnection(self, reader, writer, identity[0], peer)
        conn.start()
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    def drop_all(self, reason: str) -> None:
        """End every agent's stream (this control plane stopped leading): each comes
        back, and is sent on to the leader."""
        for conn in list(self.connections):
            conn.close(reason)

    async def announce(self) -> None:
        """Tell every registered agent the control planes as they are now (one joined or
        was removed): each knows where to go when this one is gone."""
        planes = self.control_planes()
        for conn in list(self.connections):
            if conn.proto.registered and conn.closing is None:
                with contextlib.suppress(StreamClosed, ConnectionError):
                    await conn.send(
                        Registered(
                            node_id=conn.node_id,
                            heartbeat_interval=self.registry.interval,
                            control_planes=planes,
                            features=list(FEATURES),
                        )
                    )

    async def push_settings(self) -> None:
        """Every registered agent hears what the cluster decides for it, as it is now."""
        for conn in list(self.connections):
            if conn.proto.registered and conn.closing is None:
                with contextlib.suppress(StreamClosed, ConnectionError):
                    for msg in self.pushed_for(conn.node_id, conn.local):
                        await conn.send(msg)

    async def stop(self, reason: str = "the control plane is shutting down") -> None:
        """Say goodbye to every agent, then stop listening."""
        for conn in list(self.connections):
            conn.close(reason)
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), timeout=2)
