"""The KV caches of this node's vLLM replicas that route by them, sent up the stream.

For a shard with ``kv_events`` the supervisor asks ``prepare`` before it starts vLLM:
two loopback ports are picked (vLLM's publisher connects to the first, where our
subscriber listens; it binds its replay socket on the second), kept on disk beside the
shard's own file, and the subscriber starts listening before vLLM is. An adopted shard
gets its subscriber again on the same ports (``adopt``): vLLM's publisher reconnects by
itself, and the batches it sent meanwhile come back through its replay socket.

Every ``EVERY`` seconds the net change of each replica's blocks goes up as one
``KvBlocks``; on every new stream (``attach``) each replica's whole set goes as a reset,
since a control plane that just took the stream knows nothing of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq

from llmgw.agent.kvevents import VLLM_ENV, BlockChanges, BlockSet, KvSubscriber, vllm_flags
from llmgw.wire.messages import KvBlocks, Message, ShardSpec

log = logging.getLogger("llmgw.agent.kv")

# How often the replicas' net changes go up the stream.
EVERY = 0.25
# Hashes per message: a first copy of a large cache goes in several.
CHUNK = 50_000


def wants_events(spec: ShardSpec) -> bool:
    """Whether this shard's engine publishes KV events for the router (vLLM, asked)."""
    return spec.kv_events and spec.engine == "vllm" and (spec.group is None or spec.group.rank == 0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Watched:
    port: int
    replay_port: int
    blocks: BlockSet
    subscriber: KvSubscriber


class CacheWatch:
    def __init__(self, root: Path, emit: Callable[[Message], None]) -> None:
        self.root = root
        self.emit = emit
        self.watched: dict[str, Watched] = {}
        self._task: asyncio.Task[None] | None = None

    def _path(self, replica_id: str) -> Path:
        return self.root / f"{replica_id}.kv.json"

    # --- a shard's life ---------------------------------------------------------------

    async def prepare(self, replica_id: str) -> tuple[list[str], dict[str, str]]:
        """Listen for a new vLLM's events; its extra flags and environment."""
        await self.drop(replica_id)
        for _ in range(5):
            port, replay = free_port(), free_port()
            if port == replay:
                continue
            try:
                self._watch(replica_id, port, replay)
            except zmq.ZMQError as exc:  # taken between the pick and the bind
                log.debug("KV events port %d: %s; picking another", port, exc)
                continue
            self.root.mkdir(parents=True, exist_ok=True)
            self._path(replica_id).write_text(json.dumps({"port": port, "replay": replay}))
            return vllm_flags(port, replay), dict(VLLM_ENV)
        raise OSError("no free loopback port for vLLM's KV events after 5 tries")

    def adopt(self, replica_id: str) -> bool:
        """Listen again on an adopted shard's ports; False when none were kept."""
        try:
            kept = json.loads(self._path(replica_id).read_text())
            port, replay = int(kept["port"]), int(kept["replay"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        try:
            self._watch(replica_id, port, replay)
        except zmq.ZMQError as exc:
            log.warning("cannot listen for %s's KV events on %d again: %s", replica_id, port, exc)
            return False
        return True

    def _watch(self, replica_id: str, port: int, replay: int) -> None:
        blocks = BlockSet()
        subscriber = KvSubscriber(port, replay, blocks)
        subscriber.start()
        self.watched[replica_id] = Watched(port, replay, blocks, subscriber)
        self._ensure_running()

    async def drop(self, replica_id: str) -> None:
        """The shard is gone: stop listening and forget its ports."""
        watched = self.watched.pop(replica_id, None)
        if watched is not None:
            await watched.subscriber.close()
        with contextlib.suppress(FileNotFoundError):
            self._path(replica_id).unlink()

    # --- sending ----------------------------------------------------------------------

    def attach(self) -> None:
        """A new stream: every replica's whole set, as a reset."""
        for rid, watched in self.watched.items():
            self._send(rid, watched.blocks.full())

    def flush(self) -> None:
        """Each replica's net change since the last flush, if any."""
        for rid, watched in self.watched.items():
            changes = watched.blocks.take_changes()
            if not changes.empty:
                self._send(rid, changes)

    def _send(self, replica_id: str, changes: BlockChanges) -> None:
        size = changes.block_size or 0
        added, removed = sorted(changes.added), sorted(changes.removed)
        first = True
        while first or added or removed:
            self.emit(
                KvBlocks(
                    replica_id,
                    size,
                    added=added[:CHUNK],
                    removed=removed[:CHUNK],
                    reset=changes.reset and first,
                )
            )
            added, removed, first = added[CHUNK:], removed[CHUNK:], False

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(EVERY)
            try:
                self.flush()
            except Exception:
                log.exception("sending KV-cache changes failed; will try again")

    async def close(self) -> None:
        """The agent is going: stop listening (vLLM keeps running, and publishing)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for watched in self.watched.values():
            await watched.subscriber.close()
        self.watched.clear()
