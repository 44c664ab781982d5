"""A fake vLLM KV-event publisher: vLLM's ZmqEventPublisher on the wire, without vLLM.

Like vLLM started with `llmgw.agent.kvevents.vllm_flags`, it connects its publishing
socket to the agent's port and binds a ROUTER on the replay port that answers from a
buffer of past batches, frame for frame as vllm/distributed/kv_events.py does. Payloads
are msgpack bytes identical to what msgspec writes for vLLM's KVEventBatch, in the
encoding chosen per instance:

- "array": the array_like structs of mid-2025 vLLM: `[ts, [events], dp_rank]`, events
  `["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]`,
  `["BlockRemoved", hashes, medium]`, `["AllBlocksCleared"]`;
- "map": the tagged maps of later vLLM: `{"ts", "events", "data_parallel_rank"}`, events
  `{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids",
  "block_size", "lora_id", "medium", "lora_name"}` and so on (fields whose default is
  None are left out when None, as msgspec's omit_defaults does).

It publishes from an XPUB socket rather than vLLM's PUB: the same wire to a subscriber,
but it hears the subscription, so a test can wait for it (`subscribed`) instead of
losing the first batches to ZeroMQ's slow joiner.

For the failures: `publish(..., skip=True)` keeps a batch out of the live stream but in
the replay buffer (a gap the replay can cover), `drop_buffer()` empties the buffer (a
gap it cannot), `restart()` starts the sequence at 0 again (a new vLLM process), and
`replay_port=None` runs without a replay socket (a replay that never answers), and
`replay_gate` holds the answers back (a replay that answers late).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import count
from typing import Literal

import msgpack
import zmq
import zmq.asyncio

from tests.support.ports import free_port

Encoding = Literal["array", "map"]
Hash = int | bytes
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
__all__ = ["FakeVllm", "free_port"]


@dataclass(frozen=True)
class Stored:
    hashes: list[Hash]
    parent: Hash | None = None
    token_ids: list[int] = field(default_factory=list)
    block_size: int = 16
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None


@dataclass(frozen=True)
class Removed:
    hashes: list[Hash]
    medium: str | None = "GPU"


@dataclass(frozen=True)
class Cleared:
    pass


FakeEvent = Stored | Removed | Cleared


def _array(event: FakeEvent) -> list[object]:
    if isinstance(event, Stored):
        return [
            "BlockStored",
            event.hashes,
            event.parent,
            event.token_ids,
            event.block_size,
            event.lora_id,
            event.medium,
        ]
    if isinstance(event, Removed):
        return ["BlockRemoved", event.hashes, event.medium]
    return ["AllBlocksCleared"]


def _map(event: FakeEvent) -> dict[str, object]:
    if isinstance(event, Stored):
        return {
            "type": "BlockStored",
            "block_hashes": event.hashes,
            "parent_block_hash": event.parent,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
            "lora_name": event.lora_name,
        }
    if isinstance(event, Removed):
        return {"type": "BlockRemoved", "block_hashes": event.hashes, "medium": event.medium}
    return {"type": "AllBlocksCleared"}


def encode_batch(
    events: list[FakeEvent],
    encoding: Encoding,
    *,
    ts: float | None = None,
    data_parallel_rank: int | None = 0,
) -> bytes:
    """The payload vLLM's msgspec encoder writes for a KVEventBatch of these events."""
    stamp = time.time() if ts is None else float(ts)
    batch: object
    if encoding == "array":
        body: list[object] = [stamp, [_array(e) for e in events]]
        if data_parallel_rank is not None:  # omit_defaults drops a trailing None
            body.append(data_parallel_rank)
        batch = body
    else:
        fields: dict[str, object] = {"ts": stamp, "events": [_map(e) for e in events]}
        if data_parallel_rank is not None:
            fields["data_parallel_rank"] = data_parallel_rank
        batch = fields
    payload: bytes = msgpack.packb(batch, use_bin_type=True)
    return payload


class FakeVllm:
    def __init__(
        self,
        port: int,
        replay_port: int | None,
        *,
        encoding: Encoding = "map",
        topic: str = "kv",
        buffer_steps: int = 10_000,
    ) -> None:
        self.port = port
        self.replay_port = replay_port
        self.encoding: Encoding = encoding
        self.topic = topic.encode()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.replays_served = 0
        # While this is an Event not yet set, replay answers wait for it: a slow replay.
        self.replay_gate: asyncio.Event | None = None
        self.subscribed = asyncio.Event()
        self._seq = count()
        self._ctx = zmq.asyncio.Context.instance()
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        pub = self._ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(f"tcp://127.0.0.1:{self.port}")
        self._pub = pub
        self._tasks.append(asyncio.create_task(self._hear_subscriptions(pub)))
        if self.replay_port is not None:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(f"tcp://127.0.0.1:{self.replay_port}")
            self._router = router
            self._tasks.append(asyncio.create_task(self._serve_replay(router)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close()
        self._pub = self._router = None

    async def __aenter__(self) -> FakeVllm:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def publish(self, *events: FakeEvent, skip: bool = False) -> int:
        """Publish one batch (one engine step); its sequence number."""
        return await self.publish_payload(encode_batch(list(events), self.encoding), skip=skip)

    async def publish_payload(self, payload: bytes, *, skip: bool = False) -> int:
        """Publish these bytes as a batch, as vLLM would (send, then keep for replay);
        with `skip`, only keep them for replay, as if the live stream had lost them."""
        assert self._pub is not None, "FakeVllm not started"
        seq = next(self._seq)
        if not skip:
            await self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        self.buffer.append((seq, payload))
        return seq

    def drop_buffer(self) -> None:
        """Forget every batch published so far: a gap over them cannot be replayed."""
        self.buffer.clear()

    def restart(self) -> None:
        """Become a new vLLM process: sequence from 0 again, nothing to replay."""
        self._seq = count()
        self.buffer.clear()

    async def _hear_subscriptions(self, pub: zmq.asyncio.Socket) -> None:
        while True:
            message = await pub.recv()
            if message[:1] == b"\x01":
                self.subscribed.set()

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:  # vLLM logs "Invalid replay request" and answers nothing
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            if self.replay_gate is not None:
                await self.replay_gate.wait()
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await router.send_multipart([client, b"", END_OF_REPLAY, b""])
            self.replays_served += 1
