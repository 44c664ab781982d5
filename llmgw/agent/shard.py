"""One shard on this node: its record, and the checks of its engine process.

A ``Shard`` is what the supervisor keeps of one engine it runs: the spec, the process
(pid and start time), the state reported, and the tail of its output. Here too are the
questions asked of that process from outside it: is it still running, why did it exit, is
the one found after an agent restart still ours, does its port take connections, and is
the port free before it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field

import aiohttp
import psutil

from llmgw.agent.engines import EngineError, adapter
from llmgw.agent.logbook import ENGINE_LINES, LogRing
from llmgw.agent.weights import WeightsError, lora, normalise_source
from llmgw.wire.messages import Compute, ShardSpec, ShardStatus
from llmgw.wire.states import ShardState


def _normal(source: str) -> str:
    """The source in the form the weights cache records, so the control plane can match
    what a node holds against what its shards use."""
    try:
        return normalise_source(source)
    except WeightsError:
        return source


@dataclass
class Shard:
    spec: ShardSpec
    state: ShardState = ShardState.STARTING
    reason: str = ""
    pid: int | None = None
    create_time: float | None = None
    compute: Compute | None = None
    started_at: float | None = None
    ring: LogRing = field(default_factory=lambda: LogRing(ENGINE_LINES))
    task: asyncio.Task[None] | None = None
    stop_tail: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    adopted: bool = False
    process: psutil.Process | None = None
    # The engine as asyncio started it (None when adopted): what ``reaped`` waits on.
    child: asyncio.subprocess.Process | None = None
    # What it was started from (the engine binary, or its environment's interpreter).
    binary: str | None = None
    # Whether it takes images (``weights.projector.prepare``); None until its weights are.
    vision: bool | None = None
    # The log tail and the child reaper: held here so the loop does not lose them.
    helpers: list[asyncio.Task[object]] = field(default_factory=list)

    def status(self, last_lines: list[str] | None = None) -> ShardStatus:
        return ShardStatus(
            replica_id=self.spec.replica_id,
            state=self.state,
            reason=self.reason,
            fingerprint=self.spec.fingerprint,
            engine=self.spec.engine,
            source=_normal(self.spec.source),
            port=self.spec.port,
            pid=self.pid,
            compute=self.compute,
            started_at=self.started_at,
            last_lines=last_lines,
            cards=list(self.spec.cards),
            rank=self.spec.group.rank if self.spec.group else None,
            adapters=lora.reported(self.spec),
            vision=self.vision,
        )

    @property
    def worker(self) -> bool:
        """A worker (rank 1..) of a replica spanning nodes: it serves no HTTP of its own."""
        return self.spec.group is not None and self.spec.group.rank > 0

    def alive(self) -> bool:
        proc = self.process
        if proc is None:
            return False
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    async def reaped(self, within: float) -> None:
        """Once the engine this agent started has ended: until the loop has heard so, up
        to ``within`` seconds. Its pid is gone as soon as the child watcher reaps it, but
        on Python 3.11 the watcher is a thread whose word reaches the loop later; a loop
        that ends first leaves the child "still running" in asyncio's eyes, with a
        ResourceWarning when it is collected."""
        child = self.child
        if child is None or child.returncode is not None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await child.wait()

    def exit_reason(self) -> str:
        code: int | None = None
        if self.process is not None:
            with contextlib.suppress(psutil.Error, Exception):
                code = self.process.wait(timeout=0)
        return f"the engine exited (code {code})" if code is not None else "the engine exited"


async def still_ours(shard: Shard) -> bool:
    """Same process (pid and start time), on its port, answering to its key alone."""
    if shard.pid is None:
        return False
    try:
        proc = psutil.Process(shard.pid)
        if shard.create_time is not None and abs(proc.create_time() - shard.create_time) > 1:
            return False  # the pid was reused by something else
    except psutil.Error:
        return False
    shard.process = proc
    if not shard.alive():
        return False
    group = shard.spec.group
    if shard.worker and group is not None:
        probe = adapter(shard.spec.engine).worker_probe
        if probe == "tcp":
            return await accepts(group.bind or "127.0.0.1", shard.spec.port)
        if probe == "process":
            return True
        url = f"http://127.0.0.1:{shard.spec.port}/health"
        return await _answers(url)
    url = f"http://127.0.0.1:{shard.spec.port}/v1/models"
    timeout = aiohttp.ClientTimeout(total=3)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            async with http.get(url) as anon:
                refused = anon.status == 401
            headers = {"authorization": f"Bearer {shard.spec.key}"}
            async with http.get(url, headers=headers) as keyed:
                accepted = keyed.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
    return refused and accepted


async def accepts(host: str, port: int) -> bool:
    """Whether ``host:port`` takes a TCP connection now."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _answers(url: str) -> bool:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
            async with http.get(url) as resp:
                return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port``."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def port_in_use(host: str, port: int) -> None:
    """Refuse a port something else listens on: its health answers would pass for our
    engine's. The message says "address in use", which the control plane reads to
    pick another port on this host next time."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise EngineError(
                f"port {port} on this node is taken by another process (address in use: "
                f"{exc.strerror}); the control plane will pick another"
            ) from None
