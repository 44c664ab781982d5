"""One HTTP/2 connection over asyncio streams: a raw end of the agent stream.

The agent and the control plane run the stream through their protocol objects
(``llmgw.agent.stream``, ``llmgw.server.fleet.stream``) over ``llmgw.wire.channel``;
this plain link is for talking to the agents' port byte by byte (the tests' hostile
agents): feeding received bytes, acknowledging them (flow control), writing what h2
wants sent, and sending DATA no faster than the peer's window allows.
"""

from __future__ import annotations

import asyncio

from h2.events import (
    DataReceived,
    Event,
    RemoteSettingsChanged,
    WindowUpdated,
)

from llmgw.wire.channel import CONTENT_TYPE, STREAM_PATH, WINDOW, h2_connection, header_map

__all__ = ["CONTENT_TYPE", "STREAM_PATH", "WINDOW", "H2Link", "LinkClosed", "header_map"]


class LinkClosed(ConnectionError):
    """The connection ended while something was waiting to send."""


class H2Link:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, client_side: bool
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h2_connection(client_side)
        self._window_open = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self.closed = False

    def start(self) -> None:
        """Send the connection preface and our settings."""
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(WINDOW)
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.closed:
            self.writer.write(data)

    def receive(self, data: bytes) -> list[Event]:
        """Hand received bytes to h2; acknowledge data so the peer may keep sending."""
        events: list[Event] = self.conn.receive_data(data)
        for event in events:
            if isinstance(event, DataReceived) and event.flow_controlled_length:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, WindowUpdated | RemoteSettingsChanged):
                self._window_open.set()
        self.flush()
        return events

    async def send(self, stream_id: int, data: bytes) -> None:
        """Send bytes on a stream as the peer's window allows; whole calls never interleave."""
        async with self._send_lock:
            view = memoryview(data)
            while view:
                if self.closed:
                    raise LinkClosed("the connection is closed")
                window = min(
                    self.conn.local_flow_control_window(stream_id),
                    self.conn.max_outbound_frame_size,
                )
                if window <= 0:
                    self._window_open.clear()
                    await self._window_open.wait()
                    continue
                self.conn.send_data(stream_id, bytes(view[:window]))
                view = view[window:]
                self.flush()
            await self.writer.drain()

    def send_headers(
        self, stream_id: int, headers: list[tuple[str, str]], end: bool = False
    ) -> None:
        self.conn.send_headers(stream_id, headers, end_stream=end)
        self.flush()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.conn.close_connection()
            self.flush()
        except Exception:  # the connection may already be half gone; closing is best effort
            pass
        self.closed = True
        self._window_open.set()
        self.writer.close()
