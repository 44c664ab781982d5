"""The agents' port: TLS with client certificates, HTTP/2 only, one stream per node.

Each agent POSTs one request to /agent/v1/stream and keeps it open: its messages arrive
in the request body, ours go down the response body, both as length-prefixed msgpack
frames. The node's identity is its certificate's CN, checked against the newest
certificate the store holds for it. Every connection is its own task: a malformed frame
or a slow peer ends or stalls only that one.

We run our own loop over h2 here rather than an ASGI app under Hypercorn: Hypercorn does
not give the application the client certificate, and the node id lives there.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import logging
import secrets
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
)
from h2.exceptions import ProtocolError

from llmgw.h2link import CONTENT_TYPE, STREAM_PATH, H2Link, header_map
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.wire import FrameDecoder, FrameError, Heartbeat, Register, Registered
from llmgw.wire.messages import (
    DownloadProgress,
    EngineStatus,
    Goodbye,
    Message,
    MessageError,
    Request,
    Response,
    ShardStatus,
    decode_message,
    encode_message,
)

log = logging.getLogger("llmgw.agentport")

READ_SIZE = 65536


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
    cert = ssl_obj.getpeercert()
    if not cert:
        return None
    cn = ""
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                cn = value
    serial = cert.get("serialNumber")
    if not cn or not serial:
        return None
    return cn, int(serial, 16)


class AgentConnection:
    """One agent's stream, from the control plane's side."""

    def __init__(self, port: AgentPort, link: H2Link, node_id: str, peer: str) -> None:
        self.port = port
        self.link = link
        self.node_id = node_id
        self.peer = peer
        self.stream_id: int | None = None
        self.decoder = FrameDecoder()
        self.registered = False
        self.closing: str | None = None
        self.pending: dict[str, asyncio.Queue[Response | None]] = {}

    async def send(self, msg: Message) -> None:
        if self.stream_id is None:
            raise ConnectionError(f"node {self.node_id} has no open stream")
        await self.link.send(self.stream_id, encode_message(msg))

    async def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]:
        """Send a Request and yield its Responses until one says there is no more.

        The timeout runs from the last answer, so a followed log can go on for as long as
        its lines keep coming (and the caller keeps reading).
        """
        request_id = secrets.token_hex(8)
        queue: asyncio.Queue[Response | None] = asyncio.Queue()
        self.pending[request_id] = queue
        try:
            await self.send(Request(id=request_id, kind=kind, args=args))
            while True:
                try:
                    answer = await asyncio.wait_for(queue.get(), timeout)
                except TimeoutError as exc:
                    raise TimeoutError(
                        f"node {self.node_id} did not answer {kind!r} in {timeout:g} s"
                    ) from exc
                if answer is None:
                    raise ConnectionError(f"node {self.node_id} went away while answering")
                yield answer
                if not answer.more:
                    return
        finally:
            self.pending.pop(request_id, None)
            if self.stream_id is not None and not self.link.closed:
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
        if self.stream_id is not None and not self.link.closed:
            with contextlib.suppress(Exception):
                self.link.conn.send_data(
                    self.stream_id, encode_message(Goodbye(reason=reason)), end_stream=True
                )
                self.link.flush()
        self.link.close()

    async def run(self) -> None:
        reader = self.link.reader
        try:
            while not self.link.closed:
                data = await reader.read(READ_SIZE)
                if not data:
                    break
                for event in self.link.receive(data):
                    if isinstance(event, RequestReceived):
                        await self._request(event)
                    elif isinstance(event, DataReceived) and event.stream_id == self.stream_id:
                        await self._data(event.data)
                    elif isinstance(event, StreamEnded | StreamReset):
                        if event.stream_id == self.stream_id:
                            self.close("the agent ended its stream")
                    elif isinstance(event, ConnectionTerminated):
                        self.close("the agent closed the connection")
        except (FrameError, MessageError) as exc:
            log.warning("node %s (%s) sent a bad frame: %s", self.node_id, self.peer, exc)
            self.close(f"bad frame: {exc}")
        except ProtocolError as exc:
            log.warning("node %s (%s) broke HTTP/2: %s", self.node_id, self.peer, exc)
            self.close(f"HTTP/2 protocol error: {exc}")
        except (ConnectionError, ssl.SSLError, TimeoutError) as exc:
            log.info("node %s (%s) connection lost: %s", self.node_id, self.peer, exc)
        finally:
            for queue in self.pending.values():
                queue.put_nowait(None)
            self.port.registry.disconnected(self.node_id, self)
            self.link.close()

    async def _request(self, event: RequestReceived) -> None:
        headers = header_map(event.headers)
        sid = event.stream_id
        if headers.get(":method") != "POST" or headers.get(":path") != STREAM_PATH:
            self.link.send_headers(sid, [(":status", "404")], end=True)
            return
        if self.stream_id is not None:
            self.link.send_headers(sid, [(":status", "409")], end=True)
            return
        self.stream_id = sid
        self.link.send_headers(sid, [(":status", "200"), ("content-type", CONTENT_TYPE)])

    async def _data(self, data: bytes) -> None:
        for payload in self.decoder.feed(data):
            start = time.perf_counter()
            msg = decode_message(payload)
            if isinstance(msg, Heartbeat):
                if not self.registered:
                    raise MessageError("heartbeat before register")
                self.port.registry.heartbeat(self.node_id, msg)
                self.port.registry.handle_times.append(time.perf_counter() - start)
            elif isinstance(msg, Register):
                await self._register(msg)
            elif not self.registered:
                raise MessageError(f"{type(msg).__name__} before register")
            elif isinstance(msg, Response):
                queue = self.pending.get(msg.id)
                if queue is not None:
                    queue.put_nowait(msg)
            elif isinstance(msg, ShardStatus | DownloadProgress | EngineStatus):
                self.port.registry.report(self.node_id, msg)
            # Unknown and unhandled types are ignored: a newer agent may send more.

    async def _register(self, msg: Register) -> None:
        if msg.node_id != self.node_id:
            raise MessageError(
                f"Register names node {msg.node_id!r} but the certificate is for {self.node_id!r}"
            )
        await self.port.registry.register(msg, self)
        self.registered = True
        log.info("node %s registered from %s (agent %s)", self.node_id, self.peer, msg.version)
        await self.send(
            Registered(
                node_id=self.node_id,
                heartbeat_interval=self.port.registry.interval,
                control_planes=self.port.control_planes,
            )
        )


class AgentPort:
    def __init__(
        self,
        registry: NodeRegistry,
        tls: ssl.SSLContext,
        host: str,
        port: int,
        control_planes: list[str],
    ) -> None:
        self.registry = registry
        self.tls = tls
        self.host = host
        self.port = port
        self.control_planes = control_planes
        self.server: asyncio.Server | None = None
        self.connections: set[AgentConnection] = set()
        self.refused = 0

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
        if ssl_obj is None or ssl_obj.selected_alpn_protocol() != "h2":
            log.warning("refused %s: the agents' port speaks HTTP/2 only", peer)
            self.refused += 1
            writer.close()
            return
        identity = peer_identity(writer)
        if identity is None or not self.registry.certificate_ok(*identity):
            log.warning(
                "refused %s: certificate %s is not the current one of an enrolled node",
                peer,
                identity,
            )
            self.refused += 1
            writer.close()
            return
        link = H2Link(reader, writer, client_side=False)
        link.start()
        conn = AgentConnection(self, link, identity[0], peer)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    async def stop(self, reason: str = "the control plane is shutting down") -> None:
        """Say goodbye to every agent, then stop listening."""
        for conn in list(self.connections):
            conn.close(reason)
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), timeout=2)
