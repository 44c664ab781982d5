"""vLLM's KV-cache events as the agent reads them: which prefix blocks a replica holds.

vLLM, started with `vllm_flags` and `VLLM_ENV`, publishes one batch of events per engine
step from its ZmqEventPublisher (vllm/distributed/kv_events.py). Its endpoint has no "*",
so vLLM *connects* its PUB socket and our SUB socket binds 127.0.0.1:port; its replay
endpoint is a ROUTER that vLLM always binds, and we connect a DEALER to it.

The wire, as vLLM sends it:

- live: (topic, sequence as 8 bytes big-endian, payload); the sequence counts from 0 in
  each vLLM process, one step per batch.
- replay: we send (b"", start as 8 bytes); vLLM answers (b"", seq, payload) for each
  batch it still buffers (10,000 by default) with seq >= start, then (b"", -1 as a
  signed 8-byte integer, b"").
- payload: a msgspec-encoded KVEventBatch. Up to mid-2025 both batch and events were
  `array_like` (`[ts, [events], dp_rank]`, events `["BlockStored", hashes, parent,
  token_ids, block_size, lora_id, medium, ...]`); later releases encode maps
  (`{"ts", "events", "data_parallel_rank"}`, events tagged by `"type"`, fields left out
  when at their default). `decode_batch` reads either and any mix of them; fields and
  event types it does not know are skipped.
- block hashes: ints (the low 64 bits, under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) or the
  raw 32-byte digests; both are normalised to the same 64-bit int.

The sequence rules of `KvSubscriber`, in order, for each live batch:

1. a sequence at or below the last one seen *live* means a new vLLM process (the live
   stream never goes back): reset, and start over as if nothing had been seen (the
   supervisor calls `KvSubscriber.reset` too when it replaces the engine, for a new
   process first seen past the old one's last sequence);
2. at or below the last one applied (a batch already had through a replay): skipped;
3. the next one expected (0 when nothing was applied yet): applied;
4. past it: the missing batches are asked of the replay socket and applied in order; if
   the replay cannot cover them all (its first batch is past the one asked for, it has
   a hole, or it does not answer within `replay_timeout`), reset and go on from this one.

A reset empties the BlockSet and marks it, so the next change sent tells the control
plane to drop what it knew of this replica. So does a payload that cannot be decoded:
its events are lost. Events are routing hints: a wrong one can misroute a request to a
colder cache, never give a wrong answer; any local process can reach a loopback port.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

import msgpack
import zmq
import zmq.asyncio

from llmgw.wire.messages import KV_HASH_SEED

log = logging.getLogger("llmgw.agent.kvevents")

# vLLM seeds the first block's parent hash with sha256_cbor(PYTHONHASHSEED) (the string
# itself): a fixed seed makes its block hashes ones the router can compute too, so the
# value lives in the wire package, which the router reads as well.
HASH_SEED = KV_HASH_SEED
VLLM_ENV: dict[str, str] = {
    "PYTHONHASHSEED": HASH_SEED,
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1",
}
TOPIC = "kv"
HASH_ALGO = "sha256_cbor"
# vLLM's own name for the GPU prefix cache; offloading connectors report "CPU" and such.
MEDIUM_GPU = "GPU"
REPLAY_TIMEOUT = 1.0
# A step's batch is small (a 128k-token prompt is about 1 MB of token ids); the cap only
# keeps a stray local sender from making the agent buffer gigabytes.
MAX_MESSAGE = 64 << 20

_MASK64 = (1 << 64) - 1
_END_OF_REPLAY = -1
# The positional fields of the array_like encoding, after the tag, in vLLM's order.
_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def vllm_flags(port: int, replay_port: int) -> list[str]:
    """vLLM's command-line flags to publish its KV events to a `KvSubscriber` on `port`.

    With data parallelism vLLM adds each rank's number to both ports, so rank r would
    publish on port + r and replay on replay_port + r.
    """
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
        "topic": TOPIC,
    }
    return [
        "--kv-events-config",
        json.dumps(config, separators=(",", ":")),
        "--prefix-caching-hash-algo",
        HASH_ALGO,
        "--enable-prefix-caching",
    ]


class KvEventError(ValueError):
    """A payload that is not a KVEventBatch vLLM could have sent."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    hashes: tuple[int, ...]
    parent: int | None
    block_size: int | None
    medium: str | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    hashes: tuple[int, ...]
    medium: str | None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class Batch:
    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


def block_hash(value: object) -> int:
    """vLLM's ExternalBlockHash as a 64-bit int: a digest's low 64 bits, as vLLM itself
    cuts them under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES."""
    if isinstance(value, bytes):
        return int.from_bytes(value, "big") & _MASK64
    if isinstance(value, int) and not isinstance(value, bool):
        return value & _MASK64
    raise KvEventError(f"a block hash is {type(value).__name__}, not int or bytes")


def _hashes(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise KvEventError(f"block_hashes is {type(value).__name__}, not a list")
    return tuple(block_hash(item) for item in value)


def _int(fields: dict[object, object], name: str) -> int | None:
    value = fields.get(name)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise KvEventError(f"{name} is {type(value).__name__}, not int")


def _str(fields: dict[object, object], name: str) -> str | None:
    value = fields.get(name)
    if value is None or isinstance(value, str):
        return value
    raise KvEventError(f"{name} is {type(value).__name__}, not str")


def _event(raw: object) -> Event | None:
    """One event, or None for a type this agent does not know."""
    fields: dict[object, object]
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag = raw[0]
        fields = dict(zip(_FIELDS.get(tag, ()), raw[1:], strict=False))
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        tag = raw["type"]
        fields = raw
    else:
        raise KvEventError(f"an event is neither a tagged array nor a tagged map: {raw!r:.80}")
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if tag not in _FIELDS:
        return None
    if "block_hashes" not in fields:
        raise KvEventError(f"{tag} has no block_hashes")
    hashes = _hashes(fields["block_hashes"])
    medium = _str(fields, "medium")
    if tag == "BlockRemoved":
        return BlockRemoved(hashes, medium)
    parent = fields.get("parent_block_hash")
    parent_hash = None if parent is None else block_hash(parent)
    return BlockStored(hashes, parent_hash, _int(fields, "block_size"), medium)


def decode_batch(payload: bytes) -> Batch:
    """A KVEventBatch from vLLM's msgpack payload, in either encoding; KvEventError if
    it is not one."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise KvEventError(f"payload is not msgpack: {exc}") from exc
    if isinstance(raw, list) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    elif isinstance(raw, dict) and "events" in raw:
        ts, events, rank = raw.get("ts"), raw["events"], raw.get("data_parallel_rank")
    else:
        raise KvEventError(f"payload is not a KVEventBatch: {raw!r:.80}")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise KvEventError(f"ts is {type(ts).__name__}, not a number")
    if not isinstance(events, list):
        raise KvEventError(f"events is {type(events).__name__}, not a list")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise KvEventError(f"data_parallel_rank is {type(rank).__name__}, not int")
    decoded = (_event(item) for item in events)
    return Batch(float(ts), tuple(e for e in decoded if e is not None), rank)


@dataclass(frozen=True, slots=True)
class BlockChanges:
    """What changed in a BlockSet since the last take. With `reset`, the receiver drops
    all it knew of the replica and takes `added` as the whole set."""

    added: frozenset[int]
    removed: frozenset[int]
    reset: bool
    block_size: int | None

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.reset)


def _gpu(medium: str | None) -> bool:
    # Blocks offloaded to CPU or elsewhere are not in the GPU prefix cache a request hits.
    return medium is None or medium.upper() == MEDIUM_GPU


class BlockSet:
    """The blocks one replica's engine holds in its GPU prefix cache, and their net change.

    vLLM does not de-duplicate: two requests that fill identical blocks each store one
    and each eviction removes one, so a hash is held while more were stored than removed.
    Removing a hash never stored (its store came before a reset) is ignored.
    """

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._added: set[int] = set()
        self._removed: set[int] = set()
        self._reset = False
        self.block_size: int | None = None

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, block: object) -> bool:
        return block in self._counts

    def hashes(self) -> frozenset[int]:
        return frozenset(self._counts)

    def apply(self, batch: Batch) -> None:
        for event in batch.events:
            self.apply_event(event)

    def apply_event(self, event: Event) -> None:
        if isinstance(event, AllBlocksCleared):
            self.reset()
        elif not _gpu(event.medium):
            return
        elif isinstance(event, BlockStored):
            if event.block_size is not None:
                self.block_size = event.block_size
            for h in event.hashes:
                self._store(h)
        else:
            for h in event.hashes:
                self._remove(h)

    def reset(self) -> None:
        """Forget every block; the next take tells the receiver to forget them too."""
        self._counts.clear()
        self._added.clear()
        self._removed.clear()
        self._reset = True

    def take_changes(self) -> BlockChanges:
        """The net change since the last take (or `full`), and start counting anew."""
        changes = BlockChanges(
            frozenset(self._added), frozenset(self._removed), self._reset, self.block_size
        )
        self._added.clear()
        self._removed.clear()
        self._reset = False
        return changes

    def full(self) -> BlockChanges:
        """The whole set as a reset, for a receiver that knows nothing yet; it covers the
        changes not taken, so the next take starts from here."""
        self._added.clear()
        self._removed.clear()
        self._reset = False
        return BlockChanges(frozenset(self._counts), frozenset(), True, self.block_size)

    def _store(self, h: int) -> None:
        held = self._counts.get(h, 0)
        self._counts[h] = held + 1
        if held == 0:
            if h in self._removed:
                self._removed.discard(h)
            else:
                self._added.add(h)

    def _remove(self, h: int) -> None:
        held = self._counts.get(h)
        if held is None:
            return
        if held > 1:
            self._counts[h] = held - 1
            return
        del self._counts[h]
        if h in self._added:
            self._added.discard(h)
        else:
            self._removed.add(h)


class KvSubscriber:
    """Reads one vLLM process's KV events into a BlockSet (see the module docstring for
    the sequence rules). `changed` is set after every batch applied and every reset."""

    def __init__(
        self,
        port: int,
        replay_port: int | None,
        blocks: BlockSet,
        *,
        replay_timeout: float = REPLAY_TIMEOUT,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.port = port
        self.replay_port = replay_port
        self.blocks = blocks
        self.replay_timeout = replay_timeout
        self.changed = asyncio.Event()
        self.batches = 0
        self.gaps_recovered = 0
        self.resets = 0
        self.duplicates = 0
        self.malformed = 0
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sub: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._last: int | None = None  # the last sequence applied
        self._last_live: int | None = None  # the last sequence read off the live socket

    @property
    def last_seq(self) -> int | None:
        return self._last

    def start(self) -> None:
        """Bind the live socket (raises zmq.ZMQError if the port is taken) and read."""
        if self._task is not None:
            raise RuntimeError("KvSubscriber already started")
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            sub.bind(f"tcp://127.0.0.1:{self.port}")
        except zmq.ZMQError:
            sub.close()
            raise
        self._sub = sub
        self._task = asyncio.get_running_loop().create_task(self._read(sub))

    async def close(self) -> None:
        """Stop reading and close the sockets. ZeroMQ lets go of the port in its own
        thread a moment later: across an engine restart keep the subscriber and call
        `reset` rather than bind the port anew."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled() and task.exception() is not None:
                log.error(
                    "KV events on port %d: reading ended", self.port, exc_info=task.exception()
                )
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        self._drop_dealer()

    async def run(self, stop: asyncio.Event) -> None:
        """Read until `stop` is set; raises what ended the reading if it ended first."""
        self.start()
        task = self._task
        assert task is not None
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            ended = task.done()
            self._task = None if ended else task
            await self.close()
        if ended:
            task.result()

    def reset(self, reason: str) -> None:
        """Forget the engine's sequence and its blocks, for an engine that was replaced:
        its next batch starts a stream of its own."""
        self._lose(reason)
        self._last = None
        self._last_live = None

    def _lose(self, reason: str) -> None:
        log.warning("KV events on port %d: reset: %s", self.port, reason)
        self.resets += 1
        self.blocks.reset()
        self.changed.set()

    async def _read(self, sub: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sub.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                self.malformed += 1
                log.warning("KV events on port %d: a message of %d frames", self.port, len(frames))
                continue
            await self._live(int.from_bytes(frames[1], "big"), frames[2])

    async def _live(self, seq: int, payload: bytes) -> None:
        if self._last_live is not None and seq <= self._last_live:
            self.reset(f"sequence went back from {self._last_live} to {seq}: a new vLLM")
        self._last_live = seq
        expected = 0 if self._last is None else self._last + 1
        if seq > expected:
            await self._recover(expected, seq)
        if self._last is not None and seq <= self._last:
            self.duplicates += 1
            return
        self._apply(seq, payload)

    async def _recover(self, start: int, seq: int) -> None:
        """Apply start..seq-1 (and any later) from the replay socket, or reset so that
        `seq` applies next."""
        replayed = await self._replay(start)
        lost = "the replay did not answer" if replayed is None else None
        for replay_seq, payload in replayed or ():
            if replay_seq != start:
                lost = f"the replay has no batch {start}"
                break
            self._apply(replay_seq, payload)
            start += 1
        if lost is None and start < seq:
            lost = f"the replay ended before batch {start}"
        if lost is None:
            self.gaps_recovered += 1
            return
        self._lose(f"batches before {seq} lost: {lost}")
        self._last = seq - 1

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """What vLLM still buffers from `start` on, or None if it did not answer."""
        if self.replay_port is None:
            return None
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
            self._dealer.connect(f"tcp://127.0.0.1:{self.replay_port}")
        dealer = self._dealer
        found: list[tuple[int, bytes]] = []
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
            # lands as its inner call finishes, and close() must end the reading.
            async with asyncio.timeout(self.replay_timeout):
                await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                async with asyncio.timeout(self.replay_timeout):
                    frames = await dealer.recv_multipart()
                if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != 8:
                    raise KvEventError(f"a replay answer of {len(frames)} frames")
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq == _END_OF_REPLAY:
                    return found
                found.append((seq, frames[2]))
        except (TimeoutError, KvEventError) as exc:
            # A late answer must not be read as the answer to the next request.
            log.warning("KV events on port %d: replay from %d failed: %r", self.port, start, exc)
            self._drop_dealer()
            return None

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except KvEventError as exc:
            self.malformed += 1
            self._lose(f"batch {seq} cannot be read: {exc}")
        else:
            self.blocks.apply(batch)
            self.batches += 1
        self._last = seq
        self.changed.set()

    def _drop_dealer(self) -> None:
        if self._dealer is not None:
            self._dealer.close()
            self._dealer = None
