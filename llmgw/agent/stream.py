"""The agent's end of the stream as a protocol object: no sockets, no asyncio, no clock.

``AgentStream`` is fed what the socket read (``receive``), what the clock says
(``tick``), and what the agent has to say (``send``, ``heartbeat``); it answers with
events for the session to act on and with ``data_to_send`` for the socket. Its rules:

- The stream opens with our HEADERS and Register, before anything else.
- Registered: accepted; the control plane's heartbeat interval and its list of control
  planes come with it (``Accepted``). Goodbye: the stream ends with the reason given.
  Any other known message is for the node's hooks (``Deliver``); unknown types are
  ignored (a newer control plane may say more).
- A PING goes out with every heartbeat, and on its own when none went for
  ``ping_interval``; one unanswered for ``ping_timeout`` ends the stream: the control
  plane is stopped or unreachable, and waiting for TCP to say so takes minutes.
- The stream ends (``Ended``, and ``ended`` says why) on a refused POST, the control
  plane ending the stream or the connection, a frame or message that does not decode,
  a broken HTTP/2 peer, or an outbox of messages that must arrive grown past its bound
  (the control plane stopped reading; the next stream's Register rebuilds the state).
- What waits to be sent is a bounded, coalescing Outbox (``llmgw.wire.outbox``).
- To a control plane that takes them (``Registered.features``), a heartbeat carries the
  cards' moving figures alone (``gpu_figures``) while every card's steady facts are as
  this stream last sent them; the cards go whole on the stream's first heartbeat and
  after any change (a card added, gone, or its driver, limits or MIG layout changed).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, Unpack

from h2.events import (
    ConnectionTerminated,
    DataReceived,
    PingAckReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
)
from h2.exceptions import ProtocolError

from llmgw.wire.channel import FrameChannel, header_map
from llmgw.wire.codec import MessageError
from llmgw.wire.framing import FrameError
from llmgw.wire.hardware import (
    CARD_FIGURES,
    GPU,
    Disk,
    GpuFigures,
    GpuHealth,
    IbPort,
    NodeVitals,
    gpu_figures,
    steady_facts,
)
from llmgw.wire.messages import (
    Goodbye,
    Heartbeat,
    Message,
    Register,
    Registered,
    ShardUsage,
    decode_message,
)
from llmgw.wire.outbox import Outbox, OutboxFull


class HeartbeatFigures(TypedDict, total=False):
    """``Heartbeat``'s fields but its sequence number (a test keeps the two alike)."""

    memory_available: int | None
    cpu_percent: float | None
    load: list[float] | None
    disks: list[Disk] | None
    gpus: list[GPU] | None
    shards: list[ShardUsage] | None
    memory_read_gbs: float | None
    memory_read_one_core_gbs: float | None
    gpu_health: list[GpuHealth] | None
    vitals: NodeVitals | None
    health_warnings: list[str] | None
    settings: dict[str, object] | None
    ib_ports: list[IbPort] | None
    ages: dict[str, float] | None
    unread: list[str] | None
    gpu_figures: list[GpuFigures] | None


@dataclass(frozen=True)
class Accepted:
    """The control plane answered our Register."""

    registered: Registered


@dataclass(frozen=True)
class Deliver:
    """A message from the control plane for the node's hooks."""

    message: Message


@dataclass(frozen=True)
class Ended:
    """The stream is over; ``reason`` says why, in words for the agent's log."""

    reason: str


StreamEvent = Accepted | Deliver | Ended


class AgentStream:
    def __init__(
        self,
        *,
        ping_interval: float = 2.5,
        ping_timeout: float = 5.0,
        outbox: Outbox | None = None,
        entropy: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.outbox = outbox if outbox is not None else Outbox()
        self.channel = FrameChannel(client_side=True, outbox=self.outbox)
        self._entropy = entropy
        self.registered: Registered | None = None
        self.ended: str | None = None
        # Where a standby control plane said the leader takes agents (HOST:PORT).
        self.redirect: str | None = None
        self.seq = 0
        self.ping_outstanding: float | None = None  # when the unanswered PING went out
        self.ping_last_sent = float("-inf")
        # The steady facts of the cards this stream last sent whole or as figures.
        self.steady_sent: list[tuple[object, ...]] | None = None

    # --- what the agent does ----------------------------------------------------------

    def connect(self, authority: str, register: Register) -> None:
        """Open the stream: preface, settings, the POST's headers, then Register."""
        self.channel.start()
        self.channel.open_stream(authority)
        self.outbox.put(register)

    def send(self, msg: Message) -> None:
        """Queue a message for the control plane; a full outbox ends the stream."""
        if self.ended is not None:
            return
        try:
            self.outbox.put(msg)
        except OutboxFull as exc:
            self._end(f"the control plane is not reading the stream: {exc}")

    def heartbeat(self, now: float, **fields: Unpack[HeartbeatFigures]) -> Heartbeat:
        """Queue the next heartbeat with these figures, a PING riding in the same write:
        one wake-up of the control plane for both, instead of one each."""
        self.seq += 1
        gpus = fields.get("gpus")
        if gpus is not None and self._figures_will_do(gpus):
            fields["gpus"] = None
            fields["gpu_figures"] = [gpu_figures(card) for card in gpus]
        beat = Heartbeat(seq=self.seq, **fields)
        self._ping(now)
        self.send(beat)
        return beat

    def _figures_will_do(self, gpus: list[GPU]) -> bool:
        """Whether the control plane takes the cards' moving figures alone and has
        every card's steady facts as they are now (from this stream's last cards)."""
        registered = self.registered
        if registered is None or CARD_FIGURES not in registered.features:
            return False
        steady = [steady_facts(card) for card in gpus]
        same = steady == self.steady_sent
        self.steady_sent = steady
        return same

    def tick(self, now: float) -> list[StreamEvent]:
        """Time passed: end on a PING unanswered too long; PING if none went lately."""
        if self.ended is not None:
            return []
        if self.ping_outstanding is not None and now - self.ping_outstanding > self.ping_timeout:
            return [
                self._end(
                    f"no answer to HTTP/2 PING in {self.ping_timeout:g} s; "
                    "the control plane is stopped or unreachable"
                )
            ]
        if now - self.ping_last_sent >= self.ping_interval:
            self._ping(now)
        return []

    # --- what the control plane did ---------------------------------------------------

    def receive(self, data: bytes) -> list[StreamEvent]:
        """Bytes read from the connection: what they mean, in order."""
        if self.ended is not None:
            return []
        out: list[StreamEvent] = []
        try:
            for event in self.channel.receive(data):
                self._event(event, out)
                if self.ended is not None:
                    break
        except (FrameError, MessageError, ProtocolError) as exc:
            out.append(self._end(f"{type(exc).__name__}: {exc}"))
        return out

    def connection_lost(self) -> list[StreamEvent]:
        """The connection closed under us (the socket read nothing)."""
        if self.ended is not None:
            return []
        return [self._end("the control plane closed the connection")]

    def _event(self, event: object, out: list[StreamEvent]) -> None:
        sid = self.channel.stream_id
        if isinstance(event, PingAckReceived):
            self.ping_outstanding = None
        elif isinstance(event, ResponseReceived) and event.stream_id == sid:
            headers = header_map(event.headers)
            status = headers.get(":status")
            if status == "307" and headers.get("location"):
                # A standby control plane: the leader takes agents' streams.
                self.redirect = headers["location"]
                out.append(self._end(f"a standby; the leader is at {self.redirect}"))
            elif status != "200":
                out.append(self._end(f"the stream was refused (HTTP {status})"))
        elif isinstance(event, DataReceived) and event.stream_id == sid:
            for payload in self.channel.frames(event.data):
                msg = decode_message(payload)
                if isinstance(msg, Registered):
                    self.registered = msg
                    out.append(Accepted(msg))
                elif isinstance(msg, Goodbye):
                    out.append(self._end(f"the control plane said: {msg.reason}"))
                    return
                elif msg is not None:
                    out.append(Deliver(msg))
        elif isinstance(event, StreamEnded | StreamReset) and event.stream_id == sid:
            out.append(self._end("the control plane ended the stream"))
        elif isinstance(event, ConnectionTerminated):
            out.append(self._end("the control plane closed the connection"))

    # --- what goes out ----------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Bytes for the socket: h2's frames, then messages as the window allows."""
        try:
            return self.channel.data_to_send()
        except FrameError as exc:
            self._end(f"{type(exc).__name__}: {exc}")
            return self.channel.conn.data_to_send()

    def close(self) -> bytes:
        """The last bytes to write (GOAWAY) before closing the socket."""
        return self.channel.close()

    def _ping(self, now: float) -> None:
        if self.ping_outstanding is not None or self.ended is not None:
            return
        self.ping_outstanding = self.ping_last_sent = now
        self.channel.ping(self._entropy(8))

    def _end(self, reason: str) -> Ended:
        if self.ended is None:
            self.ended = reason
        return Ended(self.ended)
