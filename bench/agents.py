"""Agent-scale benchmark: one real control plane, N simulated agents, its CPU and memory.

For each N this starts a real control plane (``llmgw server init`` then ``llmgw server
run``, loopback only), enrolls N nodes through the admin API and ``/api/v1/enroll``
(each with its own key, CSR and client certificate), and runs the N agents as real mutual
TLS + HTTP/2 streams with llmgw's own ``AgentSession``, from a few worker processes with
one event loop each. Once every node is Ready it measures the control plane over a steady
window: its CPU (user + system time over wall time, as a fraction of one core), its RSS
(the most seen), heartbeats handled per second, and the p50/p99 heartbeat handling time
the control plane reports in ``/api/v1/status``.

Each N is measured in phases, each on a freshly started control plane with the same
enrolled nodes, so the figures stand side by side:

- ``baseline``: the same N agents connected and Registered, holding their streams open
  and silent (the control plane's heartbeat interval set to an hour, agents' PINGs off).
  It is what N open mutual-TLS HTTP/2 connections and N registered nodes cost by
  themselves.
- ``heartbeat``: heartbeats every ``--heartbeat`` seconds and HTTP/2 PINGs every
  ``--ping`` seconds, the defaults an agent runs with.
- ``no-ping`` (optional): heartbeats as above, PINGs off, to split the two costs.
- ``nogpu`` and ``gpu`` (optional, ``--phases nogpu,gpu``): nodes without cards (the
  ``heartbeat`` phase under another name) and nodes with ``--gpus`` cards each, every
  figure of every card moving a little each heartbeat, the node's vitals each heartbeat,
  the cards' health (``GpuHealth``) a minute apart and the node's health warnings once
  (``SimFacts``). The table gives the bytes of one encoded Heartbeat frame with and
  without the health; the gpu phase also times one ``/metrics`` scrape after its window.

Phases other than ``gpu`` report no cards.

The simulated agents share the machine with the control plane: on a small machine they
compete with it for CPU, and the table says how busy the machine was.

    .venv/bin/python bench/agents.py --agents 100,1000,5000 --window 30
    .venv/bin/python bench/agents.py --agents 1000 --phases nogpu,gpu --gpus 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
import yaml

# The checkout's llmgw, not whichever an editable install of the venv points at.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.host import machine  # noqa: E402
from llmgw import pki  # noqa: E402
from llmgw.agent.discovery.health import card_warnings  # noqa: E402
from llmgw.agent.identity import enroll  # noqa: E402
from llmgw.agent.session import AgentSession, SessionEnded, SessionSettings  # noqa: E402
from llmgw.client.admin import AdminClient  # noqa: E402
from llmgw.client.adminbase import AdminError  # noqa: E402
from llmgw.wire import HostFacts  # noqa: E402
from llmgw.wire.hardware import (  # noqa: E402
    GPU,
    Disk,
    GpuHealth,
    GpuProcess,
    IbPort,
    NodeVitals,
    XidSeen,
    gpu_figures,
)
from llmgw.wire.messages import Heartbeat, encode_message  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SILENT = 3600.0  # an interval long enough that nothing is sent within a window
HEALTH_EVERY = 60.0  # seconds between a real agent's slow card figures (GpuHealth)
# How an agent's stream says it ended on an unanswered PING (llmgw/agent/stream.py).
PING_TIMEOUT_WORDS = "no answer to HTTP/2 PING"
# The control plane's setting for the per-card families in its own /metrics (issue 33):
# the second scrape of the gpu phase sets it on; a control plane without it refuses it.
FLEET_DETAIL = "metrics.fleet_detail"
MIB = 1024**2
GIB = 1024**3


class BenchError(RuntimeError):
    """The benchmark could not go on; the message says why."""


# --- the simulated agents (worker processes) ---------------------------------------------


class SimFacts:
    """A FactSource that reads nothing: the same host facts every time and, with cards,
    card figures that move a little every beat, as a real agent's do.

    One per agent session. With ``gpus`` > 0 each heartbeat carries every card with
    every figure ``GPU`` has (new objects each beat, so nothing is shared or cached by
    identity), the node's vitals, the cards' slow figures (``GpuHealth``) on the first
    beat and every ``health_every`` beats after (a minute's worth at the bench's
    heartbeat interval), and the node's health warnings once, on the first beat. With
    none it sends what the ``heartbeat`` phase always sent: memory, CPU, load, disks.
    """

    def __init__(
        self, gpus: int, health_every: int = 12, interval: float = 5.0, seed: int | str = 0
    ) -> None:
        self.rng = random.Random(seed)
        self.health_every = max(1, health_every)
        self.interval = interval
        self.beat = 0
        self.disks = [
            Disk(path="/", fstype="ext4", total=512 * GIB, free=300 * GIB),
            Disk(path="/var/lib/llmgw", fstype="xfs", total=4096 * GIB, free=2048 * GIB),
        ]
        self.ncards = gpus
        # Joules since the driver loaded: counts up by power x interval, as a real one.
        self.energy = [3.2e9 + 1e7 * i + self.rng.uniform(0, 1e6) for i in range(gpus)]
        self.ecc_corrected = [self.rng.randint(0, 3) for _ in range(gpus)]
        self.gpus = [self._card(i) for i in range(gpus)]  # for Register

    def _card(self, i: int) -> GPU:
        rng = self.rng
        power = round(rng.uniform(560.0, 695.0), 3)
        self.energy[i] += power * self.interval
        return GPU(
            index=i,
            uuid=_uuid(i),
            name="NVIDIA H100 80GB HBM3",
            memory_total=81559 * MIB,
            memory_used=(62000 + rng.randint(-64, 64)) * MIB,
            utilization=rng.randint(80, 99),
            compute_capability="9.0",
            driver="550.54.15",
            bus_id=f"00000000:{_BUSES[i % len(_BUSES)]}:00.0",
            memory_utilization=rng.randint(30, 60),
            temperature=rng.randint(55, 70),
            memory_temperature=rng.randint(60, 75),
            power=power,
            power_limit=700.0,
            energy=round(self.energy[i], 3),
            sm_clock=rng.randint(1755, 1980),
            memory_clock=2619,
            fan=rng.randint(30, 40),  # an SXM card has none; filled to count every figure
            pstate="P0",
            throttle=["sw_power_cap"] if power > 690.0 else [],
            pcie_gen=5,
            # One card on a link narrower than it can take: a health warning to send.
            pcie_width=8 if i == 5 else 16,
            pcie_gen_max=5,
            pcie_width_max=16,
            sm_active=round(rng.uniform(0.6, 0.9), 4),
            sm_occupancy=round(rng.uniform(0.3, 0.5), 4),
            tensor_active=round(rng.uniform(0.3, 0.6), 4),
            dram_active=round(rng.uniform(0.4, 0.7), 4),
            processes=[GpuProcess(pid=41000 + i, name="python3", memory=512 * MIB)],
            mig_mode=False,  # mig_parent, mig_profile, mig_class: a MIG instance's only
        )

    def _health(self, i: int, now: float) -> GpuHealth:
        self.ecc_corrected[i] += self.rng.randint(0, 1)
        return GpuHealth(
            uuid=_uuid(i),
            index=i,
            persistence_mode=True,
            ecc_mode=True,
            ecc_volatile_corrected=self.ecc_corrected[i],
            ecc_volatile_uncorrected=0,
            ecc_aggregate_corrected=self.ecc_corrected[i] + 40,
            ecc_aggregate_uncorrected=0,
            retired_pages=0,
            retired_pending=False,
            remapped_correctable=0,
            remapped_uncorrectable=0,
            remap_pending=False,
            remap_failed=False,
            # One card saw an Xid lately; the others none.
            xids=[XidSeen(code=13, count=1, last=now - 600, meaning="Graphics Engine Exception")]
            if i == 0
            else [],
            nvlink_links=18,
            nvlink_active=18,
            nvlink_errors={
                "crc_flit": self.rng.randint(0, 5),
                "crc_data": 0,
                "replay": self.rng.randint(0, 2),
                "recovery": 0,
            },
        )

    def _vitals(self) -> NodeVitals:
        rng = self.rng
        return NodeVitals(
            cpu_temperatures={
                "package0": round(rng.uniform(48, 56), 1),
                "package1": round(rng.uniform(48, 56), 1),
            },
            board_temperatures={"acpitz": round(rng.uniform(28, 32), 1), "nvme0": 38.0},
            cpu_power={
                "package-0": round(rng.uniform(180, 240), 3),
                "package-1": round(rng.uniform(180, 240), 3),
            },
        )

    async def facts(self, hostname: str) -> HostFacts:
        return HostFacts(
            hostname=hostname,
            os="Debian GNU/Linux 12 (bookworm)",
            arch="x86_64",
            kernel="6.1.0-18-amd64",
            cpu_model="AMD EPYC 9454 48-Core Processor",
            cpu_count=96,
            cpu_cores=48,
            cpu_flags=["avx2", "avx512f", "fma"],
            memory_total=768 * GIB,
            memory_available=512 * GIB,
            cpu_percent=12.5,
            load=[3.1, 2.9, 2.7],
            disks=list(self.disks),
            gpus=list(self.gpus),
            gpu_source="nvml" if self.gpus else None,
            cuda_version="12.4" if self.gpus else None,
        )

    async def live(self) -> FixedLive:
        return self.next_live()

    async def news(self) -> None:
        """A simulated node's tools never fail: nothing comes before its heartbeat."""
        await asyncio.Event().wait()

    def next_live(self) -> FixedLive:
        """The next heartbeat's figures."""
        beat, self.beat = self.beat, self.beat + 1
        if not self.ncards:
            return FixedLive(
                memory_available=512 * GIB,
                cpu_percent=12.5,
                load=[3.1, 2.9, 2.7],
                disks=list(self.disks),
                gpus=None,
            )
        rng = self.rng
        now = time.time()
        gpus = [self._card(i) for i in range(self.ncards)]
        health = None
        if beat % self.health_every == 0:
            health = [self._health(i, now) for i in range(self.ncards)]
        return FixedLive(
            memory_available=(512 + rng.randint(-4, 4)) * GIB,
            cpu_percent=round(rng.uniform(10.0, 15.0), 1),
            load=[round(rng.uniform(2.5, 3.5), 2) for _ in range(3)],
            disks=list(self.disks),
            gpus=gpus,
            gpu_health=health,
            vitals=self._vitals(),
            health_warnings=card_warnings(gpus, health, now) if beat == 0 and health else None,
        )


_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


def _uuid(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012d}"


def heartbeat_frames(gpus: int, health_every: int) -> dict[str, int]:
    """Bytes of one encoded Heartbeat frame as an agent sends it to a control plane
    that takes the cards' moving figures alone: the first (whole cards, the cards'
    health and the node's warnings), a plain one (figures), and one with the minute's
    health."""
    source = SimFacts(gpus, health_every)
    sizes: dict[str, int] = {}
    for beat in range(health_every + 1):
        live = source.next_live()
        frame = encode_message(
            Heartbeat(
                seq=1000 + beat,
                memory_available=live.memory_available,
                cpu_percent=live.cpu_percent,
                load=live.load,
                disks=live.disks,
                gpus=live.gpus if beat == 0 else None,
                gpu_figures=None
                if beat == 0 or live.gpus is None
                else [gpu_figures(card) for card in live.gpus],
                gpu_health=live.gpu_health,
                vitals=live.vitals,
                health_warnings=live.health_warnings,
            )
        )
        kind = "first" if beat == 0 else "health" if live.gpu_health else "plain"
        sizes.setdefault(kind, len(frame))
    sizes.setdefault("plain", sizes.get("health", sizes["first"]))
    sizes.setdefault("health", sizes["plain"])
    return sizes


@dataclass
class FixedLive:
    """What a heartbeat carries (the agent session's LiveFigures)."""

    memory_available: int | None
    cpu_percent: float | None
    load: list[float] | None
    disks: list[Disk] | None
    gpus: list[GPU] | None
    gpu_health: list[GpuHealth] | None = None
    vitals: NodeVitals | None = None
    health_warnings: list[str] | None = None
    ib_ports: list[IbPort] | None = None
    ages: dict[str, float] | None = None
    unread: list[str] | None = None


@dataclass
class SimAgent:
    node_id: str
    state_dir: Path
    tls: ssl.SSLContext | None = None  # made once enrolled
    session: AgentSession | None = None  # the one now running, if any


class Worker:
    """One process's share of the agents, driven by commands from the benchmark."""

    def __init__(self, conn: Connection, node_ids: list[str], root: Path) -> None:
        self.conn = conn
        self.agents = [SimAgent(n, root / n) for n in node_ids]
        self.tasks: list[asyncio.Task[None]] = []
        self.ended = 0
        # Streams the agent ended because the control plane left its PING unanswered.
        self.ping_timeouts = 0
        self.reasons: list[str] = []

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        fd = self.conn.fileno()

        def readable() -> None:
            try:
                inbox.put_nowait(self.conn.recv())
            except (EOFError, OSError):  # the benchmark is gone: stop too
                loop.remove_reader(fd)
                inbox.put_nowait({"cmd": "exit"})

        loop.add_reader(fd, readable)
        while True:
            msg = await inbox.get()
            cmd = msg.pop("cmd")
            try:
                reply = await getattr(self, f"cmd_{cmd}")(**msg)
            except Exception as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            with contextlib.suppress(OSError):
                self.conn.send(reply)
            if cmd == "exit":
                return

    async def cmd_enroll(self, api: str, admin_token: str, concurrency: int) -> dict[str, Any]:
        client = AdminClient(f"http://{api}", admin_token, timeout=60)
        gate = asyncio.Semaphore(concurrency)
        failures: list[str] = []

        async def one(agent: SimAgent) -> None:
            async with gate:
                try:
                    answer = await asyncio.to_thread(
                        client.post, "/api/v1/tokens", {"ttl_seconds": 3600}
                    )
                    state = await enroll(
                        agent.state_dir, answer["token"], agent.node_id, api, timeout=60
                    )
                    agent.tls = pki.client_tls(state.cert_path, state.key_path, state.ca_path)
                except Exception as exc:
                    failures.append(f"{agent.node_id}: {type(exc).__name__}: {exc}")

        start = time.monotonic()
        await asyncio.gather(*(one(a) for a in self.agents))
        return {
            "enrolled": sum(1 for a in self.agents if a.tls is not None),
            "seconds": time.monotonic() - start,
            "failures": failures[:5],
        }

    async def cmd_connect(
        self,
        address: str,
        ramp: float,
        offset: float,
        heartbeat: float,
        ping: float,
        gpus: int,
        health_every: int,
    ) -> dict[str, Any]:
        """Start every agent's stream, spread evenly over ``ramp`` seconds; each reports
        ``gpus`` cards, their health every ``health_every`` heartbeats."""
        await self.cmd_disconnect()
        if any(a.tls is None for a in self.agents):
            raise BenchError("connect before every agent is enrolled")
        n = len(self.agents)
        for i, agent in enumerate(self.agents):
            delay = ramp * (i + offset) / max(n, 1)
            sim = (gpus, health_every, heartbeat)
            self.tasks.append(
                asyncio.create_task(self._hold(agent, address, delay, heartbeat, ping, sim))
            )
        return {"started": n}

    async def _hold(
        self,
        agent: SimAgent,
        address: str,
        delay: float,
        heartbeat: float,
        ping: float,
        sim: tuple[int, int, float],
    ) -> None:
        """Keep one agent's stream up, reconnecting as a real agent would; count drops."""
        assert agent.tls is not None  # checked by cmd_connect
        await asyncio.sleep(delay)
        while True:
            settings = SessionSettings(heartbeat_interval=heartbeat, ping_interval=ping)
            # A fresh source a session: a real agent's first beat after a (re)connect
            # carries the cards' health and its warnings again.
            source = SimFacts(*sim, seed=agent.node_id)
            agent.session = AgentSession(agent.node_id, agent.tls, source, settings)
            try:
                await agent.session.run(address)
            except SessionEnded as exc:
                self._ended(agent, exc.reason)
            except Exception as exc:  # not expected from run(); counted, not hidden
                self._ended(agent, f"{type(exc).__name__}: {exc}")
            agent.session = None
            await asyncio.sleep(random.uniform(0.5, 3.0))

    def _ended(self, agent: SimAgent, reason: str) -> None:
        self.ended += 1
        if PING_TIMEOUT_WORDS in reason:
            self.ping_timeouts += 1
        if len(self.reasons) < 5:
            self.reasons.append(f"{agent.node_id}: {reason}")

    async def cmd_counts(self) -> dict[str, Any]:
        registered = sum(
            1 for a in self.agents if a.session is not None and a.session.registered_at is not None
        )
        return {
            "registered": registered,
            "ended": self.ended,
            "ping_timeouts": self.ping_timeouts,
            "reasons": list(self.reasons),
        }

    async def cmd_disconnect(self) -> dict[str, Any]:
        """Stop every agent's stream; count the sessions that ignored the first cancel."""
        for task in self.tasks:
            task.cancel()
        pending = set(self.tasks)
        recancelled = 0
        for _ in range(10):
            if not pending:
                break
            _, pending = await asyncio.wait(pending, timeout=3)
            # On Python 3.11 a session can swallow a cancel: asyncio.wait_for returns the
            # result of a send that finished as the cancel came in (see docs/performance.md).
            # A second cancel gets it out of AgentSession's clean-up.
            for task in pending:
                task.cancel()
            recancelled += len(pending)
        self.tasks = []
        for agent in self.agents:
            agent.session = None
        self.ended = 0
        self.reasons = []
        await asyncio.sleep(0.2)  # let the transports finish closing
        return {"recancelled": recancelled, "stuck": len(pending)}

    async def cmd_exit(self) -> dict[str, Any]:
        return await self.cmd_disconnect()


def worker_main(conn: Connection, node_ids: list[str], root: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops us, not Ctrl-C
    asyncio.run(Worker(conn, node_ids, Path(root)).serve())


class WorkerPool:
    """The worker processes, asked the same thing at once and answered within a deadline."""

    def __init__(self, node_ids: list[str], count: int, root: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        for i in range(count):
            share = node_ids[i::count]
            if not share:
                continue
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=worker_main,
                args=(theirs, share, str(root)),
                name=f"bench-agents-{i}",
                daemon=True,
            )
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def ask(self, timeout: float, per_worker: Callable[[int], dict[str, Any]]) -> list[Any]:
        for i, conn in enumerate(self.conns):
            conn.send(per_worker(i))
        deadline = time.monotonic() + timeout
        replies = []
        for proc, conn in zip(self.procs, self.conns, strict=True):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise BenchError(f"agent worker {proc.name} did not answer in {timeout:g} s")
            reply = conn.recv()
            if "error" in reply:
                raise BenchError(f"agent worker {proc.name}: {reply['error']}")
            replies.append(reply)
        return replies

    def ask_all(self, msg: dict[str, Any], timeout: float) -> list[Any]:
        return self.ask(timeout, lambda _: dict(msg))

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send({"cmd": "exit"})
        deadline = time.monotonic() + 10
        for proc in self.procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(3)
            if proc.is_alive():
                proc.kill()
                proc.join(3)
        for conn in self.conns:
            conn.close()


# --- the control plane ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: take SIGTERM if the benchmark dies (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def llmgw_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmgw", *args]


class ControlPlaneProc:
    """A control plane data dir, and the ``server run`` process on it (one at a time)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_dir = root / "cp"
        http_port = free_port()
        self.agent_port = free_port()
        while self.agent_port == http_port:
            self.agent_port = free_port()
        self.http = f"127.0.0.1:{http_port}"
        self.admin_token = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None
        self.runs = 0

    @property
    def agent_address(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    def init(self) -> None:
        out = subprocess.run(
            llmgw_cmd(
                "server",
                "init",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                self.http,
                "--agent-port",
                str(self.agent_port),
                "--advertise",
                "127.0.0.1",
                # Not the default 8444: another control plane on the machine may hold it.
                "--peer-port",
                str(free_port()),
                "--yes",
            ),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise BenchError(f"llmgw server init failed:\n{out.stdout}{out.stderr}")
        self.admin_token = (self.data_dir / "admin.token").read_text().strip()

    def set_heartbeat_interval(self, seconds: float) -> None:
        path = self.data_dir / "server.yaml"
        config = yaml.safe_load(path.read_text())
        config["heartbeat_interval"] = float(seconds)
        path.write_text(yaml.safe_dump(config, sort_keys=False))

    def start(self, timeout: float = 30, profile: str | None = None) -> psutil.Process:
        """``server run``; with ``profile``, under cProfile, its stats written there when
        it stops (SIGTERM ends it cleanly)."""
        self.runs += 1
        self.log = self.root / f"server-{self.runs}.log"
        cmd = llmgw_cmd("server", "run", "--data-dir", str(self.data_dir), "--log-level", "warning")
        if profile:
            cmd[1:1] = ["-m", "cProfile", "-o", profile]
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(OSError):
                self.api("/healthz", auth=False, timeout=2)
                return psutil.Process(self.proc.pid)
            time.sleep(0.1)
        raise BenchError(f"the control plane did not answer in {timeout:g} s")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(
                f"the control plane exited ({self.proc.returncode}):\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def api(self, path: str, *, auth: bool = True, timeout: float = 30) -> Any:
        return json.loads(self.get(path, auth=auth, timeout=timeout))

    def get(
        self, path: str, *, auth: bool = True, timeout: float = 30, gzip: bool = False
    ) -> bytes:
        """``path``'s body; asked for gzip (as Prometheus asks for its scrapes), the body
        as it came, compressed or not (``inflated`` reads it)."""
        headers = {"authorization": f"Bearer {self.admin_token}"} if auth else {}
        if gzip:
            headers["accept-encoding"] = "gzip"
        req = urllib.request.Request(f"http://{self.http}{path}", headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body: bytes = resp.read()
            return body

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# --- measuring ------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    server_heartbeat: float
    ping: float
    what: str
    gpus: int = 0  # cards each node reports, every figure moving (SimFacts)


@dataclass
class Result:
    agents: int
    phase: str
    ready_seconds: float = 0.0
    ramp_cpu_core: float = 0.0  # the control plane's, from the first connection to all Ready
    ramp_drops: int = 0  # streams that ended before the window (slow PING answers, refusals)
    window_seconds: float = 0.0
    cpu_core: float = 0.0
    rss_max_mb: float = 0.0
    heartbeats_per_s: float = 0.0
    hb_p50_ms: float | None = None
    hb_p99_ms: float | None = None
    # /healthz asked every 0.1 s through the window: its slowest answer and p99 (ms).
    stall_max_ms: float | None = None
    stall_p99_ms: float | None = None
    agents_cpu_core: float = 0.0
    machine_busy: float = 0.0
    machine_steal: float = 0.0
    ready_at_end: int = 0
    streams_at_end: int = 0
    drops: int = 0
    drop_reasons: list[str] = field(default_factory=list)
    recancelled: int = 0  # sessions that ignored the first cancel when stopped
    gpus: int = 0
    frame_bytes: int = 0  # one encoded Heartbeat frame, a plain beat
    frame_health_bytes: int = 0  # one with the cards' health (every minute)
    frame_first_bytes: int = 0  # a session's first: health and the node's warnings
    metrics_seconds: float | None = None  # one /metrics scrape after the window
    metrics_bytes: int | None = None
    metrics_gpu_samples: int | None = None  # its llmgw_gpu_* sample lines
    metrics_rss_mb: float | None = None  # the control plane's RSS just after it
    metrics_ping_timeouts: int | None = None  # agents' streams ended on a PING meanwhile
    metrics_drops: int | None = None  # agents' streams that ended meanwhile, for any reason
    # The same scrape again with metrics.fleet_detail on; None where it was not run, and
    # then metrics_detail_note says why.
    metrics_detail_seconds: float | None = None
    metrics_detail_bytes: int | None = None
    metrics_detail_again_seconds: float | None = None  # the next, a heartbeat later
    # Those two asked for gzip, as Prometheus does; then one more asking for plain text,
    # and a first one (the nodes' texts forgotten) asking for plain text.
    metrics_detail_gzip_bytes: int | None = None
    metrics_detail_plain_seconds: float | None = None
    metrics_detail_plain_first_seconds: float | None = None
    metrics_detail_gpu_samples: int | None = None
    metrics_detail_ping_timeouts: int | None = None
    metrics_detail_drops: int | None = None
    metrics_detail_note: str | None = None
    profiled: bool = False  # the control plane ran under cProfile: CPU inflated


def _cpu_seconds(procs: Sequence[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def _machine_cpu() -> dict[str, float]:
    return dict(psutil.cpu_times()._asdict())


def _machine_split(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The whole machine's CPU use between two readings, as fractions of all its CPUs."""
    delta = {k: after[k] - before[k] for k in before}
    # guest time is already inside user on Linux; steal is the hypervisor's, not ours.
    total = sum(v for k, v in delta.items() if k not in ("guest", "guest_nice")) or 1e-9
    busy = sum(delta.get(k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
    return {"busy": busy / total, "steal": delta.get("steal", 0.0) / total}


class StallProbe:
    """Asks the control plane's ``/healthz`` every ``every`` seconds from a thread of
    its own and keeps how long each answer took: the event loop's longest stall over a
    window (a full collection of Python's cycle collector, a long callback) shows as the
    slowest answer, which a heartbeat's own handling time never includes."""

    def __init__(self, cp: ControlPlaneProc, every: float = 0.1) -> None:
        self.cp = cp
        self.every = every
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            with contextlib.suppress(OSError, ValueError):
                self.cp.get("/healthz", auth=False, timeout=30)
                self.times.append(time.monotonic() - t)
            self._stop.wait(max(0.0, self.every - (time.monotonic() - t)))

    def __enter__(self) -> StallProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> tuple[float | None, float | None]:
        """The slowest answer and the 99th percentile, in ms; None without answers."""
        if not self.times:
            return None, None
        ordered = sorted(self.times)
        return ordered[-1] * 1e3, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3


def measure_window(
    cp: ControlPlaneProc, server: psutil.Process, workers: WorkerPool, window: float
) -> dict[str, Any]:
    """CPU and RSS of the control plane over ``window`` seconds, and what it reports."""
    worker_procs = [psutil.Process(pid) for pid in workers.pids]
    with StallProbe(cp) as probe:
        found = _measure(cp, server, worker_procs, window)
    found["stall_max_ms"], found["stall_p99_ms"] = probe.figures()
    return found


def _measure(
    cp: ControlPlaneProc,
    server: psutil.Process,
    worker_procs: list[psutil.Process],
    window: float,
) -> dict[str, Any]:
    status0 = cp.api("/api/v1/status")
    w0 = time.monotonic()
    c0 = _cpu_seconds([server])
    a0 = _cpu_seconds(worker_procs)
    m0 = _machine_cpu()
    t0 = time.monotonic()
    rss_max = server.memory_info().rss
    while time.monotonic() - t0 < window:
        time.sleep(min(0.5, max(0.0, window - (time.monotonic() - t0))))
        cp.check_alive()
        rss_max = max(rss_max, server.memory_info().rss)
    t1 = time.monotonic()
    c1 = _cpu_seconds([server])
    a1 = _cpu_seconds(worker_procs)
    m1 = _machine_cpu()
    status1 = cp.api("/api/v1/status")
    w1 = time.monotonic()
    wall = t1 - t0
    return {
        "wall": wall,
        "cpu_core": (c1 - c0) / wall,
        "agents_cpu_core": (a1 - a0) / wall,
        "machine": _machine_split(m0, m1),
        "rss_max_mb": rss_max / 1e6,
        "heartbeats_per_s": (status1["heartbeats"] - status0["heartbeats"]) / (w1 - w0),
        "status": status1,
    }


def run_phase(
    cp: ControlPlaneProc,
    workers: WorkerPool,
    n: int,
    phase: Phase,
    args: argparse.Namespace,
    results: list[dict[str, Any]],
) -> None:
    """One phase on a fresh control plane; its result is kept even if clean-up fails."""
    cp.set_heartbeat_interval(phase.server_heartbeat)
    profile = args.profile if phase.gpus and args.profile else None
    server = cp.start(profile=profile)
    health_every = max(1, round(HEALTH_EVERY / args.heartbeat))
    frames = heartbeat_frames(phase.gpus, health_every)
    result = Result(
        agents=n,
        phase=phase.name,
        gpus=phase.gpus,
        frame_bytes=frames["plain"],
        frame_health_bytes=frames["health"],
        frame_first_bytes=frames["first"],
        profiled=profile is not None,
    )
    try:
        ramp = max(1.0, n / args.connect_rate)
        nworkers = len(workers.conns)
        cpu_start = _cpu_seconds([server])
        start = time.monotonic()
        workers.ask(
            30,
            lambda i: {
                "cmd": "connect",
                "address": cp.agent_address,
                "ramp": ramp,
                "offset": i / nworkers,
                "heartbeat": args.heartbeat,
                "ping": phase.ping,
                "gpus": phase.gpus,
                "health_every": health_every,
            },
        )
        deadline = start + ramp + args.ready_timeout
        ready = 0
        while True:
            cp.check_alive()
            with contextlib.suppress(OSError, ValueError):  # busy with the ramp: ask again
                ready = cp.api("/api/v1/status", timeout=30)["nodes"]["ready"]
            if ready >= n:
                break
            if time.monotonic() > deadline:
                counts = workers.ask_all({"cmd": "counts"}, 30)
                reasons = [r for c in counts for r in c["reasons"]]
                raise BenchError(
                    f"{phase.name}: only {ready} of {n} nodes Ready after "
                    f"{time.monotonic() - start:.0f} s; agents' errors: {reasons}"
                )
            time.sleep(1.0)
        result.ready_seconds = time.monotonic() - start
        result.ramp_cpu_core = (_cpu_seconds([server]) - cpu_start) / result.ready_seconds
        log(f"  {phase.name}: {n} nodes Ready in {result.ready_seconds:.1f} s; settling")
        time.sleep(args.settle)
        before = sum(c["ended"] for c in workers.ask_all({"cmd": "counts"}, 30))
        result.ramp_drops = before
        m = measure_window(cp, server, workers, args.window)
        counts = workers.ask_all({"cmd": "counts"}, 30)
        status = m["status"]
        handling = status.get("heartbeat_handling") or {}
        result.window_seconds = m["wall"]
        result.cpu_core = m["cpu_core"]
        result.rss_max_mb = m["rss_max_mb"]
        result.heartbeats_per_s = m["heartbeats_per_s"]
        result.hb_p50_ms = handling.get("p50_ms")
        result.hb_p99_ms = handling.get("p99_ms")
        result.stall_max_ms, result.stall_p99_ms = m["stall_max_ms"], m["stall_p99_ms"]
        result.agents_cpu_core = m["agents_cpu_core"]
        result.machine_busy = m["machine"]["busy"]
        result.machine_steal = m["machine"]["steal"]
        result.ready_at_end = status["nodes"]["ready"]
        result.streams_at_end = status["agent_streams"]
        result.drops = sum(c["ended"] for c in counts) - before
        result.drop_reasons = [r for c in counts for r in c["reasons"]][:5]
        log(
            f"  {phase.name}: CPU {result.cpu_core:.3f} core, RSS {result.rss_max_mb:.0f} MB, "
            f"{result.heartbeats_per_s:.0f} heartbeats/s, drops {result.drops}, /healthz "
            f"slowest {_ms(result.stall_max_ms)} ms (p99 {_ms(result.stall_p99_ms)})"
        )
        if phase.gpus:  # after the window, so the scrapes are not in its figures
            scrape_twice(cp, server, workers, phase, result)
        results.append(asdict(result))
    finally:
        try:
            replies = workers.ask_all({"cmd": "disconnect"}, 120)
        finally:
            cp.stop()
    result.recancelled = sum(r["recancelled"] for r in replies)
    if result.recancelled:
        results[-1]["recancelled"] = result.recancelled
        log(f"  {phase.name}: {result.recancelled} agent sessions needed a second cancel")
    stuck = sum(r["stuck"] for r in replies)
    if stuck:
        raise BenchError(f"{stuck} agent sessions would not stop")


def _ended_counts(workers: WorkerPool) -> tuple[int, int]:
    counts = workers.ask_all({"cmd": "counts"}, 30)
    return sum(c["ended"] for c in counts), sum(c["ping_timeouts"] for c in counts)


def scrape(
    cp: ControlPlaneProc, workers: WorkerPool, ping: float, gzip: bool = False
) -> tuple[float, bytes, int, int]:
    """One /metrics scrape (asking for gzip, as Prometheus does, when ``gzip``): its
    seconds and body as it came, and the agents' streams that ended (all, and on an
    unanswered PING) from its start until a PING interval and a second after it: a
    stream whose PING went unanswered during the scrape ends by then."""
    ended0, pings0 = _ended_counts(workers)
    t0 = time.monotonic()
    body = cp.get("/metrics", timeout=120, gzip=gzip)
    seconds = time.monotonic() - t0
    time.sleep(ping + 1.0)
    ended1, pings1 = _ended_counts(workers)
    return seconds, body, ended1 - ended0, pings1 - pings0


def set_fleet_detail(cp: ControlPlaneProc, value: str | None) -> str | None:
    """Set (None: unset) metrics.fleet_detail through the admin client, as ``llmgw ctl
    config set`` does; None when it took, else the control plane's refusal."""
    client = AdminClient(f"http://{cp.http}", cp.admin_token, timeout=30)
    body: dict[str, object] = {"key": FLEET_DETAIL, "unset": value is None}
    if value is not None:
        body["value"] = value
    try:
        client.set_setting(body)
    except AdminError as exc:
        return str(exc)
    return None


def scrape_twice(
    cp: ControlPlaneProc,
    server: psutil.Process,
    workers: WorkerPool,
    phase: Phase,
    result: Result,
) -> None:
    """The gpu phase's scrapes: with metrics.fleet_detail as it is by default, then on
    (where the control plane has the setting), each with the PINGs it cost the agents."""
    seconds, body, drops, pings = scrape(cp, workers, phase.ping)
    result.metrics_seconds, result.metrics_bytes = seconds, len(body)
    result.metrics_rss_mb = server.memory_info().rss / 1e6
    result.metrics_gpu_samples = _gpu_samples(body)
    result.metrics_drops, result.metrics_ping_timeouts = drops, pings
    log(
        f"  {phase.name}: /metrics (fleet detail by default) in {seconds:.3f} s, "
        f"{len(body):,} bytes, {result.metrics_gpu_samples:,} llmgw_gpu_ samples; "
        f"PING timeouts {pings}, streams ended {drops}"
    )
    refused = set_fleet_detail(cp, "on")
    if refused is not None:
        result.metrics_detail_note = f"not available: one scrape only ({refused})"
        log(f"  {phase.name}: {FLEET_DETAIL} {result.metrics_detail_note}")
        return
    try:
        # As Prometheus scrapes: asking for gzip, and again once every node has beaten
        # since (the nodes' texts kept from the first are written again where their
        # figures moved); then once more asking for plain text, for comparison.
        seconds, packed, drops, pings = scrape(cp, workers, phase.ping, gzip=True)
        time.sleep(phase.server_heartbeat)
        again, _, drops_again, pings_again = scrape(cp, workers, phase.ping, gzip=True)
        time.sleep(phase.server_heartbeat)
        plain, body, drops_plain, pings_plain = scrape(cp, workers, phase.ping)
        # And the first scrape asking for plain text: fleet detail off for one scrape
        # (which forgets the nodes' texts), then on again.
        set_fleet_detail(cp, None)
        cp.get("/metrics", timeout=120)
        set_fleet_detail(cp, "on")
        cold, _, drops_cold, pings_cold = scrape(cp, workers, phase.ping)
    finally:
        set_fleet_detail(cp, None)
    result.metrics_detail_seconds, result.metrics_detail_bytes = seconds, len(body)
    result.metrics_detail_gzip_bytes = len(packed)
    result.metrics_detail_again_seconds = again
    result.metrics_detail_plain_seconds = plain
    result.metrics_detail_plain_first_seconds = cold
    result.metrics_detail_gpu_samples = _gpu_samples(body)
    result.metrics_detail_drops = drops + drops_again + drops_plain + drops_cold
    result.metrics_detail_ping_timeouts = pings + pings_again + pings_plain + pings_cold
    log(
        f"  {phase.name}: /metrics ({FLEET_DETAIL} on, gzip) in {seconds:.3f} s, "
        f"{len(packed):,} bytes; again {phase.server_heartbeat:g} s later in {again:.3f} s; "
        f"plain text in {plain:.3f} s ({cold:.3f} s the first), {len(body):,} bytes, "
        f"{result.metrics_detail_gpu_samples:,} llmgw_gpu_ samples; PING timeouts "
        f"{result.metrics_detail_ping_timeouts}, streams ended {result.metrics_detail_drops}"
    )


def _gpu_samples(body: bytes) -> int:
    return sum(1 for line in body.split(b"\n") if line.startswith(b"llmgw_gpu_"))


def measure_idle(cp: ControlPlaneProc, window: float) -> dict[str, float]:
    """The control plane with no agent at all, for reference."""
    server = cp.start()
    try:
        time.sleep(2)
        c0, t0 = _cpu_seconds([server]), time.monotonic()
        rss = server.memory_info().rss
        while time.monotonic() - t0 < window:
            time.sleep(0.5)
            rss = max(rss, server.memory_info().rss)
        cpu = (_cpu_seconds([server]) - c0) / (time.monotonic() - t0)
        return {"cpu_core": cpu, "rss_max_mb": rss / 1e6}
    finally:
        cp.stop()


def bench_n(n: int, args: argparse.Namespace, phases: list[Phase], out: dict[str, Any]) -> None:
    """Every phase for N agents; ``out`` fills as it goes, so a failure keeps what ran."""
    root = Path(tempfile.mkdtemp(prefix=f"llmgw-bench-{n}-"))
    cp = ControlPlaneProc(root)
    workers: WorkerPool | None = None
    out.update({"agents": n, "root": str(root), "enroll_seconds": 0.0, "phases": []})
    try:
        cp.init()
        node_ids = [f"bench-{i:05d}" for i in range(n)]
        workers = WorkerPool(node_ids, args.workers, root / "agents")
        cp.set_heartbeat_interval(args.heartbeat)
        cp.start()
        log(f"{n} agents: enrolling ({len(workers.conns)} workers)")
        start = time.monotonic()
        replies = workers.ask_all(
            {
                "cmd": "enroll",
                "api": cp.http,
                "admin_token": cp.admin_token,
                "concurrency": args.enroll_concurrency,
            },
            timeout=max(120.0, n * 0.2),
        )
        out["enroll_seconds"] = time.monotonic() - start
        enrolled = sum(r["enrolled"] for r in replies)
        if enrolled != n:
            failures = [f for r in replies for f in r["failures"]]
            raise BenchError(f"only {enrolled} of {n} nodes enrolled: {failures}")
        cp.stop()
        log(f"  enrolled {n} nodes in {out['enroll_seconds']:.1f} s")
        for phase in phases:
            run_phase(cp, workers, n, phase, args, out["phases"])
    finally:
        if workers is not None:
            workers.close()
        cp.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


# --- reporting ------------------------------------------------------------------------


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _gpu_lines(
    n: int, plain: dict[str, Any] | None, gpu: dict[str, Any] | None, idle: dict[str, float] | None
) -> list[str]:
    """The gpu phase against the no-card one, its scrape, and the target (5,000 agents x
    8 cards under one core and 1 GB), measured or extrapolated linearly in N."""
    if gpu is None:
        return []
    lines = []
    cards = f"{n:>6} agents x {gpu['gpus']} cards"
    if gpu.get("profiled"):
        lines.append(f"{cards}: the control plane ran under cProfile: its CPU is inflated")
    if plain is not None:
        extra = gpu["cpu_core"] - plain["cpu_core"]
        rate = gpu["heartbeats_per_s"]
        per_beat = f"{extra / rate * 1e6:.0f} us" if rate >= 1 else "-"
        lines.append(
            f"{cards}, gpu vs {plain['phase']}: CPU {gpu['cpu_core']:.3f} / "
            f"{plain['cpu_core']:.3f} core (+{extra:.3f}), RSS {gpu['rss_max_mb']:.0f} / "
            f"{plain['rss_max_mb']:.0f} MB (+{gpu['rss_max_mb'] - plain['rss_max_mb']:.0f}); "
            f"{per_beat} of CP CPU more per heartbeat; frame {gpu['frame_bytes']:,} / "
            f"{plain['frame_bytes']:,} bytes ({gpu['frame_health_bytes']:,} with health, "
            f"{gpu['frame_first_bytes']:,} a session's first, with its warnings)"
        )
    if gpu.get("metrics_seconds") is not None:
        lines.append(
            f"{cards}: one /metrics scrape after the window (fleet detail by default) took "
            f"{gpu['metrics_seconds']:.3f} s, {gpu['metrics_bytes']:,} bytes, "
            f"{gpu['metrics_gpu_samples']:,} llmgw_gpu_ samples, "
            f"{_count(gpu.get('metrics_ping_timeouts'))} PING timeouts; "
            f"CP RSS {gpu['metrics_rss_mb']:.0f} MB just after it"
        )
    if gpu.get("metrics_detail_seconds") is not None:
        lines.append(
            f"{cards}: with {FLEET_DETAIL} on, as Prometheus asks (gzip): "
            f"{gpu['metrics_detail_seconds']:.3f} s, "
            f"{_count(gpu.get('metrics_detail_gzip_bytes'))} bytes; a heartbeat later "
            f"again in {_secs(gpu.get('metrics_detail_again_seconds'))}; asking for plain "
            f"text {_secs(gpu.get('metrics_detail_plain_seconds'))} (the first "
            f"{_secs(gpu.get('metrics_detail_plain_first_seconds'))}), "
            f"{gpu['metrics_detail_bytes']:,} bytes, "
            f"{gpu['metrics_detail_gpu_samples']:,} llmgw_gpu_ samples; "
            f"{_count(gpu.get('metrics_detail_ping_timeouts'))} PING timeouts"
        )
    elif gpu.get("metrics_detail_note"):
        lines.append(f"{cards}: {FLEET_DETAIL} {gpu['metrics_detail_note']}")
    cpu, rss = gpu["cpu_core"], gpu["rss_max_mb"]
    how = "measured"
    if n < 5000:
        if idle is None:  # the part that does not grow with N is not known
            return lines
        # Linear in N from the idle control plane: CPU per heartbeat falls as N grows
        # (wake-ups are shared), so the CPU figure is an upper bound.
        base = idle["rss_max_mb"]
        cpu, rss = cpu * 5000 / n, base + (rss - base) * 5000 / n
        how = f"linear from {n} agents and the idle control plane"
    ok = cpu < 0.6 and rss < 900
    lines.append(
        f"target at 5000 agents x {gpu['gpus']} cards (under 0.6 core and 900 MB): "
        f"{'met' if ok else 'NOT met'} ({how}: {cpu:.3f} core, {rss:.0f} MB)"
    )
    return lines


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _scrape_pings(r: dict[str, Any]) -> str:
    """The PING timeouts during the gpu phase's scrapes: by default / with fleet detail."""
    if r.get("metrics_ping_timeouts") is None:
        return "-"
    return f"{r['metrics_ping_timeouts']}/{_count(r.get('metrics_detail_ping_timeouts'))}"


def report(
    runs: list[dict[str, Any]], idle: dict[str, float] | None, args: argparse.Namespace
) -> str:
    runs = [run for run in runs if run.get("agents")]
    lines = [
        f"llmgw agent-scale benchmark: {machine()}",
        f"window {args.window:g} s; heartbeat every {args.heartbeat:g} s, HTTP/2 PING every "
        f"{args.ping:g} s; {args.gpus} cards a node in the gpu phase (none in the others), "
        f"their health every {max(1, round(HEALTH_EVERY / args.heartbeat))} heartbeats; "
        f"{args.workers} agent worker processes on the same machine",
    ]
    if idle is not None:
        lines.append(
            f"idle control plane, no agents: CPU {idle['cpu_core']:.3f} core, "
            f"RSS {idle['rss_max_mb']:.0f} MB"
        )
    header = (
        f"{'agents':>6}  {'phase':<9}  {'CP CPU':>6}  {'CP RSS MB':>9}  {'hb/s':>5}  "
        f"{'hb p50 ms':>9}  {'hb p99 ms':>9}  {'stall ms':>8}  {'frame B':>7}  {'+health B':>9}  "
        f"{'agents CPU':>10}  {'busy':>4}  "
        f"{'drops':>5}  {'ready s':>7}  {'ramp CPU':>8}  {'ramp drops':>10}  "
        f"{'scrape PING t/o':>15}"
    )
    lines += ["", header, "-" * len(header)]
    for run in runs:
        for r in run.get("phases", []):
            lines.append(
                f"{r['agents']:>6}  {r['phase']:<9}  {r['cpu_core']:>6.3f}  "
                f"{r['rss_max_mb']:>9.0f}  {r['heartbeats_per_s']:>5.0f}  "
                f"{_ms(r['hb_p50_ms']):>9}  {_ms(r['hb_p99_ms']):>9}  "
                f"{_ms(r.get('stall_max_ms')):>8}  "
                f"{r.get('frame_bytes', 0):>7}  "
                f"{r.get('frame_health_bytes', 0) if r.get('gpus') else '-':>9}  "
                f"{r['agents_cpu_core']:>10.2f}  {r['machine_busy']:>4.0%}  {r['drops']:>5}  "
                f"{r['ready_seconds']:>7.1f}  {r['ramp_cpu_core']:>8.2f}  {r['ramp_drops']:>10}  "
                f"{_scrape_pings(r):>15}"
            )
    lines.append("")
    for run in runs:
        lines.append(
            f"{run['agents']:>6} agents enrolled in {run['enroll_seconds']:.1f} s; streams "
            f"started at {args.connect_rate:g} a second"
        )
    for run in runs:
        by = {r["phase"]: r for r in run.get("phases", [])}
        base, beat = by.get("baseline"), by.get("heartbeat")
        if base and beat:
            extra = beat["cpu_core"] - base["cpu_core"]
            rate = beat["heartbeats_per_s"]
            per_beat = f"{extra / rate * 1e6:.0f} us" if rate >= 1 else "-"
            # A ratio against a near-zero baseline says nothing; show the difference too.
            ratio = (
                f" = x{beat['cpu_core'] / base['cpu_core']:.1f}"
                if base["cpu_core"] >= 0.005
                else ""
            )
            lines.append(
                f"{run['agents']:>6} agents, heartbeat vs baseline: CPU "
                f"{beat['cpu_core']:.3f} / {base['cpu_core']:.3f} core{ratio} "
                f"(+{extra:.3f}), RSS {beat['rss_max_mb']:.0f} / {base['rss_max_mb']:.0f} MB = "
                f"x{beat['rss_max_mb'] / max(base['rss_max_mb'], 1e-9):.2f}; "
                f"{per_beat} of CP CPU per heartbeat over baseline (PINGs included)"
            )
    for run in runs:
        by = {r["phase"]: r for r in run.get("phases", [])}
        plain = by.get("nogpu") or by.get("heartbeat")
        lines += _gpu_lines(run["agents"], plain, by.get("gpu"), idle)
    for run in runs:
        by = {r["phase"]: r for r in run.get("phases", [])}
        plain = by.get("nogpu") or by.get("heartbeat")
        if run["agents"] >= 10000 and plain:
            ok = plain["cpu_core"] < 1.0 and plain["rss_max_mb"] < 1000
            lines.append(
                f"target at {run['agents']} card-less agents (under 1 core and 1 GB): "
                f"{'met' if ok else 'NOT met'} ({plain['cpu_core']:.3f} core, "
                f"{plain['rss_max_mb']:.0f} MB)"
            )
    for run in runs:
        beat = {r["phase"]: r for r in run.get("phases", [])}.get("heartbeat")
        if run["agents"] >= 5000 and beat:
            ok = beat["cpu_core"] < 0.5 and beat["rss_max_mb"] < 500
            lines.append(
                f"target at {run['agents']} agents (under 0.5 core and 500 MB): "
                f"{'met' if ok else 'NOT met'} ({beat['cpu_core']:.3f} core, "
                f"{beat['rss_max_mb']:.0f} MB)"
            )
    lines.append(
        "CP = the control plane process (user+system CPU / wall, 1.0 = one core; RSS max over "
        "the window); hb p50/p99 = /api/v1/status heartbeat_handling (decode + registry "
        "update, last 50,000 heartbeats); stall ms = the slowest of /healthz asked every "
        "0.1 s through the window (the event loop's longest stall); agents CPU = the "
        "worker processes'; busy = the "
        "whole machine's CPU use; drops = agent streams that ended during the window; "
        "frame B = one encoded Heartbeat frame (length prefix and msgpack; with cards, their "
        "moving figures alone, as after a stream's first), +health B = one with the cards' "
        "health (sent a minute apart); "
        "ready s, ramp CPU, ramp drops = from the first connection to every node Ready (and "
        "streams that ended before the window); scrape PING t/o = agents' streams ended on "
        "an unanswered HTTP/2 PING during the gpu phase's /metrics scrape, by default / with "
        f"{FLEET_DETAIL} on ('-': not run)."
    )
    reasons = [
        f"{run['agents']} {r['phase']}: {reason}"
        for run in runs
        for r in run.get("phases", [])
        for reason in r["drop_reasons"][:2]
    ]
    if reasons:
        lines.append("why streams ended (first few): " + "; ".join(reasons))
    for run in runs:
        for r in run.get("phases", []):
            if r.get("recancelled"):
                lines.append(
                    f"{run['agents']} {r['phase']}: {r['recancelled']} agent sessions ignored "
                    "their first cancel when stopped (AgentSession on Python 3.11; see "
                    "docs/performance.md)"
                )
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------


class Stopped(BaseException):
    """The whole benchmark ran past --time-limit, or was told to stop."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


def _check_ports(need: int) -> None:
    """Every agent's stream takes a local port of the loopback's ephemeral range."""
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        if high - low + 1 < need:
            raise BenchError(
                f"{need} agent streams need as many local ports, but the ephemeral range "
                f"holds {high - low + 1} ({low}-{high}): widen net.ipv4.ip_local_port_range"
            )


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < need:
        raise BenchError(
            f"{need} open files are needed but the limit is {want}: raise `ulimit -n` first"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/agents.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("--agents", default="100,1000,5000", help="comma-separated N to run")
    p.add_argument("--window", type=float, default=30.0, help="steady window, seconds")
    p.add_argument("--settle", type=float, default=10.0, help="wait after all Ready, seconds")
    p.add_argument("--heartbeat", type=float, default=5.0, help="heartbeat interval, seconds")
    p.add_argument(
        "--ping",
        type=float,
        default=SessionSettings().ping_interval,
        help="agents' longest gap between HTTP/2 PINGs (one also rides on each heartbeat)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=8,
        help="cards each simulated node reports in the gpu phase (default 8)",
    )
    p.add_argument("--workers", type=int, default=2, help="agent worker processes")
    p.add_argument(
        "--connect-rate",
        type=float,
        # At 250 a second the control plane spends most of a core on handshakes and
        # Registers, PINGs go unanswered for 4 s, and the reconnects can feed on themselves
        # (docs/performance.md); the ramp is not what is measured, so it goes gently.
        default=100.0,
        help="agent connections started a second (default 100)",
    )
    p.add_argument("--enroll-concurrency", type=int, default=4, help="enrollments per worker")
    p.add_argument(
        "--ready-timeout", type=float, default=120.0, help="seconds after the ramp to be Ready"
    )
    p.add_argument(
        "--phases",
        default="baseline,heartbeat",
        help="of baseline, heartbeat, no-ping, nogpu, gpu (default baseline,heartbeat; "
        "nogpu,gpu puts nodes without and with cards side by side)",
    )
    p.add_argument(
        "--profile",
        help="run the gpu phase's control plane under cProfile and write its stats here "
        "(its CPU figure is then inflated)",
    )
    p.add_argument("--idle-window", type=float, default=10.0, help="0-agent window (0: skip)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temporary data dirs")
    p.add_argument(
        "--time-limit", type=float, default=3600.0, help="stop everything after this many s"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(x) for x in args.agents.split(",") if x.strip()]
    catalogue = {
        "baseline": Phase("baseline", SILENT, SILENT, "streams open and Registered, silent"),
        "heartbeat": Phase("heartbeat", args.heartbeat, args.ping, "heartbeats and PINGs"),
        # PINGs still ride on heartbeats here; this phase drops only the standalone ones.
        "no-ping": Phase("no-ping", args.heartbeat, SILENT, "heartbeats, no standalone PINGs"),
        # heartbeat under another name, to stand beside gpu
        "nogpu": Phase("nogpu", args.heartbeat, args.ping, "heartbeats and PINGs, no cards"),
        "gpu": Phase("gpu", args.heartbeat, args.ping, "heartbeats with cards", args.gpus),
    }
    try:
        phases = [catalogue[name.strip()] for name in args.phases.split(",") if name.strip()]
    except KeyError as exc:
        log(f"bench/agents.py: unknown phase {exc}; pick from {', '.join(catalogue)}")
        return 2
    # Unwinding through the finally blocks is what stops the processes and removes the
    # temporary dirs, so a time limit or a SIGTERM takes that way out too.
    signal.signal(signal.SIGALRM, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.alarm(int(args.time_limit))
    runs: list[dict[str, Any]] = []
    idle: dict[str, float] | None = None
    try:
        # The control plane holds a socket per agent, each worker its share, and each
        # inherits this process's limit.
        _raise_fd_limit(max(counts) + 256)
        _check_ports(max(counts) + 1024)
        if args.idle_window > 0:
            root = Path(tempfile.mkdtemp(prefix="llmgw-bench-idle-"))
            try:
                cp = ControlPlaneProc(root)
                cp.init()
                idle = measure_idle(cp, args.idle_window)
            finally:
                shutil.rmtree(root, ignore_errors=True)
        for n in counts:
            runs.append({})
            bench_n(n, args, phases, runs[-1])
    except BenchError as exc:
        log(f"bench/agents.py: {exc}")
        return 1
    except Exception:  # everything is cleaned up by now; say what happened
        log("bench/agents.py: failed:\n" + traceback.format_exc())
        return 1
    except Stopped as exc:
        why = f"the time limit of {args.time_limit:g} s" if str(exc) == "SIGALRM" else str(exc)
        log(f"bench/agents.py: stopped by {why}; cleaned up")
        return 1
    except KeyboardInterrupt:
        log("bench/agents.py: interrupted; cleaned up")
        return 130
    finally:
        signal.alarm(0)
        text = report(runs, idle, args) if runs or idle else ""
        if text:
            print(text, flush=True)
        if args.json:
            Path(args.json).write_text(
                json.dumps({"machine": machine(), "idle": idle, "runs": runs}, indent=2) + "\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
