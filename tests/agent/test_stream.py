"""The agent's end of the stream, without sockets or a clock: Register first, what the
control plane's words mean, PINGs and their deadline, what ends a stream, and what a
control plane that stops reading costs the agent."""

from __future__ import annotations

import tracemalloc

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, PingReceived, RequestReceived
from hyperframe.frame import DataFrame, Frame, PingFrame

from llmgw.agent.stream import Accepted, AgentStream, Deliver, Ended
from llmgw.server.fleet.stream import Reported
from llmgw.wire import FrameDecoder, encode_frame
from llmgw.wire.channel import WINDOW
from llmgw.wire.messages import (
    Goodbye,
    Heartbeat,
    Registered,
    Response,
    ShardStatus,
    StopShard,
    decode_message,
    encode_message,
)
from llmgw.wire.outbox import Outbox, dropped_count
from tests.support.streampair import Pair, register


def frame_kinds(data: bytes) -> list[type[Frame]]:
    """The HTTP/2 frame types in ``data``, in order (after any client preface)."""
    data = data.removeprefix(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    kinds = []
    while data:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        kinds.append(type(frame))
        data = data[9 + length :]
    return kinds


class BareServer:
    """A control plane reduced to h2: it says exactly what a test makes it say."""

    def __init__(self, agent: AgentStream) -> None:
        self.agent = agent
        self.conn = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.decoder = FrameDecoder()
        self.messages: list[object] = []
        self.pings = 0

    def read(self) -> None:
        for event in self.conn.receive_data(self.agent.data_to_send()):
            if isinstance(event, DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length, 1)
                self.messages += [decode_message(p) for p in self.decoder.feed(event.data)]
            elif isinstance(event, PingReceived):
                self.pings += 1

    def say(self, status: str = "200", *frames: bytes) -> list[object]:
        self.read()
        self.conn.send_headers(1, [(":status", status)], end_stream=status != "200")
        for frame in frames:
            self.conn.send_data(1, frame)
        return list(self.agent.receive(self.conn.data_to_send()))


def connected(**kwargs: object) -> AgentStream:
    agent = AgentStream(entropy=lambda n: b"\x01" * n, **kwargs)  # type: ignore[arg-type]
    agent.connect("cp.test:7443", register())
    return agent


def test_the_stream_opens_with_the_post_and_register_before_anything() -> None:
    agent = connected()
    agent.send(StopShard(replica_id="queued after Register"))
    server = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
    server.initiate_connection()
    events = server.receive_data(agent.data_to_send())
    (request,) = [e for e in events if isinstance(e, RequestReceived)]
    assert dict(request.headers)[":path"] == "/agent/v1/stream"
    data = b"".join(e.data for e in events if isinstance(e, DataReceived))
    first, second = FrameDecoder().feed(data)
    assert decode_message(first) == register()
    assert decode_message(second) == StopShard(replica_id="queued after Register")


def test_registered_is_accepted_and_other_messages_are_delivered() -> None:
    pair = Pair().registered()
    assert pair.to_agent == [Accepted(Registered(node_id="n1", heartbeat_interval=5.0))]
    pair.node.send(StopShard(replica_id="r1"))
    pair.settle()
    assert pair.to_agent[1:] == [Deliver(StopShard(replica_id="r1"))]


def test_goodbye_ends_the_stream_with_the_control_planes_words() -> None:
    agent = connected()
    events = BareServer(agent).say(
        "200", encode_message(Goodbye(reason="replaced by a newer connection"))
    )
    assert events == [Ended("the control plane said: replaced by a newer connection")]
    assert agent.ended == "the control plane said: replaced by a newer connection"
    assert agent.receive(b"more") == [] and agent.tick(1e9) == []


def test_unknown_messages_are_ignored_and_messages_before_a_goodbye_still_count() -> None:
    agent = connected()
    events = BareServer(agent).say(
        "200",
        encode_frame({"t": "from-the-future", "x": 1}),
        encode_message(StopShard(replica_id="r")),
        encode_message(Goodbye(reason="bye")),
        encode_message(StopShard(replica_id="never")),
    )
    assert events == [Deliver(StopShard(replica_id="r")), Ended("the control plane said: bye")]


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ((b"\x00\x00\x00\x02\x91\x01",), "FrameError: frame holds a list, not a map"),
        ((encode_frame({"t": "registered", "node_id": 1}),), "MessageError: Registered.node_id"),
    ],
    ids=["not-a-map", "wrong-type"],
)
def test_what_does_not_decode_ends_the_stream(frames: tuple[bytes, ...], reason: str) -> None:
    agent = connected()
    (ended,) = BareServer(agent).say("200", *frames)
    assert isinstance(ended, Ended) and ended.reason.startswith(reason)


def test_a_refused_post_ends_the_stream() -> None:
    agent = connected()
    assert BareServer(agent).say("404") == [Ended("the stream was refused (HTTP 404)")]


def test_the_control_plane_ending_the_stream_or_connection_ends_it() -> None:
    pair = Pair().registered()
    pair.node.channel.conn.end_stream(1)
    assert pair.down() == [Ended("the control plane ended the stream")]
    pair = Pair().registered()
    pair.node.channel.conn.close_connection()
    assert pair.down() == [Ended("the control plane closed the connection")]
    agent = connected()
    assert agent.connection_lost() == [Ended("the control plane closed the connection")]
    assert agent.connection_lost() == []


def test_a_ping_goes_when_the_line_is_quiet_and_one_unanswered_ends_the_stream() -> None:
    agent = connected(ping_interval=2.5, ping_timeout=5.0)
    server = BareServer(agent)
    assert agent.tick(100.0) == []
    server.read()
    assert server.pings == 1 and agent.ping_outstanding == 100.0
    # One at a time: no second PING while the first waits for its answer.
    agent.tick(103.0)
    server.read()
    assert server.pings == 1
    # Answered: the next goes ping_interval after the last.
    agent.receive(server.conn.data_to_send())
    assert agent.ping_outstanding is None
    agent.tick(102.4)
    server.read()
    assert server.pings == 1
    agent.tick(102.5)
    server.read()
    assert server.pings == 2
    # Unanswered for longer than ping_timeout: the control plane is gone.
    assert agent.tick(107.5) == []
    assert agent.tick(107.6) == [
        Ended("no answer to HTTP/2 PING in 5 s; the control plane is stopped or unreachable")
    ]


def test_each_heartbeat_carries_a_ping_in_the_same_write() -> None:
    pair = Pair().registered()
    pair.agent.tick(10.0)
    pair.settle()  # the PING answered
    beat = pair.agent.heartbeat(11.0, memory_available=5)
    data = pair.agent.data_to_send()
    assert frame_kinds(data) == [PingFrame, DataFrame]
    assert pair.node.receive(data) == [Reported(beat)]
    assert [beat.seq, pair.agent.heartbeat(12.0).seq] == [1, 2]


def test_heartbeats_waiting_unsent_coalesce_into_the_latest() -> None:
    pair = Pair().registered()
    pair.agent.heartbeat(1.0, memory_available=5, memory_read_gbs=30.0)
    pair.agent.heartbeat(2.0, memory_available=6)
    pair.settle()
    assert pair.to_node[-1] == Reported(Heartbeat(seq=2, memory_available=6, memory_read_gbs=30.0))


def test_an_outbox_past_its_bound_ends_the_stream() -> None:
    agent = connected(outbox=Outbox(limit=4))
    for i in range(3):
        agent.send(Response(id=str(i), result=i))
    assert agent.ended is None
    agent.send(Response(id="3", result=3))
    assert agent.ended == "the control plane is not reading the stream: 4 messages wait to be read"
    agent.send(Response(id="4", result=4))  # ignored from now on


def test_a_control_plane_that_stops_reading_costs_the_agent_a_fixed_amount() -> None:
    """200,000 status updates for 50 shards and 200,000 log lines while the control
    plane reads nothing: the agent writes no more than the window takes, holds at most
    one entry per shard and one batch of lines, and its memory stays flat (the second
    100,000 of each add nothing). When the
    control plane reads again, it gets each shard's latest word and every line or a
    count of those dropped, never a gap it is not told of."""
    pair = Pair().registered()
    _, waiter = pair.node.ask("logs", {"follow": True})
    pair.settle()
    (request,) = [e.message for e in pair.to_agent if isinstance(e, Deliver)]
    follow_id = request.id  # type: ignore[attr-defined]
    # Made up front, and reused: making 200,000 dataclasses would be most of the time.
    updates = [
        ShardStatus(replica_id=f"r{i % 50}", state="loading", reason=f"update {i}")
        for i in range(2000)
    ]
    blocks = [updates[at : at + 100] for at in range(0, 2000, 100)]
    written: list[bytes] = []  # what the agent wrote to a socket nobody reads
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for step in range(2000):
            for update in blocks[step % 20]:
                pair.agent.send(update)
            lines = [f"line {n}" for n in range(step * 100, step * 100 + 100)]
            pair.agent.send(Response(id=follow_id, result=lines, more=True))
            written.append(pair.agent.data_to_send())
            if step == 1000:
                assert pair.agent.channel.window() == 0  # long since full
                early, _ = tracemalloc.get_traced_memory()
        late, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pair.agent.ended is None
    assert len(pair.agent.outbox) <= 51
    assert pair.agent.outbox.held_lines == 4096
    # The window the control plane advertised and the DATA frames' headers, no more.
    assert WINDOW < sum(map(len, written)) < WINDOW * 1.1
    assert late - early < 64 * 1024, (early, late)
    # All of it, the bytes in the unread socket included: one window and the outbox.
    assert peak - base < WINDOW + 2 * 1024 * 1024, peak - base

    # The control plane reads again.
    pair.to_node.clear()
    pair.to_node += pair.node.receive(b"".join(written))
    pair.settle()
    latest = {
        e.message.replica_id: e.message.reason
        for e in pair.to_node
        if isinstance(e, Reported) and isinstance(e.message, ShardStatus)
    }
    assert latest == {f"r{k}": f"update {1950 + k}" for k in range(50)}
    seen = told = 0
    while (answer := waiter.pop()) is not None:
        for line in answer.result:
            count = dropped_count(line)
            seen += count is None
            told += count or 0
    assert seen + told == 200_000 and seen >= 4096


def test_heartbeat_figures_name_every_heartbeat_field_but_its_seq() -> None:
    import dataclasses

    from llmgw.agent.stream import HeartbeatFigures
    from llmgw.wire.messages import Heartbeat

    fields = [f.name for f in dataclasses.fields(Heartbeat) if f.name != "seq"]
    assert list(HeartbeatFigures.__annotations__) == fields
