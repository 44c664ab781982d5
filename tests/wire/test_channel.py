"""The HTTP/2 carriage of the stream, both ends in memory: the window each side
advertises is the one the other uses, so nothing stalls however much goes through, and
a frame the window cuts short is finished before the next begins."""

from __future__ import annotations

from collections import deque

from h2.connection import H2Connection
from h2.events import Event, RemoteSettingsChanged, RequestReceived
from h2.settings import SettingCodes

from llmgw.server.fleet.stream import Answered, Reported
from llmgw.wire.channel import WINDOW, h2_connection
from llmgw.wire.messages import Request, Response, ShardStatus
from tests.support.streampair import Pair


def test_each_end_uses_the_window_the_other_advertised() -> None:
    pair = Pair().registered()
    for ours, theirs in (
        (pair.agent.channel, pair.node.channel),
        (pair.node.channel, pair.agent.channel),
    ):
        assert theirs.conn.remote_settings.initial_window_size == WINDOW
        assert ours.conn.local_settings.initial_window_size == WINDOW
    # The very first SETTINGS carry it: nothing is left staged for later.
    conn = h2_connection(client_side=True)
    conn.initiate_connection()
    assert conn.local_settings.initial_window_size == WINDOW


def test_many_windows_worth_go_through_both_ways_without_a_stall() -> None:
    # Once, settings staged but never sent left each end waiting for a WINDOW_UPDATE
    # the other thought was not due, and the stream stopped after about 64 KiB.
    pair = Pair().registered()
    request_id, answers = pair.node.ask("logs", {"follow": True})
    pair.settle()
    line = "x" * 1000
    for _ in range(80):  # 8 MB up, in 100 KB batches
        pair.agent.send(Response(id=request_id, result=[line] * 100, more=True))
        pair.settle()
        got = answers.pop()
        assert got is not None and len(got.result) == 100
    for i in range(80):  # 8 MB down
        pair.node.send(Request(id=str(i), kind="k", args={"blob": "y" * 100_000}))
    pair.settle()
    assert len(pair.to_agent) == 1 + 1 + 80  # Accepted, the logs request, the 80
    assert pair.agent.ended is None and pair.node.ended is None


def test_a_frame_the_window_cuts_short_is_finished_before_the_next() -> None:
    pair = Pair().registered()
    big = ["z" * 300_000]
    request_id, answers = pair.node.ask("k", {})
    pair.settle()
    # Nobody reads at first: the window takes three and a bit, the rest wait.
    for i in range(8):
        pair.agent.send(ShardStatus(replica_id=f"r{i}", state="loading", last_lines=big))
    pair.agent.send(Response(id=request_id, result="done"))
    held = pair.agent.data_to_send()
    assert WINDOW < len(held) < WINDOW + 20_000
    assert len(pair.agent.outbox) == 5  # four statuses and the answer
    pair.to_node.clear()
    pair.to_node += pair.node.receive(held)
    pair.settle()
    shards = [e.message.replica_id for e in pair.to_node if isinstance(e, Reported)]
    assert shards == [f"r{i}" for i in range(8)]
    assert pair.to_node[-1] == Answered(request_id)


def _exchange(a: H2Connection, b: H2Connection) -> list[Event]:
    """What each end has to send delivered to the other until both are quiet; the
    events ``b`` saw."""
    seen: list[Event] = []
    while True:
        out_a, out_b = a.data_to_send(), b.data_to_send()
        if not out_a and not out_b:
            return seen
        if out_a:
            seen += b.receive_data(out_a)
        if out_b:
            a.receive_data(out_b)


def test_settings_and_header_tables_stay_small_and_work() -> None:
    client, server = h2_connection(client_side=True), h2_connection(client_side=False)
    client.initiate_connection()
    server.initiate_connection()
    _exchange(client, server)
    # A setting changed mid-connection is staged, sent, acknowledged, then in force.
    client.update_settings({SettingCodes.MAX_FRAME_SIZE: 32768})
    changed = [e for e in _exchange(client, server) if isinstance(e, RemoteSettingsChanged)]
    assert changed and changed[0].changed_settings[SettingCodes.MAX_FRAME_SIZE].new_value == 32768
    assert server.remote_settings.max_frame_size == 32768
    assert client.local_settings.max_frame_size == 32768
    # Headers fill the dynamic tables; a second request finds them there.
    headers = [
        (":method", "POST"),
        (":path", "/agent/v1/stream"),
        (":scheme", "https"),
        (":authority", "cp.example"),
        ("x-llmgw-node", "gpu01"),
    ]
    for stream_id in (1, 3):
        client.send_headers(stream_id, headers)
        got = [e for e in _exchange(client, server) if isinstance(e, RequestReceived)]
        assert got and dict(got[0].headers)["x-llmgw-node"] == "gpu01"
    assert len(client.encoder.header_table.dynamic_entries) >= 2
    assert list(server.decoder.header_table.dynamic_entries) == list(
        client.encoder.header_table.dynamic_entries
    )
    # No deque left in either end: each holds its values in a list.
    for conn in (client, server):
        for settings in (conn.local_settings, conn.remote_settings):
            assert not any(isinstance(v, deque) for v in settings._settings.values())
        for table in (conn.encoder.header_table, conn.decoder.header_table):
            assert not isinstance(table.dynamic_entries, deque)
