"""The HTTP/2 carriage of the agent stream, for either end, with no IO.

One connection carries one long POST to /agent/v1/stream: the agent's frames go up the
request body, the control plane's down the response body. This owns the h2 connection
of one end and what both ends need on top of it: acknowledging what arrives (flow
control), decoding frames, and sending from an Outbox no faster than the peer's window
allows, one whole frame after another (a frame the window cuts short is finished before
the next begins). Messages stay in the Outbox until the window takes them, so a peer
that stops reading leaves them there, bounded and coalescing, not in h2's buffers.

The side's protocol object (``llmgw.agent.stream``, ``llmgw.server.fleet.stream``)
wraps one of these and says what the stream's messages mean; its socket loop writes what
``data_to_send`` returns and feeds ``receive`` what it reads.
"""

from __future__ import annotations

from collections import deque
from typing import Any, cast

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, Event
from h2.exceptions import ProtocolError
from h2.settings import SettingCodes, Settings

from llmgw.wire.framing import FrameDecoder
from llmgw.wire.messages import Message, encode_message
from llmgw.wire.outbox import Outbox

STREAM_PATH = "/agent/v1/stream"
CONTENT_TYPE = "application/x-llmgw-frames"
# The stream's flow-control window, each way (and the connection's, raised by as much).
# Ample for heartbeats, reports and log batches (the receiver hands half of it back as
# soon as it has read that much), and the most a peer that stops reading leaves written
# in our socket's buffer: the rest waits in the Outbox, bounded and coalescing.
WINDOW = 1024 * 1024


class _Values(list[int | None]):
    """One setting's values: the one in force first, then any sent and not yet
    acknowledged; what h2 reads of the deque it would keep (``[0]``, ``append``,
    ``popleft``, ``len``)."""

    __slots__ = ()

    def popleft(self) -> int | None:
        return self.pop(0)


class _Entries(list[tuple[bytes, bytes]]):
    """An HPACK dynamic table's entries, newest first: what hpack reads of the deque it
    would keep (index, ``len``, iteration, ``appendleft``, ``pop``, ``clear``). A few
    headers open the one stream a connection carries; a list holds them in far less than
    a deque's 600 bytes, and each connection has two tables."""

    __slots__ = ()

    def appendleft(self, entry: tuple[bytes, bytes]) -> None:
        self.insert(0, entry)


class CompactSettings(Settings):
    """h2's settings, each kept in a list of its one or two values rather than a deque.

    A deque takes about 600 bytes however little it holds, and a connection has two
    sets of eight settings: 10 KB of every agent's stream, 50 MB on a control plane of
    5,000 agents (``docs/performance.md``)."""

    def __init__(
        self, client: bool = True, initial_values: dict[SettingCodes, int] | None = None
    ) -> None:
        super().__init__(client, initial_values)
        for key, values in self._settings.items():
            self._settings[key] = cast("deque[int]", _Values(values))

    def __setitem__(self, key: SettingCodes | int, value: int) -> None:
        super().__setitem__(key, value)  # a setting new to this side comes as a deque
        values = self._settings[key]
        if not isinstance(values, _Values):
            self._settings[key] = cast("deque[int]", _Values(values))


def h2_connection(client_side: bool) -> H2Connection:
    """An h2 connection whose first SETTINGS frame carries our window.

    h2's preface sends only acknowledged settings: values staged with
    ``local_settings.update()`` before ``initiate_connection()`` never reach the peer,
    yet our side applies them once the peer acknowledges the preface. Staged that way
    (as this stream's setup once was), the peer sends the 65,535 bytes it knows of and
    waits for a WINDOW_UPDATE our side holds back until half of a window the peer never
    heard of has been read: the stream stalls for good after about 64 to 96 KiB. So the
    settings are in place before the preface is made.
    """
    conn = H2Connection(H2Configuration(client_side=client_side, header_encoding="utf-8"))
    # Nothing has been sent or read yet: the peer's settings are still the defaults.
    conn.remote_settings = CompactSettings(client=not client_side)
    for table in (conn.encoder.header_table, conn.decoder.header_table):
        table.dynamic_entries = cast("deque[tuple[bytes, bytes]]", _Entries(table.dynamic_entries))
    conn.local_settings = CompactSettings(
        client=client_side,
        initial_values={
            SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
            SettingCodes.MAX_CONCURRENT_STREAMS: 8,
            SettingCodes.MAX_HEADER_LIST_SIZE: H2Connection.DEFAULT_MAX_HEADER_LIST_SIZE,
        },
    )
    return conn


def header_map(headers: list[tuple[bytes, bytes]] | list[tuple[str, str]] | None) -> dict[str, str]:
    """Headers as a str map, whichever form h2 handed them in."""
    out: dict[str, str] = {}
    for key, value in headers or []:
        k = key.decode() if isinstance(key, bytes) else key
        out[k] = value.decode() if isinstance(value, bytes) else value
    return out


class FrameChannel:
    """One end's h2 connection and its one stream of frames."""

    def __init__(self, *, client_side: bool, outbox: Outbox) -> None:
        self.conn = h2_connection(client_side)
        self.outbox = outbox
        self.decoder = FrameDecoder()
        self.stream_id: int | None = None
        self.closed = False
        # The rest of a frame the window cut short; it goes before anything else.
        self._partial = memoryview(b"")

    def start(self) -> None:
        """The connection preface and our settings (sent with the next data_to_send)."""
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(WINDOW)

    def open_stream(self, authority: str) -> int:
        """The agent's side: start the POST that carries the stream."""
        sid: int = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            sid,
            [
                (":method", "POST"),
                (":scheme", "https"),
                (":authority", authority),
                (":path", STREAM_PATH),
                ("content-type", CONTENT_TYPE),
            ],
        )
        self.stream_id = sid
        return sid

    def accept_stream(self, stream_id: int) -> None:
        """The control plane's side: answer the POST; its body carries our frames."""
        self.stream_id = stream_id
        self.conn.send_headers(stream_id, [(":status", "200"), ("content-type", CONTENT_TYPE)])

    def refuse_stream(
        self, stream_id: int, status: int, headers: list[tuple[str, str]] | None = None
    ) -> None:
        self.conn.send_headers(
            stream_id, [(":status", str(status)), *(headers or [])], end_stream=True
        )

    def receive(self, data: bytes) -> list[Event]:
        """h2's events for received bytes, data acknowledged so the peer may keep
        sending. Raises h2's ProtocolError for a peer that broke HTTP/2."""
        events: list[Event] = self.conn.receive_data(data)
        for event in events:
            if isinstance(event, DataReceived) and event.flow_controlled_length:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        return events

    def frames(self, data: bytes) -> list[dict[str, Any]]:
        """The whole frames that stream data completes. Raises FrameError."""
        return self.decoder.feed(data)

    def ping(self, payload: bytes) -> None:
        self.conn.ping(payload)

    def window(self) -> int:
        """How many bytes of our stream the peer takes now (0 once the stream is gone)."""
        if self.stream_id is None or self.closed:
            return 0
        try:
            return int(self.conn.local_flow_control_window(self.stream_id))
        except ProtocolError:  # the stream was closed or reset under us
            return 0

    def data_to_send(self) -> bytes:
        """Bytes to write now: h2's own frames, then messages as the window allows.
        Raises FrameError for a message too large to be a frame."""
        while (window := self.window()) > 0:
            if not self._partial:
                msg = self.outbox.pop()
                if msg is None:
                    break
                self._partial = memoryview(encode_message(msg))
            self._partial = self._send(self._partial, window)
        out: bytes = self.conn.data_to_send()
        return out

    def close(self, last: Message | None = None) -> bytes:
        """The last bytes to write: ``last`` ending our stream if the window still takes
        it whole, then GOAWAY. What waits in the outbox is dropped with the stream."""
        if self.closed:
            return b""
        self.outbox.clear()
        try:
            if last is not None and self.stream_id is not None:
                frame = encode_message(last)
                if self.window() >= len(self._partial) + len(frame):
                    rest = self._send(self._partial, len(self._partial))
                    assert not rest
                    self._partial = memoryview(b"")
                    self._send(memoryview(frame), len(frame), end=True)
            self.conn.close_connection()
        except Exception:  # the connection may be half gone already; closing is best effort
            pass
        self.closed = True
        out: bytes = self.conn.data_to_send()
        return out

    def _send(self, view: memoryview, window: int, end: bool = False) -> memoryview:
        """Send up to ``window`` bytes of ``view`` in DATA frames; the rest of it."""
        assert self.stream_id is not None
        size = self.conn.max_outbound_frame_size
        sent = 0
        while sent < min(window, len(view)):
            chunk = view[sent : sent + min(size, window - sent)]
            sent += len(chunk)
            self.conn.send_data(self.stream_id, bytes(chunk), end_stream=end and sent == len(view))
        if end and not view:
            self.conn.end_stream(self.stream_id)
        return view[sent:]
