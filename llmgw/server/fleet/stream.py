"""The control plane's end of one agent's stream as a protocol object: no sockets, no
asyncio.

``NodeStream`` is fed what the connection read (``receive``) and what the control plane
has to say (``send``, ``ask``, ``close``); it answers with events for the agents' port to
act on and with ``data_to_send`` for the socket. Its rules, in the order they apply:

- A connection is admitted (``admit``) only over HTTP/2 and with the newest certificate
  of an enrolled node; its CN is the node's id from then on.
- The one POST to /agent/v1/stream opens the stream; another path is 404, a second
  stream on the connection 409.
- Register must come first and name the certificate's node; one naming another node
  ends the stream, and so does a Heartbeat or anything else before it (``Registering``
  hands an accepted Register over, ``Report`` every Heartbeat, ShardStatus,
  DownloadProgress and EngineStatus after it). Unknown types are ignored: a newer agent
  may say more.
- A Heartbeat with the cards' moving figures alone (``gpu_figures``, sent to a control
  plane that says it takes them) is made whole over the stream's last cards before it
  is reported; figures for another number of cards than those end the stream.
- A Response goes to the ``ask()`` that waits for its id (``Answered``); one for an id
  nobody waits for (a request given up, or never made) is dropped.
- A frame or message that does not decode, or a peer that breaks HTTP/2, ends the
  stream (``Ended`` with a ``fault`` for the log); so do the agent ending its stream or
  closing the connection.
- What waits to go out, and each ask's answers, are bounded, coalescing Outboxes
  (``llmgw.wire.outbox``): an agent that stops reading, or an API client that stops
  reading a followed log, costs a fixed amount of memory.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
)
from h2.exceptions import ProtocolError

from llmgw.wire.channel import STREAM_PATH, FrameChannel, header_map
from llmgw.wire.codec import MessageError, merged
from llmgw.wire.framing import FrameError
from llmgw.wire.hardware import GPU, with_figures
from llmgw.wire.messages import (
    AdapterAsk,
    DownloadProgress,
    EngineStatus,
    FinetuneStatus,
    Goodbye,
    Heartbeat,
    KvBlocks,
    Message,
    Register,
    Request,
    Response,
    ShardStatus,
    SlurmStatus,
    decode_message,
    encode_message,
)
from llmgw.wire.outbox import Outbox, OutboxFull

# An ask's answers: a final one (or a few, from a confused agent) and one merged batch
# of followed log lines; more than this waiting is an agent answering out of turn.
ANSWERS = 16

Report = (
    Heartbeat
    | ShardStatus
    | DownloadProgress
    | EngineStatus
    | KvBlocks
    | SlurmStatus
    | FinetuneStatus
    | AdapterAsk
)


@dataclass(frozen=True)
class Registering:
    """A Register naming this connection's node: hand it to the registry, then send
    Registered."""

    message: Register


@dataclass(frozen=True)
class Reported:
    """A heartbeat or a report of shards, downloads or engines from the registered node."""

    message: Report


@dataclass(frozen=True)
class Answered:
    """An answer waits for the ask() of ``request_id``."""

    request_id: str


@dataclass(frozen=True)
class Ended:
    """The stream must end with a Goodbye saying ``reason``; ``fault``, when the agent
    broke the rules, is what the log says of it."""

    reason: str
    fault: str | None = None


StreamEvent = Registering | Reported | Answered | Ended


class StreamClosed(ConnectionError):
    """There is no open stream to send on."""


def admit(alpn: str | None, identity: tuple[str, int] | None, current: bool) -> str | None:
    """Why a new connection is refused, or None to let it in. ``identity`` is the
    client certificate's (CN, serial); ``current`` whether the store holds that serial
    as the node's newest certificate (re-enrolling retires the old one)."""
    if alpn != "h2":
        return "the agents' port speaks HTTP/2 only"
    if identity is None or not current:
        return f"certificate {identity} is not the current one of an enrolled node"
    return None


class Answers:
    """What one ask() has been answered and not yet read."""

    def __init__(self, limit: int = ANSWERS) -> None:
        self.queue = Outbox(limit=limit)
        self.over = False  # the stream ended: no more will come
        self.lost = 0  # answers dropped for a full queue (an agent answering out of turn)

    def put(self, answer: Response) -> bool:
        try:
            self.queue.put(answer)
        except OutboxFull:
            self.lost += 1
            return False
        return True

    def pop(self) -> Response | None:
        answer = self.queue.pop()
        assert answer is None or isinstance(answer, Response)
        return answer


class NodeStream:
    def __init__(
        self, node_id: str, outbox: Outbox | None = None, redirect: str | None = None
    ) -> None:
        self.node_id = node_id
        # A standby's word to the agent: the leader's agents' port, where it should be
        # ("" when it knows none); None while this control plane leads.
        self.redirect = redirect
        self.outbox = outbox if outbox is not None else Outbox()
        self.channel = FrameChannel(client_side=False, outbox=self.outbox)
        self.registered = False
        self.ended: str | None = None
        self.waiters: dict[str, Answers] = {}
        # The cards of this stream's last heartbeat that had them: what the next one's
        # moving figures alone (``Heartbeat.gpu_figures``) are laid over.
        self.cards: list[GPU] | None = None

    @property
    def stream_id(self) -> int | None:
        return self.channel.stream_id

    @property
    def closed(self) -> bool:
        return self.channel.closed

    def start(self) -> None:
        """The connection was admitted: our preface and settings."""
        self.channel.start()

    # --- what the agent did -----------------------------------------------------------

    def receive(self, data: bytes) -> list[StreamEvent]:
        """Bytes read from the connection: what they mean, in order."""
        if self.ended is not None or self.closed:
            return []
        out: list[StreamEvent] = []
        try:
            for event in self.channel.receive(data):
                self._event(event, out)
                if self.ended is not None:
                    break
        except (FrameError, MessageError) as exc:
            out.append(self._end(f"bad frame: {exc}", f"sent a bad frame: {exc}"))
        except ProtocolError as exc:
            out.append(self._end(f"HTTP/2 protocol error: {exc}", f"broke HTTP/2: {exc}"))
        return out

    def _event(self, event: object, out: list[StreamEvent]) -> None:
        if isinstance(event, RequestReceived):
            headers = header_map(event.headers)
            if headers.get(":method") != "POST" or headers.get(":path") != STREAM_PATH:
                self.channel.refuse_stream(event.stream_id, 404)
            elif self.redirect:
                self.channel.refuse_stream(event.stream_id, 307, [("location", self.redirect)])
                out.append(self._end(f"a standby: sent to the leader at {self.redirect}"))
            elif self.redirect is not None:
                # A standby that knows no leader now: the agent tries the others.
                self.channel.refuse_stream(event.stream_id, 503)
                out.append(self._end("a standby that knows no leader now"))
            elif self.channel.stream_id is not None:
                self.channel.refuse_stream(event.stream_id, 409)
            else:
                self.channel.accept_stream(event.stream_id)
        elif isinstance(event, DataReceived) and event.stream_id == self.channel.stream_id:
            for payload in self.channel.frames(event.data):
                self._message(payload, out)
        elif isinstance(event, StreamEnded | StreamReset):
            if event.stream_id == self.channel.stream_id:
                out.append(self._end("the agent ended its stream"))
        elif isinstance(event, ConnectionTerminated):
            out.append(self._end("the agent closed the connection"))

    def _message(self, payload: dict[str, Any], out: list[StreamEvent]) -> None:
        msg = decode_message(payload)
        if isinstance(msg, Register):
            if msg.node_id != self.node_id:
                raise MessageError(
                    f"Register names node {msg.node_id!r} but the certificate is for "
                    f"{self.node_id!r}"
                )
            self.registered = True
            out.append(Registering(msg))
        elif not self.registered:
            name = "heartbeat" if isinstance(msg, Heartbeat) else type(msg).__name__
            if msg is None:
                name = f"a message of type {str(payload.get('t'))[:40]!r}"
            raise MessageError(f"{name} before register")
        elif msg is None:
            pass  # a type this side does not know: a newer agent may send more
        elif isinstance(msg, Response):
            waiter = self.waiters.get(msg.id)
            if waiter is not None and waiter.put(msg):
                out.append(Answered(msg.id))
        elif isinstance(msg, Heartbeat):
            out.append(Reported(self._whole_cards(msg)))
        elif isinstance(msg, Report):
            out.append(Reported(msg))

    def _whole_cards(self, beat: Heartbeat) -> Heartbeat:
        """The heartbeat with whole cards: its ``gpu_figures`` over its own ``gpus``
        (two heartbeats the agent's outbox made one) or else this stream's last cards,
        which ``gpus`` then carries; the registry sees ``gpus`` either way."""
        figures = beat.gpu_figures
        if figures is not None:
            cards = beat.gpus if beat.gpus is not None else self.cards
            if cards is None or len(cards) != len(figures):
                had = "none" if cards is None else str(len(cards))
                raise MessageError(
                    f"heartbeat {beat.seq}: figures of {len(figures)} cards, but this "
                    f"stream's last cards were {had}: send gpus whole after a change"
                )
            whole = [with_figures(c, f) for c, f in zip(cards, figures, strict=True)]
            beat = merged(beat, {"gpus": whole, "gpu_figures": None})
        if beat.gpus is not None:
            self.cards = beat.gpus
        return beat

    # --- what the control plane does --------------------------------------------------

    def send(self, msg: Message) -> None:
        """Queue a message for the agent. Raises StreamClosed when there is no stream,
        and OutboxFull when the agent has stopped reading (then close the stream)."""
        if self.channel.stream_id is None:
            raise StreamClosed(f"node {self.node_id} has no open stream")
        if self.closed or self.ended is not None:
            raise StreamClosed("the connection is closed")
        encode_message(msg)  # FrameError here, to the sender, not later on the wire
        self.outbox.put(msg)

    def ask(self, kind: str, args: dict[str, Any]) -> tuple[str, Answers]:
        """Send a Request; its answers gather in the returned Answers."""
        request_id = secrets.token_hex(8)
        answers = self.waiters[request_id] = Answers()
        try:
            self.send(Request(id=request_id, kind=kind, args=args))
        except BaseException:
            del self.waiters[request_id]
            raise
        return request_id, answers

    def forget(self, request_id: str) -> None:
        """The asker is done: answers still coming for it are dropped."""
        self.waiters.pop(request_id, None)

    def close(self, reason: str) -> bytes:
        """The last bytes to write: a Goodbye saying why, ending the stream, then
        GOAWAY. Every asker is told no more answers come."""
        self._end(reason)
        self.connection_lost()
        return self.channel.close(Goodbye(reason=reason))

    def connection_lost(self) -> list[str]:
        """No more answers will come; the ids of the asks still waiting."""
        for waiter in self.waiters.values():
            waiter.over = True
        return list(self.waiters)

    def data_to_send(self) -> bytes:
        """Bytes for the socket: h2's frames, then messages as the window allows."""
        try:
            return self.channel.data_to_send()
        except FrameError:
            # Only a message of ours past MAX_FRAME; it is dropped, not the stream.
            return self.data_to_send()

    def _end(self, reason: str, fault: str | None = None) -> Ended:
        if self.ended is None:
            self.ended = reason
        return Ended(reason, fault)
