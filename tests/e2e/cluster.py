"""Real processes on loopback: a control plane and agents, started and stopped by tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ports import free_port
from tests.support.procs import stop_process

LLMGW = [sys.executable, "-m", "llmgw"]


def worker() -> int:
    """This pytest-xdist worker's number (0 when the tests run in one process)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name[2:].isdigit() else 0


def engine_ports(use: int = 0) -> str:
    """A hundred engine ports for this worker's control planes, apart from every other
    worker's, so two tests running at once never hand their engines the same port: ``use``
    0 for a cluster as `server init` writes it, 1 for the catalog's tests, 2 for the admin
    pages' cluster (which lives through the other tests of its worker). They lie below
    the kernel's ephemeral range (32768-60999): a port the kernel hands a client socket
    or a ``free_port()`` server would be found taken by an engine, which fails the
    replica once before the control plane picks another port."""
    first = 22000 + (worker() * 3 + use) * 100
    return f"{first}-{first + 99}"


def wait_for(check: Callable[[], Any], timeout: float, what: str, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def run(
    *args: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*LLMGW, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"llmgw {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    log: Path

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.popen.pid, sig)

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGCONT)  # a stopped process cannot exit
        stop_process(self.popen)


STRAY_MARK = "LLMGW_TEST_ROOT"


def spawn(
    args: list[str],
    log: Path,
    prefix: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Proc:
    fh = log.open("a")
    # Marked with the test's folder, which its engines inherit: kill_strays finds the
    # ones whose command line names no file of the test (an RPC worker's).
    marked = {**(env if env is not None else os.environ), STRAY_MARK: str(log.parent)}
    popen = subprocess.Popen(
        [*(prefix or []), *LLMGW, *args],
        stdout=fh,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=marked,
    )
    fh.close()
    return Proc(popen, log)


@dataclass
class Cluster:
    root: Path
    heartbeat_interval: float = 1.0
    http_port: int = field(default_factory=free_port)
    agent_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    name: str = "cp-a"
    # The address it listens on and advertises (another than loopback when it runs in a
    # network namespace, or is reached from one).
    host: str = "127.0.0.1"
    # More `server init` flags (``--store postgres --dsn ...``).
    init_args: list[str] = field(default_factory=list)
    server: Proc | None = None
    agents: dict[str, Proc] = field(default_factory=dict)
    # A command the control plane runs under (``prlimit --nofile=1024:1024 --``).
    server_prefix: list[str] = field(default_factory=list)

    @property
    def data_dir(self) -> Path:
        return self.root / "cp"

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.http_port}"

    def init(self) -> str:
        out = run(
            "server",
            "init",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.listen,
            "--agent-port",
            str(self.agent_port),
            "--peer-port",
            str(self.peer_port),
            "--name",
            self.name,
            *self.init_args,
            "--yes",
        )
        self._settle_config()
        return out.stdout

    def _settle_config(self) -> None:
        """The test's heartbeat; engine ports of this worker's own; and no firewall
        table: every agent of every test runs as root on this one machine
        (tests/agent/test_firewall_netns.py tests it)."""
        cfg = self.data_dir / "server.yaml"
        text = cfg.read_text().replace(
            "heartbeat_interval: 5.0", f"heartbeat_interval: {self.heartbeat_interval}"
        )
        text = text.replace("engine_ports: 41000-41999", f"engine_ports: {engine_ports()}")
        cfg.write_text(text.replace("firewall:\n  enabled: true", "firewall:\n  enabled: false"))

    def join_as_standby(self, leader: Cluster) -> None:
        """``server join`` this control plane to ``leader``'s cluster (then start it)."""
        token = run(
            "server", "token", "--data-dir", str(leader.data_dir), "--server", leader.listen
        ).stdout.strip()
        run(
            "server",
            "join",
            "--server",
            leader.listen,
            "--token",
            token,
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.listen,
            "--agent-port",
            str(self.agent_port),
            "--peer-port",
            str(self.peer_port),
            "--advertise",
            self.host,
            "--name",
            self.name,
        )
        # Admin tokens are the cluster's (their hashes are in the copied store); the test
        # keeps the leader's beside the standby's data dir for its own calls.
        (self.data_dir / "admin.token").write_text(leader.admin_token)
        self._settle_config()

    @property
    def admin_token(self) -> str:
        return (self.data_dir / "admin.token").read_text().strip()

    def start_server(self) -> Proc:
        if self.server:
            self.server.stop()
        self.server = spawn(
            ["server", "run", "--data-dir", str(self.data_dir)],
            self.root / "server.log",
            self.server_prefix,
        )
        wait_for(self._up, 20, "the control plane to answer")
        return self.server

    def _up(self) -> bool:
        assert self.server is not None
        if not self.server.alive():
            raise AssertionError("control plane exited:\n" + self.server.text())
        try:
            self.api("/healthz", auth=False)
        except OSError:
            return False
        return True

    def api(
        self,
        path: str,
        *,
        auth: bool = True,
        token: str | None = None,
        body: dict[str, Any] | None = None,
        method: str | None = None,
    ) -> Any:
        headers = {"content-type": "application/json"}
        if auth:
            headers["authorization"] = f"Bearer {token or self.admin_token}"
        req = urllib.request.Request(
            f"http://{self.listen}{path}",
            headers=headers,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def api_error(
        self,
        path: str,
        *,
        auth: bool = True,
        token: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> tuple[int, Any]:
        """The status and JSON body of a request that must fail."""
        try:
            self.api(path, auth=auth, token=token, body=body)
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read())
        raise AssertionError(f"{path} did not fail")

    def post(
        self, path: str, data: bytes, token: str | None, timeout: float = 60
    ) -> tuple[int, dict[str, str], Any]:
        """A raw POST with ``token`` (a key, the admin token, or none): its status,
        headers and JSON answer (the text, when not JSON), failing or not."""
        headers = {"content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        req = urllib.request.Request(f"http://{self.listen}{path}", data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, got, raw = resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            with exc:
                status, got, raw = exc.code, dict(exc.headers), exc.read()
        try:
            return status, got, json.loads(raw)
        except ValueError:
            return status, got, raw.decode("utf-8", "replace")

    def token(self, ttl: str = "1h") -> str:
        return run("node", "token", "--ttl", ttl, "--data-dir", str(self.data_dir)).stdout.strip()

    def state_dir(self, node_id: str) -> Path:
        return self.root / f"agent-{node_id}"

    def start_agent(
        self,
        node_id: str,
        token: str | None = None,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ) -> Proc:
        """``prefix``: a command the agent runs under (``ip netns exec NS``)."""
        args = [
            "agent",
            "run",
            "--state-dir",
            str(self.state_dir(node_id)),
            "--node-id",
            node_id,
            "--weights-dir",
            str(self.root / f"weights-{node_id}"),
        ]
        if token:
            args += ["--server", self.listen, "--token", token]
        args += extra or []
        if node_id in self.agents:
            self.agents[node_id].stop()
        proc = spawn(args, self.root / f"agent-{node_id}.log", prefix, env)
        self.agents[node_id] = proc
        return proc

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["id"]: n for n in self.api("/api/v1/nodes")}

    def wait_state(self, node_id: str, state: str, timeout: float) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            try:
                node = self.nodes().get(node_id)
            except OSError:
                return None
            return node if node and node["state"] == state else None

        return wait_for(check, timeout, f"node {node_id} to be {state}")  # type: ignore[no-any-return]

    def stop(self) -> None:
        for proc in self.agents.values():
            proc.stop()
        if self.server:
            self.server.stop()
        kill_strays(self.root)


def kill_strays(root: Path) -> None:
    """Engines outlive their agent by design; a test's must not outlive the test."""
    import psutil

    mark = str(root)
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            named = any(mark in arg for arg in p.info["cmdline"] or [])
            home = p.environ().get(STRAY_MARK, "")
            if named or home == mark or home.startswith(mark + os.sep):
                p.kill()
                p.wait(5)
        except (psutil.Error, OSError):
            pass
