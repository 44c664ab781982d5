"""The bounded, coalescing outbox: the latest word wins, log lines drop oldest first and
say so, what must arrive arrives or the outbox says it is full; memory stays flat."""

from __future__ import annotations

import tracemalloc

import pytest

from llmgw.wire.messages import (
    DownloadProgress,
    EngineStatus,
    Goodbye,
    Heartbeat,
    Request,
    Response,
    ShardStatus,
    StopShard,
)
from llmgw.wire.outbox import (
    LINE_BYTES,
    Outbox,
    OutboxFull,
    dropped_count,
    dropped_marker,
)


def drain(box: Outbox) -> list[object]:
    out = []
    while (msg := box.pop()) is not None:
        out.append(msg)
    return out


def test_latest_shard_status_per_shard_wins_in_the_first_ones_place() -> None:
    box = Outbox()
    box.put(ShardStatus(replica_id="a", state="starting"))
    box.put(StopShard(replica_id="x"))
    box.put(ShardStatus(replica_id="b", state="starting"))
    box.put(ShardStatus(replica_id="a", state="loading"))
    box.put(ShardStatus(replica_id="a", state="ready"))
    assert len(box) == 3 and box.coalesced == 2
    assert drain(box) == [
        ShardStatus(replica_id="a", state="ready"),
        StopShard(replica_id="x"),
        ShardStatus(replica_id="b", state="starting"),
    ]
    # Once sent, the next word on the same shard queues anew.
    box.put(ShardStatus(replica_id="a", state="stopped"))
    assert drain(box) == [ShardStatus(replica_id="a", state="stopped")]


def test_engine_status_and_downloads_keep_their_latest_word() -> None:
    box = Outbox()
    box.put(EngineStatus(message="downloading llama.cpp"))
    box.put(DownloadProgress(source="hf:a", replica_ids=["r"], done=1))
    box.put(DownloadProgress(source="hf:b", replica_ids=["s"], done=1))
    box.put(EngineStatus(message="installed"))
    box.put(DownloadProgress(source="hf:a", replica_ids=["r"], done=9, finished=True))
    assert drain(box) == [
        EngineStatus(message="installed"),
        DownloadProgress(source="hf:a", replica_ids=["r"], done=9, finished=True),
        DownloadProgress(source="hf:b", replica_ids=["s"], done=1),
    ]


def test_a_newer_heartbeat_keeps_the_figures_it_leaves_out() -> None:
    box = Outbox()
    box.put(Heartbeat(seq=1, memory_available=10, memory_read_gbs=20.0))
    box.put(Heartbeat(seq=2, memory_available=11, cpu_percent=3.0))
    assert drain(box) == [
        Heartbeat(seq=2, memory_available=11, cpu_percent=3.0, memory_read_gbs=20.0)
    ]


def test_what_must_arrive_arrives_in_order_or_the_outbox_is_full() -> None:
    box = Outbox(limit=3)
    box.put(Request(id="1", kind="logs"))
    box.put(Response(id="2", result={"x": 1}))
    box.put(Goodbye(reason="bye"))
    with pytest.raises(OutboxFull, match="3 messages wait"):
        box.put(StopShard(replica_id="r"))
    # Coalescing into what waits needs no room; a new entry does.
    box2 = Outbox(limit=1)
    box2.put(ShardStatus(replica_id="a", state="starting"))
    box2.put(ShardStatus(replica_id="a", state="ready"))
    with pytest.raises(OutboxFull):
        box2.put(ShardStatus(replica_id="b", state="ready"))
    assert drain(box) == [
        Request(id="1", kind="logs"),
        Response(id="2", result={"x": 1}),
        Goodbye(reason="bye"),
    ]


def test_log_lines_merge_per_request_and_keep_order() -> None:
    box = Outbox()
    box.put(Response(id="f", result=["1", "2"], more=True))
    box.put(Response(id="g", result=["x"], more=True))
    box.put(Response(id="f", result=["3"], more=True))
    box.put(Response(id="f", result=[], more=True))  # a keep-alive adds nothing
    box.put(Response(id="f", result=["end"]))  # a final answer is no log line
    assert drain(box) == [
        Response(id="f", result=["1", "2", "3"], more=True),
        Response(id="g", result=["x"], more=True),
        Response(id="f", result=["end"]),
    ]
    # An empty keep-alive on its own still goes out: it says the node is there.
    box.put(Response(id="f", result=[], more=True))
    assert drain(box) == [Response(id="f", result=[], more=True)]


def test_log_lines_drop_oldest_first_and_the_reader_is_told_how_many() -> None:
    box = Outbox(lines=5)
    for i in range(12):
        box.put(Response(id="f", result=[f"line {i}"], more=True))
    assert box.dropped == 7 and box.held_lines == 5
    (batch,) = drain(box)
    assert isinstance(batch, Response) and batch.more
    assert batch.result == [dropped_marker(7)] + [f"line {i}" for i in range(7, 12)]
    assert batch.result[0] == "[llmgw: 7 log lines dropped here; the reader fell behind]"
    assert dropped_count(batch.result[0]) == 7
    assert dropped_marker(1) == "[llmgw: 1 log line dropped here; the reader fell behind]"
    assert dropped_count("[llmgw: 7 log lines dropped]") is None
    assert dropped_count("an ordinary line") is None


def test_a_marker_dropped_again_still_counts_every_line_it_stood_for() -> None:
    # The control plane's queue for one ask gets the agent's batches, marker and all.
    box = Outbox(lines=3)
    box.put(Response(id="f", result=[dropped_marker(100), "a", "b"], more=True))
    box.put(Response(id="f", result=["c", "d"], more=True))
    (batch,) = drain(box)
    assert isinstance(batch, Response)
    assert batch.result == [dropped_marker(101), "b", "c", "d"]


def test_lines_are_bounded_by_bytes_and_a_huge_line_is_cut_saying_so() -> None:
    box = Outbox(lines=1000, line_bytes=100)
    for i in range(10):
        box.put(Response(id="f", result=[f"{i}" * 30], more=True))
    (batch,) = drain(box)
    assert isinstance(batch, Response)
    assert batch.result == [dropped_marker(7), "7" * 30, "8" * 30, "9" * 30]
    box.put(Response(id="f", result=["é" * 200], more=True))
    (batch,) = drain(box)
    assert isinstance(batch, Response)
    (line,) = batch.result
    assert line.startswith("é" * 25) and line.endswith("[llmgw: line cut here; it was 400 bytes]")
    assert len(line.encode()) <= 100


def test_a_full_batch_still_fits_one_frame() -> None:
    from llmgw.wire.messages import encode_message

    box = Outbox()
    for _ in range(20):
        box.put(Response(id="f", result=["\U0001f600" * 200_000], more=True))
    (batch,) = drain(box)
    assert isinstance(batch, Response)
    assert sum(len(line.encode()) for line in batch.result[1:]) <= LINE_BYTES
    encode_message(batch)  # raises FrameError past MAX_FRAME


def test_a_reader_held_still_costs_a_fixed_amount_of_memory() -> None:
    """200,000 status updates for 50 shards and 200,000 log lines (in batches of 100,
    as a followed log sends them), nothing read: the outbox holds 51 entries, and what
    it allocated stops growing and stays small."""
    statuses = [ShardStatus(replica_id=f"r{i}", state="loading") for i in range(50)]
    box = Outbox()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for step in range(2000):
            for i in range(100):
                box.put(statuses[i % 50])
            lines = [f"log line {n}" for n in range(step * 100, step * 100 + 100)]
            box.put(Response(id="follow", result=lines, more=True))
            if step == 100:
                early, _ = tracemalloc.get_traced_memory()
        late, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(box) == 51
    assert box.held_lines == 4096 and box.dropped == 200_000 - 4096
    assert box.coalesced == 200_000 - 50
    # Flat: the last 190,000 of each added nothing, and all of it is under a mebibyte.
    assert late - early < 64 * 1024, (early, late)
    assert peak - base < 1024 * 1024, peak - base
    batch = drain(box)[50]
    assert isinstance(batch, Response)
    assert batch.result[0] == dropped_marker(200_000 - 4096)
    assert batch.result[-1] == "log line 199999"
