"""The control plane's end of an agent stream, without sockets: who is let in, what may
come before Register, what ends a stream, where answers go, and what an agent or an
API client that stops reading costs."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import ResponseReceived

from llmgw.agent.stream import Deliver
from llmgw.agent.stream import Ended as AgentEnded
from llmgw.server.fleet.stream import (
    Answered,
    Ended,
    NodeStream,
    Registering,
    Reported,
    StreamClosed,
    admit,
)
from llmgw.wire import encode_frame
from llmgw.wire.channel import CONTENT_TYPE, STREAM_PATH, WINDOW, header_map
from llmgw.wire.messages import (
    EngineStatus,
    Heartbeat,
    KvBlocks,
    Registered,
    Request,
    Response,
    ShardSpec,
    ShardStatus,
    StartShard,
    StopShard,
    encode_message,
)
from llmgw.wire.outbox import Outbox, OutboxFull, dropped_marker
from tests.support.streampair import Pair, register


def test_only_http2_and_the_current_certificate_are_admitted() -> None:
    assert admit("h2", ("n1", 42), current=True) is None
    assert admit("http/1.1", ("n1", 42), True) == "the agents' port speaks HTTP/2 only"
    assert admit(None, None, False) == "the agents' port speaks HTTP/2 only"
    # A certificate re-enrolling retired (its serial is not the store's) is a stranger.
    assert admit("h2", ("n1", 41), current=False) == (
        "certificate ('n1', 41) is not the current one of an enrolled node"
    )
    assert admit("h2", None, current=False) == (
        "certificate None is not the current one of an enrolled node"
    )


def test_register_is_handed_over_and_reports_follow_it() -> None:
    pair = Pair()
    pair.settle()
    (first,) = pair.to_node
    assert isinstance(first, Registering) and first.message == register()
    pair.node.send(Registered(node_id="n1", heartbeat_interval=5.0))
    pair.settle()
    beat = pair.agent.heartbeat(1.0, memory_available=7)
    pair.agent.send(ShardStatus(replica_id="r1", state="ready"))
    pair.agent.send(EngineStatus(message="hello"))
    # A vLLM replica's cache: 64-bit hashes (past int64) cross the wire unchanged.
    cache = KvBlocks("r1", 16, added=[2**64 - 1, 7], removed=[2**63], reset=True)
    pair.agent.send(cache)
    pair.settle()
    assert pair.to_node[1:] == [
        Reported(beat),
        Reported(ShardStatus(replica_id="r1", state="ready")),
        Reported(EngineStatus(message="hello")),
        Reported(cache),
    ]


def test_a_register_naming_another_node_ends_the_stream() -> None:
    pair = Pair("mallory", register_as="victim")
    pair.settle()
    (ended,) = pair.to_node
    assert isinstance(ended, Ended)
    assert ended.reason == (
        "bad frame: Register names node 'victim' but the certificate is for 'mallory'"
    )
    assert ended.fault is not None and ended.fault.startswith("sent a bad frame: Register")
    assert not pair.node.registered
    # The agent hears why, in a Goodbye that ends the stream.
    pair.agent.receive(pair.node.close(ended.reason))
    assert pair.agent.ended == f"the control plane said: {ended.reason}"


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (Heartbeat(seq=1), "heartbeat before register"),
        (ShardStatus(replica_id="r", state="ready"), "ShardStatus before register"),
        (Response(id="x"), "Response before register"),
    ],
)
def test_nothing_may_come_before_register(message: object, words: str) -> None:
    node = NodeStream("n1")
    events = _raw_agent(node, encode_message(message))  # type: ignore[arg-type]
    assert events == [Ended(f"bad frame: {words}", f"sent a bad frame: {words}")]


def test_an_unknown_type_is_ignored_after_register_but_not_before() -> None:
    node = NodeStream("n1")
    events = _raw_agent(node, encode_message(register()), encode_frame({"t": "future"}))
    assert events == [Registering(register())]
    node = NodeStream("n1")
    (ended,) = _raw_agent(node, encode_frame({"t": "future"}))
    assert isinstance(ended, Ended)
    assert ended.reason == "bad frame: a message of type 'future' before register"


@pytest.mark.parametrize(
    ("garbage", "expected"),
    [
        (struct.pack(">I", 64 * 1024 * 1024), "exceeds the 4194304-byte limit"),
        (struct.pack(">I", 3) + b"\xc1\xc1\xc1", "not valid msgpack"),
        (struct.pack(">I", 2) + b"\x91\x01", "not a map"),
        (encode_frame({"t": "heartbeat", "seq": "one"}), "expected int"),
        (encode_frame({"seq": 1}), "no message type"),
    ],
    ids=["oversized", "not-msgpack", "not-a-map", "wrong-type", "no-type"],
)
def test_bad_frames_end_the_stream(garbage: bytes, expected: str) -> None:
    node = NodeStream("n1")
    events = _raw_agent(node, encode_message(register()), garbage)
    assert events[0] == Registering(register())
    ended = events[1]
    assert isinstance(ended, Ended)
    assert ended.reason.startswith("bad frame: ") and expected in ended.reason
    assert ended.fault is not None and ended.fault.startswith("sent a bad frame: ")
    # Nothing more is read from a stream that is over.
    assert node.receive(b"anything") == []


def test_an_oversized_frame_is_refused_from_its_header_alone() -> None:
    node = NodeStream("n1")
    # Only the 4-byte length has arrived: no 64 MiB is waited for, or buffered.
    (ended,) = _raw_agent(node, struct.pack(">I", MAX := 4 * 1024 * 1024 + 1))
    assert isinstance(ended, Ended) and f"frame of {MAX} bytes exceeds" in ended.reason


def test_a_peer_that_breaks_http2_ends_the_stream() -> None:
    node = NodeStream("n1")
    node.start()
    (ended,) = node.receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(ended, Ended)
    assert ended.reason.startswith("HTTP/2 protocol error: ")
    assert ended.fault is not None and ended.fault.startswith("broke HTTP/2: ")


def test_another_path_is_404_and_a_second_stream_409() -> None:
    node = NodeStream("n1")
    node.start()
    client = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "https"), (":authority", "x")]
    client.send_headers(1, [*headers, (":path", "/elsewhere")])
    client.send_headers(3, [*headers, (":path", STREAM_PATH)])
    client.send_headers(5, [*headers, (":path", STREAM_PATH)])
    assert node.receive(client.data_to_send()) == []
    answers = {
        e.stream_id: header_map(e.headers)
        for e in client.receive_data(node.data_to_send())
        if isinstance(e, ResponseReceived)
    }
    assert answers[1][":status"] == "404"
    assert answers[3] == {":status": "200", "content-type": CONTENT_TYPE}
    assert answers[5][":status"] == "409"
    assert node.stream_id == 3


def test_answers_go_to_the_asker_of_their_id_and_strays_are_dropped() -> None:
    pair = Pair().registered()
    logs, logs_answers = pair.node.ask("logs", {"source": "agent"})
    weights, weights_answers = pair.node.ask("weights.list", {})
    pair.settle()
    asked = [e.message for e in pair.to_agent if isinstance(e, Deliver)]
    assert asked == [
        Request(id=logs, kind="logs", args={"source": "agent"}),
        Request(id=weights, kind="weights.list", args={}),
    ]
    pair.agent.send(Response(id=weights, result=[{"name": "m"}]))
    pair.agent.send(Response(id="nobody-asked", result="stray"))
    pair.agent.send(Response(id=logs, result=["a", "b"], more=True))
    pair.to_node.clear()
    pair.settle()
    assert pair.to_node == [Answered(weights), Answered(logs)]
    assert weights_answers.pop() == Response(id=weights, result=[{"name": "m"}])
    assert weights_answers.pop() is None
    assert logs_answers.pop() == Response(id=logs, result=["a", "b"], more=True)
    # An asker that is done gets nothing more.
    pair.node.forget(logs)
    pair.agent.send(Response(id=logs, result=["c"], more=True))
    pair.to_node.clear()
    pair.settle()
    assert pair.to_node == [] and logs_answers.pop() is None


def test_answers_past_the_bound_of_one_ask_are_lost_and_counted() -> None:
    pair = Pair().registered()
    request_id, answers = pair.node.ask("weights.list", {})
    for i in range(40):
        pair.agent.send(Response(id=request_id, result=i))
    pair.settle()
    assert len(answers.queue) == 16 and answers.lost == 24
    assert answers.pop() == Response(id=request_id, result=0)


def test_close_says_goodbye_and_tells_every_asker() -> None:
    pair = Pair().registered()
    _, answers = pair.node.ask("logs", {})
    pair.settle()
    assert not answers.over
    last = pair.node.close("the control plane is shutting down")
    assert answers.over and pair.node.closed
    events = pair.agent.receive(last)
    assert events == [AgentEnded("the control plane said: the control plane is shutting down")]
    with pytest.raises(StreamClosed, match="the connection is closed"):
        pair.node.send(StopShard(replica_id="r"))
    assert pair.node.close("again") == b""


def test_the_agent_ending_its_stream_or_connection_ends_ours() -> None:
    pair = Pair().registered()
    pair.agent.channel.conn.end_stream(pair.agent.channel.stream_id)
    assert pair.up() == [Ended("the agent ended its stream")]
    pair = Pair().registered()
    pair.agent.channel.conn.close_connection()
    assert pair.up() == [Ended("the agent closed the connection")]


def test_nothing_is_sent_before_the_stream_is_open() -> None:
    node = NodeStream("n1")
    node.start()
    with pytest.raises(StreamClosed, match="node n1 has no open stream"):
        node.send(StopShard(replica_id="r"))
    with pytest.raises(StreamClosed, match="node n1 has no open stream"):
        node.ask("logs", {})
    assert node.waiters == {}


def test_an_agent_that_stops_reading_fills_a_bounded_outbox() -> None:
    pair = Pair().registered()
    pair.node.outbox.limit = 8
    # Past the agent's window, commands wait in the outbox, never in h2's buffers or
    # the socket's: what is written stops at the window, what waits at the bound.
    written = sent = 0
    with pytest.raises(OutboxFull):
        while True:
            spec = ShardSpec(
                replica_id=f"r{sent}",
                engine="e",
                source="s",
                port=1,
                key="k",
                fingerprint="f",
                args=["x" * 1000],
            )
            pair.node.send(StartShard(spec=spec))
            sent += 1
            written += len(pair.node.data_to_send())  # to a socket nobody reads
    assert len(pair.node.outbox) == 8
    # The agent's window (WINDOW, as it advertised), the DATA frames' headers, no more.
    assert WINDOW < written < WINDOW * 1.02
    assert sent < WINDOW // 1000 + 8


def test_a_followed_log_nobody_reads_costs_a_fixed_amount_of_memory() -> None:
    """The API client stopped reading a followed log: 100,000 lines arrive for its ask
    and wait, merged, at most 4,096 of them, the rest counted for the reader."""
    pair = Pair().registered()
    request_id, answers = pair.node.ask("logs", {"follow": True})
    pair.settle()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for step in range(100):
            lines = [f"line {n}" for n in range(step * 1000, step * 1000 + 1000)]
            pair.agent.send(Response(id=request_id, result=lines, more=True))
            pair.settle()
            pair.to_node.clear()
            if step == 10:
                early, _ = tracemalloc.get_traced_memory()
        late, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(answers.queue) == 1 and answers.queue.held_lines == 4096
    # The last 89,000 lines (5 MB had they been kept) added next to nothing: the
    # allowance is CPython's free list of small tuples (h2 parses each frame header into
    # one), which tracemalloc counts as held until it is full.
    assert late - early < 256 * 1024, (early, late)
    assert peak - base < 2 * 1024 * 1024, peak - base
    batch = answers.pop()
    assert batch is not None and batch.more
    assert batch.result[0] == dropped_marker(100_000 - 4096)
    assert batch.result[-1] == "line 99999"


def test_a_message_too_large_for_a_frame_is_refused_to_its_sender() -> None:
    from llmgw.wire import FrameError

    pair = Pair().registered()
    with pytest.raises(FrameError):
        pair.node.send(Request(id="x", kind="k", args={"blob": "x" * (5 * 1024 * 1024)}))
    assert len(pair.node.outbox) == 0


def test_a_custom_outbox_is_used() -> None:
    box = Outbox(limit=2)
    node = NodeStream("n1", box)
    assert node.outbox is box and node.channel.outbox is box


def _raw_agent(node: NodeStream, *bodies: bytes) -> list[object]:
    """Open the stream as a bare h2 client and send ``bodies`` on it, each read apart
    (a frame that breaks the decoder takes the others of its read with it)."""
    node.start()
    client = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    client.send_headers(
        1,
        [
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", "x"),
            (":path", STREAM_PATH),
            ("content-type", CONTENT_TYPE),
        ],
    )
    events: list[object] = list(node.receive(client.data_to_send()))
    for body in bodies:
        for at in range(0, len(body), 16384):
            client.send_data(1, body[at : at + 16384])
        events += node.receive(client.data_to_send())
    return events


@pytest.mark.parametrize(
    ("redirect", "words"),
    [("10.0.0.1:8443", "a standby; the leader is at 10.0.0.1:8443"), ("", "refused (HTTP 503)")],
)
def test_a_standby_sends_an_agent_to_the_leader_or_away(redirect: str, words: str) -> None:
    pair = Pair()
    pair.node = NodeStream("n1", redirect=redirect)
    pair.node.start()
    pair.settle()
    # Nothing of the agent's is taken: its Register never reaches the registry.
    assert not any(isinstance(e, Registering) for e in pair.to_node)
    assert pair.agent.registered is None
    assert pair.agent.ended is not None and words in pair.agent.ended
    assert pair.agent.redirect == (redirect or None)
