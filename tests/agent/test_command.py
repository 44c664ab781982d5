"""Short commands: their output and status, and none left running when it overruns its
time or its caller stops waiting."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from llmgw.agent import command

# Writes its pid where the test reads it, then waits until killed.
HANG = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
SAYS = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"


async def test_output_status_and_where_stderr_goes() -> None:
    merged = await command.run([sys.executable, "-c", SAYS], 30)
    assert merged.code == 3 and sorted(merged.out.split()) == ["err", "out"]
    dropped = await command.run([sys.executable, "-c", SAYS], 30, stderr="drop")
    assert (dropped.out, dropped.err) == ("out\n", "")
    apart = await command.run([sys.executable, "-c", SAYS], 30, stderr="apart")
    assert (apart.out, apart.err) == ("out\n", "err\n")


async def test_a_command_that_cannot_start_is_an_oserror() -> None:
    with pytest.raises(OSError):
        await command.run(["/nonexistent/tool"], 5)


async def pid_of(path: Path) -> int:
    while not path.exists() or not path.read_text():
        await asyncio.sleep(0.01)
    return int(path.read_text())


def gone(pid: int) -> bool:
    """Reaped: no such process (not even a zombie waiting for its parent)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return True


async def test_overrunning_its_time_it_is_killed_and_reaped(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    with pytest.raises(TimeoutError):
        await command.run([sys.executable, "-c", HANG, str(marker)], 1.0)
    assert gone(await pid_of(marker))


async def test_a_caller_that_stops_waiting_leaves_nothing_running(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    task = asyncio.create_task(command.run([sys.executable, "-c", HANG, str(marker)], 600))
    pid = await pid_of(marker)
    assert not gone(pid)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# Hangs as HANG does, with a child of its own that holds its stdout a while longer (a
# shell script killed while its `sed` still writes).
HANG_WITH_CHILD = (
    "import subprocess, sys; subprocess.Popen(['sleep', '1']); "
    "exec(compile(sys.argv[2], 'hang', 'exec'))"
)


async def test_a_second_cancel_still_leaves_it_reaped_and_its_pipes_closed(
    tmp_path: Path,
) -> None:
    """A caller that gives up (a collector's deadline) and is then closed down (the
    agent stopping) cancels twice: the command is still reaped, and its pipes closed,
    before the cancel goes up; none is left for the garbage collector (a ResourceWarning
    and an open fd)."""
    me = psutil.Process()
    await command.run([sys.executable, "-c", "pass"], 30)  # the loop's own fds, opened
    before = me.num_fds()
    marker = tmp_path / "pid"
    argv = [sys.executable, "-c", HANG_WITH_CHILD, str(marker), HANG]
    task = asyncio.create_task(command.run(argv, 600))
    pid = await pid_of(marker)
    task.cancel()
    await asyncio.sleep(0.05)  # it is killed, and waits for the child's hold on its pipe
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(pid) and me.num_fds() == before


async def test_end_reaps_through_cancels_and_then_passes_the_cancel_on(tmp_path: Path) -> None:
    """What the bandwidth test's servers and uv's runs end with (``command.end``): a
    process killed and reaped, its pipes closed, however often its caller is cancelled
    meanwhile; the cancel goes up after."""
    me = psutil.Process()
    await command.run([sys.executable, "-c", "pass"], 30)  # the loop's own fds, opened
    before = me.num_fds()
    marker = tmp_path / "pid"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HANG_WITH_CHILD,
        str(marker),
        HANG,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    pid = await pid_of(marker)
    task = asyncio.create_task(command.end(proc))
    await asyncio.sleep(0.05)  # killed; waiting for the child's hold on its pipe
    task.cancel()
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert proc.returncode is not None and gone(pid) and me.num_fds() == before


# A script whose own child hangs too, holding the script's stdout (an nvidia-smi wrapper
# whose `nvidia-smi` hangs): writes the child's pid, then waits on it.
HANG_IN_CHILD = (
    "import subprocess, sys; child = subprocess.Popen(['sleep', '20']); "
    "open(sys.argv[1], 'w').write(str(child.pid)); child.wait()"
)


def dead(pid: int, argv: list[str]) -> bool:
    """Killed: gone, or a zombie its (orphaned) parent has not reaped. A process of
    another command line under that pid is another process: the suite starts thousands,
    and the kernel hands a reaped child's pid to a new one soon after it wraps."""
    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_DEAD, psutil.STATUS_ZOMBIE):
            return True
        return proc.cmdline() != argv
    except psutil.NoSuchProcess:
        return True


async def test_overrunning_its_time_it_is_killed_with_its_children(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await command.run([sys.executable, "-c", HANG_IN_CHILD, str(marker)], 1.0)
    # Its child was killed with it: nothing left running behind, nor holding the pipe
    # (with the child alive, the pipe's end came only when its 20 s sleep did).
    assert dead(await pid_of(marker), ["sleep", "20"])
    assert time.monotonic() - started < 15


async def test_a_cancel_as_the_command_ends_is_never_lost() -> None:
    """A caller cancelled at any moment of a short command, the moment it ends included,
    is cancelled: the cancel is never swallowed by the command's result (as
    ``asyncio.wait_for`` does on Python 3.11), which left a closing task running on."""
    lost = 0
    for spins in range(120):
        task = asyncio.ensure_future(command.run(["true"], 10))
        for _ in range(spins % 40):
            await asyncio.sleep(0)
        if spins >= 40:
            await asyncio.sleep(0.001 * (spins - 40))
        asked = task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if asked and not task.cancelled():
            lost += 1
    assert lost == 0


# Exits at once, leaving a child of its own that holds its stdout: writes the child's pid.
EXITS_LEAVING_CHILD = (
    "import subprocess, sys; child = subprocess.Popen(['sleep', '30']); "
    "open(sys.argv[1], 'w').write(str(child.pid))"
)


async def test_a_command_that_exited_but_whose_child_holds_its_pipe_is_ended_whole(
    tmp_path: Path,
) -> None:
    """A command that exits 0 while a child of its own keeps its stdout open overruns
    its time waiting for the pipe's end; when it is ended, its pipe is closed and the
    child killed, though the command itself was reaped already (none left for the
    garbage collector once the loop is gone: a ResourceWarning in a later test)."""
    me = psutil.Process()
    await command.run([sys.executable, "-c", "pass"], 30)  # the loop's own fds, opened
    before = me.num_fds()
    marker = tmp_path / "pid"
    with pytest.raises(TimeoutError):
        await command.run([sys.executable, "-c", EXITS_LEAVING_CHILD, str(marker)], 1.0)
    assert me.num_fds() == before
    child = await pid_of(marker)
    deadline = time.monotonic() + 10
    while not dead(child, ["sleep", "30"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert dead(child, ["sleep", "30"])


async def test_a_cancel_as_the_command_ends_leaves_no_pipe_open() -> None:
    """Cancelled at every moment of a short command's end, the moment it has exited
    and its output is not yet read included: every run's pipes are closed when the
    cancel comes up."""
    me = psutil.Process()
    await command.run(["true"], 10)  # the loop's own fds, opened
    before = me.num_fds()
    for spins in range(60):
        task = asyncio.ensure_future(command.run(["true"], 10))
        await asyncio.sleep(0.0002 * spins)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert me.num_fds() == before, f"a pipe left open after {spins} spins"
