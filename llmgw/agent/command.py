"""Short commands run to their end (nvidia-smi, ibstat, ibnetdiscover, ldd, an engine's
``--version``): what they printed and how they exited.

A command that overruns its time, or whose caller stops waiting (a discovery pass
cancelled, an install's own time limit), is killed and reaped before the error goes up,
so none is left running behind the agent and no half-read pipe is left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

# Where the command's stderr goes: into its output, nowhere, or apart.
Stderr = Literal["merge", "drop", "apart"]
_STDERR = {
    "merge": asyncio.subprocess.STDOUT,
    "drop": asyncio.subprocess.DEVNULL,
    "apart": asyncio.subprocess.PIPE,
}


@dataclass(frozen=True)
class Finished:
    """A command that ran to its end: its exit status and what it printed (``err`` is
    empty unless stderr was kept apart)."""

    code: int
    out: str
    err: str = ""


async def end(proc: asyncio.subprocess.Process) -> None:
    """Kill ``proc`` (if it still runs; its process group too where it leads one) and
    reap it, even while its caller is being
    cancelled: shielded, it waits for the exit and its pipes' end (a child of its own
    may hold them a moment). A cancel that comes meanwhile (a caller closing down)
    waits too, and goes up once it is reaped. Left unreaped, a killed process keeps its
    pipes open until the garbage collector finds them."""
    if proc.returncode is None:
        try:
            # A command started in a session of its own (``run``) is killed with its
            # children: a script's `sleep` would hold its pipes open, and be left behind.
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            # Not a group of its own. (Never both: ``kill`` polls the process first,
            # and a poll that reaps it before the loop's child watcher does leaves the
            # watcher to report exit 255.)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    reap = asyncio.ensure_future(_reaped(proc))
    cancelled = False
    while not reap.done():
        try:
            await asyncio.shield(reap)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


async def _reaped(proc: asyncio.subprocess.Process) -> None:
    """Wait for ``proc``'s exit and its pipes' close. A process that had exited already
    when it was ended (a cancel as it finished, a timeout while a child of its own still
    held its stdout) is reaped at once by ``wait``, its pipes perhaps still open: those
    are closed here, and that child killed with its group, rather than left to the
    garbage collector once the loop is gone."""
    await proc.wait()
    pipes = [p for p in (proc.stdout, proc.stderr) if p is not None]
    if all(p.at_eof() for p in pipes):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # a child in its session, holding the pipe
    transport: asyncio.SubprocessTransport | None = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()  # what was left unread is not wanted: it is being ended
        await asyncio.sleep(0)  # the pipes' own close runs on the loop's next turn


async def run(
    argv: Sequence[str],
    timeout: float,
    stderr: Stderr = "merge",
    env: Mapping[str, str] | None = None,
) -> Finished:
    """Run ``argv`` with no input (``env``: variables added to the agent's own);
    OSError when it cannot be started, TimeoutError when it overran ``timeout`` seconds
    (killed and reaped by then). TimeoutError is an OSError too: a caller telling them
    apart catches it first."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=_STDERR[stderr],
        env={**os.environ, **env} if env else None,
        start_new_session=True,
    )
    try:
        # Not asyncio.wait_for: on Python 3.11 a cancel that comes as the command ends
        # is lost there (the result wins), and a caller being closed runs on.
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except (TimeoutError, asyncio.CancelledError):
        await end(proc)
        raise
    return Finished(
        proc.returncode or 0,
        out.decode("utf-8", "replace"),
        (err or b"").decode("utf-8", "replace"),
    )
