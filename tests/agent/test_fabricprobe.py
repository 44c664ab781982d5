"""``llmgw.agent.fabricprobe``: the ib_write_bw runs of ``ctl fabric-test``, with the tool
stood in by a script written to tmp_path that prints what the real one prints (its
banner, the "Waiting for client" box, a bandwidth table from a capture) and keeps the
argv and pid it was run with. No InfiniBand is touched.

A server is started and handed to a reaper that ends it with its client or once its
time is up; a client's table is read into the run of its largest message size."""

from __future__ import annotations

import asyncio
import json
import signal
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent import fabricprobe
from llmgw.agent.discovery.infiniband import parse_ib_write_bw
from llmgw.agent.fabricprobe import BandwidthServers, available, run_client
from tests.support.shared import SHARED_FIXTURES

OURS = Path(__file__).parents[1] / "fixtures" / "infiniband"
GBITS = OURS / "ib_write_bw_-a_4qp_RoCE-200G_Gbps.txt"
MBYTES = SHARED_FIXTURES / "ib_write_bw_-a_2node_HDR-CX6_MBps_with-cpufreq-warnings.txt"

# What ib_write_bw prints before a server listens (perftest's banner), then the box.
BANNER = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
---------------------------------------------------------------------------------------
"""
WAITING = """\
************************************
* Waiting for client to connect... *
************************************
"""
# Long enough to outlast any test, short enough that nothing lingers if one breaks.
FOREVER = 60


class StandIn:
    """An ib_write_bw at ``path``: each run appends {"pid", "argv"} to ``log``, prints
    ``before``, then (a server) the Waiting box when ``listens``, then waits for the
    file ``go`` when ``waits`` (its client), or sleeps ``sleep`` seconds; then prints
    ``after`` and exits ``code``."""

    def __init__(self, root: Path) -> None:
        self.path = root / "ib_write_bw"
        self.log = root / "runs.jsonl"
        self.go = root / "go"

    def write(
        self,
        before: str = BANNER,
        listens: bool = True,
        waits: bool = False,
        sleep: float = 0,
        after: str = "",
        code: int = 0,
    ) -> str:
        script = f"""#!{sys.executable}
import json, os, sys, time
with open({str(self.log)!r}, "a") as log:
    log.write(json.dumps({{"pid": os.getpid(), "argv": sys.argv[1:]}}) + "\\n")
sys.stdout.write({before!r})
if {listens!r}:
    sys.stdout.write({WAITING!r})
sys.stdout.flush()
if {waits!r}:
    deadline = time.monotonic() + {FOREVER}
    while not os.path.exists({str(self.go)!r}) and time.monotonic() < deadline:
        time.sleep(0.02)
time.sleep({sleep!r})
sys.stdout.write({after!r})
sys.exit({code!r})
"""
        self.path.write_text(script)
        self.path.chmod(self.path.stat().st_mode | stat.S_IEXEC)
        return str(self.path)

    def runs(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def running(pid: int) -> bool:
    """The process is alive: not gone, and not a zombie waiting to be reaped."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


class Spawns:
    """asyncio as fabricprobe sees it: each process it starts is kept, so one the module
    left behind is ended and reaped by the test that made it (before its event loop
    closes), and its 15 s wait for a server to listen can be made ``listen`` seconds.
    asyncio itself is not changed for anyone else."""

    def __init__(self) -> None:
        self.procs: list[asyncio.subprocess.Process] = []
        self.listen: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def create_subprocess_exec(self, *argv: Any, **kw: Any) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(*argv, **kw)
        self.procs.append(proc)
        return proc

    def timeout(self, delay: float | None) -> AbstractAsyncContextManager[object]:
        return asyncio.timeout(self.listen if delay == 15 and self.listen else delay)


@pytest.fixture
def tool(tmp_path: Path) -> StandIn:
    return StandIn(tmp_path)


@pytest.fixture
async def spawns(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Spawns]:
    spawns = Spawns()
    monkeypatch.setattr(fabricprobe, "asyncio", spawns)
    yield spawns
    for proc in spawns.procs:
        if proc.returncode is None:
            proc.kill()
        assert proc.stdout is not None
        await proc.stdout.read()
        await proc.wait()


@pytest.fixture
async def servers(tool: StandIn, spawns: Spawns) -> AsyncIterator[BandwidthServers]:
    found = BandwidthServers(str(tool.path))
    yield found
    await found.close()


async def reaped(servers: BandwidthServers) -> None:
    """Until every server's reaper has finished (the reapers are the module's own)."""
    async with asyncio.timeout(10):
        while servers._reapers:
            await asyncio.gather(*list(servers._reapers))


def argv(device: str, ib_port: int, tcp_port: int, seconds: int) -> list[str]:
    """One rail's options: the adapter and its port, the TCP port of the out-of-band
    exchange, -F (run though the CPU frequency is not fixed), Gb/s, for ``seconds``."""
    rail = ["-d", device, "-i", str(ib_port), "-p", str(tcp_port)]
    return [*rail, "-F", "--report_gbits", "-D", str(seconds)]


# --- the server ----------------------------------------------------------------------


async def test_serve_returns_once_the_server_listens_and_it_ends_with_its_client(
    tool: StandIn, servers: BandwidthServers
) -> None:
    tool.write(waits=True, after=GBITS.read_text())
    await servers.serve("mlx5_2", 1, 18515, 5)
    (run,) = tool.runs()
    assert run["argv"] == argv("mlx5_2", 1, 18515, 5)
    # Listening, and waiting for its client: serve did not wait for the run to end.
    assert running(run["pid"]) and len(servers._reapers) == 1
    tool.go.touch()  # the client came and went
    await reaped(servers)
    assert not running(run["pid"])


async def test_a_server_whose_client_never_comes_is_killed_once_its_time_is_up(
    tool: StandIn, servers: BandwidthServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fabricprobe, "GRACE", 0.2)
    tool.write(waits=True)
    await servers.serve("mlx5_0", 1, 18516, 0)
    (run,) = tool.runs()
    assert running(run["pid"])
    await reaped(servers)
    assert not running(run["pid"])


async def test_a_server_that_ends_before_it_listens_is_refused_with_its_words(
    tool: StandIn, servers: BandwidthServers
) -> None:
    words = (
        " Couldn't listen to port 18515\n Unable to open file descriptor for socket connection\n"
    )
    tool.write(before=BANNER + words, listens=False, code=1)
    with pytest.raises(RuntimeError) as caught:
        await servers.serve("mlx5_0", 1, 18515, 5)
    said = str(caught.value)
    assert said.startswith(f"{tool.path} server on mlx5_0 ended (exit 1): ")
    assert said.endswith("Unable to open file descriptor for socket connection")
    # The last 300 characters of what it said: the banner's head is cut.
    assert len(said.split("ended (exit 1): ", 1)[1]) == 300 < len(BANNER + words)
    assert servers._reapers == set()  # nothing left to reap


async def test_a_server_that_does_not_listen_in_time_is_killed_and_refused(
    tool: StandIn, servers: BandwidthServers, spawns: Spawns
) -> None:
    spawns.listen = 0.3
    tool.write(listens=False, sleep=FOREVER)
    with pytest.raises(RuntimeError, match="server on mlx5_1 did not listen in 15 s"):
        await servers.serve("mlx5_1", 1, 18517, 5)
    # Killed and reaped before the refusal. The process, not the stand-in's own log: on
    # busy cores it may be killed before its interpreter has started to write one.
    (proc,) = spawns.procs
    assert proc.returncode == -signal.SIGKILL and not running(proc.pid)
    assert servers._reapers == set()


async def test_a_server_whose_words_cannot_be_read_is_killed_and_reaped(
    tool: StandIn, servers: BandwidthServers, spawns: Spawns
) -> None:
    tool.write(before="x" * (1 << 17), listens=False, sleep=FOREVER)  # no line end
    with pytest.raises(ValueError, match="limit"):
        await servers.serve("mlx5_1", 1, 18520, 5)
    (proc,) = spawns.procs
    assert proc.returncode == -signal.SIGKILL and not running(proc.pid)
    assert servers._reapers == set()


async def test_a_tool_that_cannot_run_is_refused(tmp_path: Path, spawns: Spawns) -> None:
    missing = tmp_path / "no-such-ib_write_bw"
    with pytest.raises(RuntimeError, match=f"^{missing} cannot be run: No such file"):
        await BandwidthServers(str(missing)).serve("mlx5_0", 1, 18515, 5)
    assert not available(str(missing))


async def test_available_finds_the_tool_by_its_path_or_on_path(
    tool: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool.write()
    assert available(str(tool.path))
    monkeypatch.setenv("PATH", str(tool.path.parent))
    assert available()  # "ib_write_bw", as the agent asks for it
    monkeypatch.setenv("PATH", "")
    assert not available()


async def test_close_ends_the_servers_still_waiting_for_a_client(
    tool: StandIn, servers: BandwidthServers
) -> None:
    tool.write(waits=True)
    await servers.serve("mlx5_0", 1, 18518, 5)
    (run,) = tool.runs()
    await servers.close()
    # Ended by the time close() returns, or soon after (its reaper's cleanup running).
    async with asyncio.timeout(2):
        while running(run["pid"]):
            await asyncio.sleep(0.02)


async def test_a_serve_cancelled_before_the_server_listens_leaves_no_server(
    tool: StandIn, servers: BandwidthServers
) -> None:
    tool.write(listens=False, sleep=FOREVER)
    serving = asyncio.create_task(servers.serve("mlx5_0", 1, 18519, 5))
    async with asyncio.timeout(10):
        while not tool.runs():  # the stand-in has started
            await asyncio.sleep(0.02)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
    (run,) = tool.runs()
    assert not running(run["pid"])


# --- the client ----------------------------------------------------------------------


@pytest.mark.parametrize("capture", [GBITS, MBYTES], ids=["Gb/sec", "MB/sec-with-warnings"])
async def test_the_client_runs_against_the_server_and_reads_its_largest_message(
    capture: Path, tool: StandIn
) -> None:
    if not capture.exists():
        pytest.fail(f"{capture} is missing: the shared captures are beside every checkout")
    text = capture.read_text()
    tool.write(before=text, listens=False)
    run = await run_client("mlx5_2", 1, 18515, "10.20.4.18", 5, tool=str(tool.path))
    (called,) = tool.runs()
    assert called["argv"] == [*argv("mlx5_2", 1, 18515, 5), "10.20.4.18"]
    rows = parse_ib_write_bw(text)
    assert len(rows) > 1
    assert run == max(rows, key=lambda r: r.size_bytes)
    assert run.size_bytes == 8388608  # both captures run -a up to 8 MiB
    last = [line.split() for line in text.splitlines() if line.split()[:1] == ["8388608"]]
    assert run.bw_average == float(last[0][3])


async def test_a_client_that_exits_non_zero_is_refused_with_its_last_lines(
    tool: StandIn,
) -> None:
    said = " Couldn't connect to 10.20.4.18:18515\n Unable to open file descriptor\n Failed\n"
    tool.write(before=BANNER + said, listens=False, code=1)
    with pytest.raises(RuntimeError) as caught:
        await run_client("mlx5_0", 1, 18515, "10.20.4.18", 5, tool=str(tool.path))
    assert str(caught.value) == (
        f"{tool.path} client on mlx5_0 failed (exit 1): "
        " Couldn't connect to 10.20.4.18:18515 |  Unable to open file descriptor |  Failed"
    )


async def test_a_client_with_a_table_that_exits_non_zero_is_still_refused(
    tool: StandIn,
) -> None:
    tool.write(before=GBITS.read_text(), listens=False, code=2)
    with pytest.raises(RuntimeError, match=r"client on mlx5_0 failed \(exit 2\)"):
        await run_client("mlx5_0", 1, 18515, "10.20.4.18", 5, tool=str(tool.path))


async def test_a_client_that_prints_no_table_is_refused(tool: StandIn) -> None:
    tool.write(before=BANNER, listens=False, code=0)
    with pytest.raises(RuntimeError) as caught:
        await run_client("mlx5_0", 1, 18515, "10.20.4.18", 5, tool=str(tool.path))
    last = BANNER.splitlines()[-3:]
    assert str(caught.value) == f"{tool.path} client on mlx5_0 failed (exit 0): " + " | ".join(last)


async def test_a_client_that_overruns_its_time_is_killed_and_refused(
    tool: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fabricprobe, "GRACE", 0.3)
    tool.write(listens=False, sleep=FOREVER)
    with pytest.raises(RuntimeError) as caught:
        await run_client("mlx5_0", 1, 18515, "10.20.4.18", 0, tool=str(tool.path))
    assert str(caught.value).startswith(f"{tool.path} client on mlx5_0: {tool.path} -d mlx5_0")
    assert "did not finish in 0s" in str(caught.value)
    (run,) = tool.runs()
    assert not running(run["pid"])


async def test_a_client_tool_that_cannot_run_is_refused(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing")
    with pytest.raises(RuntimeError, match=f"client on mlx5_0: {missing} cannot be run"):
        await run_client("mlx5_0", 1, 18515, "10.20.4.18", 5, tool=missing)
