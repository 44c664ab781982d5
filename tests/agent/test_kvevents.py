"""vLLM's KV-cache events: decoding both encodings, the BlockSet's net changes, and the
subscriber against a fake vLLM publisher over real ZeroMQ sockets on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable

import cbor2
import msgpack
import pytest
import zmq

from llmgw.agent.kvevents import (
    HASH_SEED,
    VLLM_ENV,
    AllBlocksCleared,
    Batch,
    BlockChanges,
    BlockRemoved,
    BlockSet,
    BlockStored,
    KvEventError,
    KvSubscriber,
    decode_batch,
    vllm_flags,
)
from tests.support.fakevllm import (
    Cleared,
    FakeEvent,
    FakeVllm,
    Removed,
    Stored,
    encode_batch,
    free_port,
)

# The reference payloads below were written by msgspec 0.23's msgpack encoder from
# vLLM's own struct definitions (vllm/distributed/kv_events.py), for the batch
#   ts=1.5, data_parallel_rank=0, events=[
#     BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[7, 8, 9, 10],
#                 block_size=2, lora_id=None, medium="GPU"[, lora_name=None]),
#     BlockRemoved(block_hashes=[1], medium="GPU"),
#     AllBlocksCleared()]
# ARRAY: EventBatch and KVCacheEvent with array_like=True, omit_defaults=True, tag=True
# (mid-2025 vLLM): the tag is the first element, the fields follow in order.
ARRAY = bytes.fromhex(
    "93cb3ff80000000000009397ab426c6f636b53746f726564920102c0940708090a02c0a347505593ac426c"
    "6f636b52656d6f7665649101a347505591b0416c6c426c6f636b73436c656172656400"
)
# MAP: the same structs without array_like (vLLM main, 2026; BlockStored has lora_name
# and the defaulted extra_keys, group_idx, kv_cache_spec_*): maps, tag field "type",
# the class name as its value, fields at their default left out.
MAP = bytes.fromhex(
    "83a27473cb3ff8000000000000a66576656e74739388a474797065ab426c6f636b53746f726564ac626c"
    "6f636b5f686173686573920102b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473"
    "940708090aaa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f7261"
    "5f6e616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739101a66d"
    "656469756da347505581a474797065b0416c6c426c6f636b73436c6561726564b2646174615f70617261"
    "6c6c656c5f72616e6b00"
)
# MAP_BYTES: the map encoding with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES unset, so the hashes
# are sha256_cbor digests (see vllm_block_hash below) of blocks (7, 8) and (9, 10):
#   ts=2.0, events=[BlockStored(block_hashes=[h1, h2], parent_block_hash=None,
#     token_ids=[7, 8, 9, 10], block_size=2, lora_id=None, medium="GPU", lora_name=None),
#     BlockRemoved(block_hashes=[h2], medium="GPU")], data_parallel_rank=0
MAP_BYTES = bytes.fromhex(
    "83a27473cb4000000000000000a66576656e74739288a474797065ab426c6f636b53746f726564ac626c"
    "6f636b5f68617368657392c420e5e92c0da820b9cddfd77dc59ac5c9993a61499f1a66183a6fa0f84b7a"
    "fbd1bbc420d80acf739d42b721944bf50d4ffd68a6ae0fedacf80a53c64f861da71fb3afdbb170617265"
    "6e745f626c6f636b5f68617368c0a9746f6b656e5f696473940708090aaa626c6f636b5f73697a6502a7"
    "6c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac426c6f636b"
    "52656d6f766564ac626c6f636b5f68617368657391c420d80acf739d42b721944bf50d4ffd68a6ae0fed"
    "acf80a53c64f861da71fb3afdba66d656469756da3475055b2646174615f706172616c6c656c5f72616e"
    "6b00"
)
# The int form vLLM itself sends for h1 and h2 (maybe_convert_block_hash: the low 64 bits).
H1_INT = 8043701937553265083
H2_INT = 5730300179504148443

EXPECTED = Batch(
    ts=1.5,
    events=(
        BlockStored(hashes=(1, 2), parent=None, block_size=2, medium="GPU"),
        BlockRemoved(hashes=(1,), medium="GPU"),
        AllBlocksCleared(),
    ),
    data_parallel_rank=0,
)


def sha256_cbor(value: object) -> bytes:
    """vLLM's sha256_cbor (vllm/utils/hashing.py)."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def vllm_block_hash(parent: bytes | None, tokens: tuple[int, ...]) -> bytes:
    """vLLM's hash_block_tokens with sha256_cbor and PYTHONHASHSEED=HASH_SEED."""
    none_hash = sha256_cbor(HASH_SEED)
    return sha256_cbor((parent or none_hash, tokens, None))


# Decoding


@pytest.mark.parametrize("payload", [ARRAY, MAP], ids=["array", "map"])
def test_both_encodings_decode_to_the_same_batch(payload: bytes) -> None:
    assert decode_batch(payload) == EXPECTED


@pytest.mark.parametrize(
    ("encoding", "reference"), [("array", ARRAY), ("map", MAP)], ids=["array", "map"]
)
def test_the_fake_writes_the_bytes_vllm_writes(encoding: str, reference: bytes) -> None:
    events: list[FakeEvent] = [
        Stored([1, 2], token_ids=[7, 8, 9, 10], block_size=2),
        Removed([1]),
        Cleared(),
    ]
    assert encode_batch(events, "array" if encoding == "array" else "map", ts=1.5) == reference


def test_digest_hashes_become_the_ints_vllm_sends_under_int_block_hashes() -> None:
    h1 = vllm_block_hash(None, (7, 8))
    h2 = vllm_block_hash(h1, (9, 10))
    assert h1 in MAP_BYTES and h2 in MAP_BYTES  # the reference holds these very digests
    batch = decode_batch(MAP_BYTES)
    assert batch.events == (
        BlockStored(hashes=(H1_INT, H2_INT), parent=None, block_size=2, medium="GPU"),
        BlockRemoved(hashes=(H2_INT,), medium="GPU"),
    )
    ints = encode_batch([Stored([H1_INT, H2_INT], parent=H1_INT)], "map")
    digests = encode_batch([Stored([h1, h2], parent=h1)], "map")
    assert decode_batch(ints).events == decode_batch(digests).events


def test_the_oldest_array_encoding_has_no_medium_and_counts_as_gpu() -> None:
    # vLLM 0.9: BlockStored ended at lora_id, BlockRemoved at block_hashes, no dp rank.
    payload = msgpack.packb(
        [3.0, [["BlockStored", [5], None, [1, 2], 2, None], ["BlockRemoved", [6]]]]
    )
    batch = decode_batch(payload)
    assert batch == Batch(
        3.0,
        (BlockStored((5,), None, 2, None), BlockRemoved((6,), None)),
        None,
    )
    blocks = BlockSet()
    blocks.apply(batch)
    assert blocks.hashes() == {5}


def test_unknown_fields_and_event_types_are_skipped() -> None:
    payload = msgpack.packb(
        {
            "ts": 1.0,
            "events": [
                {"type": "BlockAccessed", "block_hashes": [9], "request_id": "r"},
                {
                    "type": "BlockStored",
                    "block_hashes": [3],
                    "parent_block_hash": 2,
                    "token_ids": [1, 2],
                    "block_size": 2,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": "x",
                    "extra_keys": [["mm", 0]],
                    "group_idx": 1,
                    "kv_cache_spec_kind": "full_attention",
                    "something_new": {"a": 1},
                },
                ["BlockRemoved", [4], "GPU", 0, "later field"],
                ["SomethingElse", 1, 2],
            ],
            "data_parallel_rank": 1,
            "new_batch_field": True,
        }
    )
    assert decode_batch(payload) == Batch(
        1.0, (BlockStored((3,), 2, 2, "GPU"), BlockRemoved((4,), "GPU")), 1
    )


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used in msgpack
        msgpack.packb(5),
        msgpack.packb({"ts": 1.0}),
        msgpack.packb([1.0]),
        msgpack.packb([1.0, "events"]),
        msgpack.packb(["soon", []]),
        msgpack.packb([1.0, [42]]),
        msgpack.packb([1.0, [["BlockStored", "not a list"]]]),
        msgpack.packb([1.0, [["BlockStored", ["a string hash"]]]]),
        msgpack.packb([1.0, [{"type": "BlockRemoved"}]]),
        msgpack.packb([1.0, [["BlockRemoved", [1], 7]]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, [], "16"]]]),
        msgpack.packb([1.0, [], "rank"]),
    ],
)
def test_malformed_payloads_raise_one_error_type(payload: bytes) -> None:
    with pytest.raises(KvEventError):
        decode_batch(payload)


# BlockSet


def stored(*hashes: int, medium: str | None = "GPU", size: int = 16) -> Batch:
    return Batch(0.0, (BlockStored(hashes, None, size, medium),))


def removed(*hashes: int, medium: str | None = "GPU") -> Batch:
    return Batch(0.0, (BlockRemoved(hashes, medium),))


def changes(added: set[int], removed: set[int], reset: bool, size: int | None) -> BlockChanges:
    return BlockChanges(frozenset(added), frozenset(removed), reset, size)


def test_block_set_gives_the_net_change_since_the_last_take() -> None:
    blocks = BlockSet()
    assert blocks.take_changes().empty and blocks.block_size is None
    blocks.apply(stored(1, 2, size=32))
    assert blocks.take_changes() == changes({1, 2}, set(), False, 32)
    blocks.apply(stored(3))  # stored and evicted between takes: never seen
    blocks.apply(removed(3))
    blocks.apply(removed(1))
    blocks.apply(removed(2))  # evicted and stored again between takes: unchanged
    blocks.apply(stored(2))
    assert blocks.take_changes() == changes(set(), {1}, False, 16)
    assert blocks.take_changes().empty
    assert blocks.hashes() == {2} and len(blocks) == 1 and 2 in blocks


def test_a_hash_stored_twice_is_held_until_removed_twice() -> None:
    # vLLM does not de-duplicate identical blocks: each copy is stored and evicted.
    blocks = BlockSet()
    blocks.apply(stored(7))
    blocks.apply(stored(7))
    blocks.take_changes()
    blocks.apply(removed(7))
    assert 7 in blocks and blocks.take_changes().empty
    blocks.apply(removed(7))
    assert blocks.take_changes() == changes(set(), {7}, False, 16)
    blocks.apply(removed(7))  # one more than stored (its store came before a reset)
    blocks.apply(removed(8))
    assert blocks.take_changes().empty and len(blocks) == 0


def test_only_gpu_blocks_count() -> None:
    blocks = BlockSet()
    blocks.apply(stored(1, medium="CPU"))
    blocks.apply(stored(2, medium=None))
    blocks.apply(stored(3, medium="gpu"))
    blocks.apply(removed(2, medium="CPU"))  # the CPU copy going leaves the GPU one
    assert blocks.hashes() == {2, 3}


def test_clear_and_reset_tell_the_receiver_to_drop_all() -> None:
    blocks = BlockSet()
    blocks.apply(stored(1, 2))
    blocks.take_changes()
    blocks.apply(Batch(0.0, (AllBlocksCleared(),)))
    assert blocks.take_changes() == changes(set(), set(), True, 16)
    blocks.apply(stored(3, 4))
    blocks.reset()
    blocks.apply(stored(5, 6))
    blocks.apply(removed(6))
    assert blocks.take_changes() == changes({5}, set(), True, 16)
    assert blocks.take_changes().empty


def test_full_is_the_whole_set_and_covers_what_was_not_taken() -> None:
    blocks = BlockSet()
    blocks.apply(stored(1, 2))
    blocks.take_changes()
    blocks.apply(removed(1))
    blocks.apply(stored(3))
    assert blocks.full() == changes({2, 3}, set(), True, 16)
    assert blocks.take_changes().empty
    blocks.apply(removed(2))
    assert blocks.take_changes() == changes(set(), {2}, False, 16)


# How vLLM is started


def test_vllm_flags_name_vllms_own_config_fields() -> None:
    flags = vllm_flags(5557, 5558)
    assert flags[0] == "--kv-events-config"
    assert json.loads(flags[1]) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:5557",
        "replay_endpoint": "tcp://127.0.0.1:5558",
        "topic": "kv",
    }
    assert flags[2:] == ["--prefix-caching-hash-algo", "sha256_cbor", "--enable-prefix-caching"]
    # No "*" in the endpoint: vLLM connects to us rather than binding a port of its own.
    assert "*" not in flags[1] and "::" not in flags[1]
    assert VLLM_ENV == {"PYTHONHASHSEED": HASH_SEED, "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1"}


# The subscriber against a fake vLLM


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class Rig:
    def __init__(self, sub: KvSubscriber, fake: FakeVllm) -> None:
        self.sub = sub
        self.fake = fake
        self.blocks = sub.blocks

    async def applied(self, count: int) -> None:
        await until(lambda: self.sub.batches >= count, f"{count} batches applied")
        assert self.sub.batches == count


async def rig(encoding: str = "map", *, replay_timeout: float = 5.0, replay: bool = True) -> Rig:
    port, replay_port = free_port(), free_port()
    sub = KvSubscriber(port, replay_port, BlockSet(), replay_timeout=replay_timeout)
    sub.start()
    fake = FakeVllm(
        port,
        replay_port if replay else None,
        encoding="array" if encoding == "array" else "map",
    )
    try:
        await fake.start()
        await asyncio.wait_for(fake.subscribed.wait(), 10)
    except BaseException:  # nothing left open for a later test's garbage collection
        await fake.close()
        await sub.close()
        raise
    return Rig(sub, fake)


@pytest.fixture(params=["array", "map"])
async def wired(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    r = await rig(request.param)
    yield r
    await r.fake.close()
    await r.sub.close()


async def test_stores_removes_and_clears_reach_the_block_set(wired: Rig) -> None:
    await wired.fake.publish(Stored([1, 2, 3], token_ids=list(range(48))))
    await wired.fake.publish(Removed([2]), Stored([4], parent=3))
    await wired.applied(2)
    assert wired.blocks.hashes() == {1, 3, 4}
    assert wired.blocks.take_changes() == changes({1, 3, 4}, set(), False, 16)
    await wired.fake.publish(Cleared(), Stored([9]))
    await wired.applied(3)
    assert wired.blocks.take_changes() == changes({9}, set(), True, 16)
    assert wired.sub.last_seq == 2
    assert (wired.sub.gaps_recovered, wired.sub.resets, wired.fake.replays_served) == (0, 0, 0)


async def test_a_gap_is_filled_from_the_replay_in_order(wired: Rig) -> None:
    fake, sub = wired.fake, wired.sub
    await fake.publish(Stored([1]))
    await fake.publish(Stored([2]), skip=True)
    await fake.publish(Removed([1]), skip=True)  # must come after the store of 1
    await fake.publish(Stored([3]))
    await until(lambda: sub.gaps_recovered == 1, "the gap recovered")
    await fake.publish(Stored([4]))
    await wired.applied(5)
    assert wired.blocks.hashes() == {2, 3, 4}
    assert sub.last_seq == 4 and sub.resets == 0 and fake.replays_served == 1
    assert sub.duplicates == 1  # batch 3 came in the replay and then live
    assert not wired.blocks.take_changes().reset


async def test_a_gap_the_replay_cannot_cover_resets_the_set(wired: Rig) -> None:
    fake, sub = wired.fake, wired.sub
    await fake.publish(Stored([1]))
    await wired.applied(1)
    wired.blocks.take_changes()
    await fake.publish(Removed([1]), skip=True)
    fake.drop_buffer()
    await fake.publish(Stored([2]))
    await wired.applied(2)
    assert sub.resets == 1 and sub.gaps_recovered == 0 and fake.replays_served == 1
    assert wired.blocks.take_changes() == changes({2}, set(), True, 16)
    await fake.publish(Stored([3]))
    await wired.applied(3)
    assert wired.blocks.hashes() == {2, 3} and sub.resets == 1


async def test_a_sequence_that_goes_back_is_a_new_vllm(wired: Rig) -> None:
    fake, sub = wired.fake, wired.sub
    for h in (1, 2, 3):
        await fake.publish(Stored([h]))
    await wired.applied(3)
    wired.blocks.take_changes()
    fake.restart()
    assert await fake.publish(Stored([7])) == 0
    await wired.applied(4)
    assert sub.resets == 1 and sub.last_seq == 0
    assert wired.blocks.take_changes() == changes({7}, set(), True, 16)


async def test_a_replay_that_never_answers_resets_the_set() -> None:
    r = await rig(replay=False, replay_timeout=0.2)
    try:
        await r.fake.publish(Stored([1]))
        await r.fake.publish(Stored([2]), skip=True)
        await r.fake.publish(Stored([3]))
        await r.applied(2)
        assert r.sub.resets == 1 and r.sub.gaps_recovered == 0
        assert r.blocks.take_changes() == changes({3}, set(), True, 16)
    finally:
        await r.fake.close()
        await r.sub.close()


async def test_a_late_replay_answer_is_not_taken_for_the_next_one() -> None:
    r = await rig(replay_timeout=0.3)
    fake, sub = r.fake, r.sub
    try:
        fake.replay_gate = asyncio.Event()
        await fake.publish(Stored([1]))
        await fake.publish(Stored([2]), skip=True)
        await fake.publish(Stored([3]))
        await r.applied(2)
        assert sub.resets == 1  # the replay did not answer in time
        fake.replay_gate.set()  # now it answers the request the subscriber gave up on
        await until(lambda: fake.replays_served == 1, "the late answer sent")
        fake.replay_gate = None
        await fake.publish(Stored([4]), skip=True)
        await fake.publish(Stored([5]))
        await r.applied(4)
        assert sub.gaps_recovered == 1 and sub.resets == 1
        assert r.blocks.hashes() == {3, 4, 5}
    finally:
        await fake.close()
        await sub.close()


async def test_a_late_subscriber_gets_the_engines_history_from_the_replay() -> None:
    # An agent restarted beside a running vLLM: its first batch seen is not batch 0.
    port, replay_port = free_port(), free_port()
    async with FakeVllm(port, replay_port) as fake:
        await fake.publish(Stored([1, 2]), skip=True)
        await fake.publish(Removed([2]), skip=True)
        sub = KvSubscriber(port, replay_port, BlockSet())
        sub.start()
        try:
            await asyncio.wait_for(fake.subscribed.wait(), 10)
            await fake.publish(Stored([3]))
            await until(lambda: sub.batches == 3, "3 batches applied")
            assert sub.blocks.hashes() == {1, 3}
            assert sub.gaps_recovered == 1 and sub.resets == 0
        finally:
            await sub.close()


async def test_an_unreadable_batch_resets_and_reading_goes_on(wired: Rig) -> None:
    await wired.fake.publish(Stored([1]))
    await wired.fake.publish_payload(b"\xc1")
    await wired.fake.publish(Stored([2]))
    await until(lambda: wired.sub.batches == 2, "2 batches applied")
    assert wired.sub.malformed == 1 and wired.sub.resets == 1
    assert wired.blocks.hashes() == {2} and wired.sub.last_seq == 2


async def test_reset_forgets_the_engine_for_its_replacement(wired: Rig) -> None:
    # What the supervisor does when it starts a new engine: the new engine's batch 2
    # follows the old one's batch 1, so the sequence alone could not tell.
    for h in (1, 2):
        await wired.fake.publish(Stored([h]))
    await wired.applied(2)
    wired.sub.reset("engine restarted")
    wired.fake.restart()
    for h in (3, 4):
        await wired.fake.publish(Stored([h]), skip=True)
    await wired.fake.publish(Stored([5]))
    await wired.applied(5)
    assert wired.blocks.hashes() == {3, 4, 5}
    assert wired.sub.resets == 1 and wired.sub.gaps_recovered == 1


async def test_run_reads_until_stopped_and_frees_the_port() -> None:
    port = free_port()
    blocks = BlockSet()
    stop = asyncio.Event()
    sub = KvSubscriber(port, None, blocks)
    running = asyncio.create_task(sub.run(stop))
    async with FakeVllm(port, None) as fake:
        await asyncio.wait_for(fake.subscribed.wait(), 10)
        await fake.publish(Stored([1]))
        await until(lambda: 1 in blocks, "block 1 stored")
        assert sub.changed.is_set()
        stop.set()
        await asyncio.wait_for(running, 10)
    # run closed its socket; ZeroMQ lets go of the port in its own thread, soon after.
    again = KvSubscriber(port, None, BlockSet())

    def binds() -> bool:
        try:
            again.start()
        except zmq.ZMQError:
            return False
        return True

    await until(binds, "the port bound again")
    await again.close()


async def test_start_fails_when_the_port_is_taken() -> None:
    port = free_port()
    first = KvSubscriber(port, None, BlockSet())
    first.start()
    try:
        with pytest.raises(zmq.ZMQError):
            KvSubscriber(port, None, BlockSet()).start()
    finally:
        await first.close()
