"""One rail of ``llmgw ctl fabric-test A B``: ``ib_write_bw`` between one adapter of this
node and one of another, over the agents' streams. B's agent starts the server on a TCP
port (the tool's out-of-band exchange), A's agent runs the client against B's address;
the RDMA traffic itself goes over the adapters named.

The server is started and left to finish with its client (or killed once its time is up);
the client's output is parsed (``parse_ib_write_bw``) into the figure the control plane
grades against the link's rate.
"""

from __future__ import annotations

import asyncio
import logging
import shutil

from llmgw.agent.command import end
from llmgw.agent.discovery.infiniband import BandwidthRun, parse_ib_write_bw
from llmgw.agent.engines.verify import EngineCheckError, run_output

log = logging.getLogger("llmgw.agent.fabric")

TOOL = "ib_write_bw"
GRACE = 30.0
# The server says this once it listens for its client.
LISTENING = b"Waiting for client"


def available(tool: str = TOOL) -> bool:
    return shutil.which(tool) is not None


def _argv(tool: str, device: str, ib_port: int, tcp_port: int, seconds: int) -> list[str]:
    return [
        tool,
        "-d",
        device,
        "-i",
        str(ib_port),
        "-p",
        str(tcp_port),
        "-F",
        "--report_gbits",
        "-D",
        str(seconds),
    ]


class BandwidthServers:
    """The servers this node runs for tests; each ends with its client or its time."""

    def __init__(self, tool: str = TOOL) -> None:
        self.tool = tool
        self._reapers: set[asyncio.Task[None]] = set()
        # Servers started and not yet reaped.
        self._running: set[asyncio.subprocess.Process] = set()

    async def serve(self, device: str, ib_port: int, tcp_port: int, seconds: int) -> None:
        """Start a server and return once it listens (RuntimeError with its words if it
        cannot)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *_argv(self.tool, device, ib_port, tcp_port, seconds),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # killed with its children (command.end)
            )
        except OSError as exc:
            raise RuntimeError(f"{self.tool} cannot be run: {exc.strerror or exc}") from exc
        assert proc.stdout is not None
        said: list[bytes] = []
        try:
            async with asyncio.timeout(15):
                while LISTENING not in b"".join(said):
                    line = await proc.stdout.readline()
                    if not line:
                        await proc.wait()
                        words = b"".join(said).decode(errors="replace").strip()[-300:]
                        raise RuntimeError(
                            f"{self.tool} server on {device} ended (exit {proc.returncode}): "
                            f"{words}"
                        )
                    said.append(line)
        except TimeoutError:
            await end(proc)
            raise RuntimeError(f"{self.tool} server on {device} did not listen in 15 s") from None
        except BaseException:
            # Whoever asked stopped waiting, or what it said could not be read (a line
            # past the stream's limit): no server is left behind on its port, unreaped.
            await end(proc)
            raise
        self._running.add(proc)
        task = asyncio.create_task(self._reap(proc, seconds + GRACE))
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def _reap(self, proc: asyncio.subprocess.Process, limit: float) -> None:
        """A server's end: when its client is done, else killed at ``limit`` or when the
        servers are closed (the agent stopping)."""
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(limit):
                await proc.stdout.read()
                await proc.wait()
        except (TimeoutError, asyncio.CancelledError):
            await end(proc)
        finally:
            self._running.discard(proc)

    async def close(self) -> None:
        """End every server still waiting for its client, and wait until each is gone:
        killed here, since a reaper cancelled before it first ran does nothing."""
        reapers = list(self._reapers)
        for task in reapers:
            task.cancel()
        await asyncio.gather(*reapers, return_exceptions=True)
        for proc in list(self._running):
            await end(proc)


async def run_client(
    device: str,
    ib_port: int,
    tcp_port: int,
    server: str,
    seconds: int,
    tool: str = TOOL,
) -> BandwidthRun:
    """The client against ``server``: the run's figure (its largest message size)."""
    argv = [*_argv(tool, device, ib_port, tcp_port, seconds), server]
    try:
        code, text = await run_output(argv, seconds + GRACE)
    except EngineCheckError as exc:
        raise RuntimeError(f"{tool} client on {device}: {exc}") from exc
    runs = parse_ib_write_bw(text)
    if code != 0 or not runs:
        tail = " | ".join(line for line in text.strip().splitlines()[-3:])
        raise RuntimeError(f"{tool} client on {device} failed (exit {code}): {tail}")
    return max(runs, key=lambda r: r.size_bytes)
