"""Gateway benchmark: the same wrk load direct to a fake engine, through llmgw, through LiteLLM.

A fast fake OpenAI-compatible engine (``bench/fake_engine.py``: a bare asyncio HTTP/1.1
server answering every completion with prepared bytes, 20 SSE chunks when streamed)
runs on loopback in a process of its own, and wrk (Debian's) drives the same POST load
these ways:

- ``direct``: to the fake engine itself;
- ``llmgw``: through a real control plane's gateway (``llmgw server init`` and ``server
  run``), to a real agent (``llmgw agent run``) that runs the fake engine as its
  llama.cpp (a wrapper script named with ``--engine llama.cpp=PATH``) for a model served
  with ``llmgw ctl model serve`` with 16 slots (``--slots``: as many requests at once as
  the c=16 loads have connections; at 1 the gateway's fair queue holds the other 15 by
  design and the run measures the queue's turns), with a key from ``llmgw ctl keys
  create``: keys, limits, routing and metrics all on the request path. As llama.cpp's
  server does, the fake engine closes its connection after each stream (the gateway
  asks it to), so each streamed request to the replica opens a connection;
- ``llmgw-ext``: through the same gateway to an external provider's endpoint (``llmgw
  ctl model external tiny-ext``), a third fake engine with a key of its own behind it;
- ``llmgw-levels`` (``--levels``): as ``llmgw``, with a key under an organisation, team
  and project that each have limits (requests and tokens a minute, a month's budget,
  models), as the key has, all too high to be reached: what checking four levels costs,
  against the bare key of ``llmgw`` in the same run;
- ``traced`` (``--tracing``): as ``llmgw``, with tracing on (every request a span) to an
  OTLP sink in this process that is up, beside ``llmgw`` with tracing off;
- ``litellm``: through LiteLLM's proxy (``litellm[proxy]`` in its own virtual
  environment, ``~/.cache/llmgw/bench-litellm``, one worker) with the fake engine as its
  deployment.

For each way: latency p50/p99 at concurrency 1, requests/s and p50/p99 at 16 and 64
connections, streamed requests/s at 16, the serving process's CPU time a request, and
its RSS after the load; then llmgw against direct and against LiteLLM, and the issue's
targets, to the replica and to the provider alike.

``--baseline TREE`` starts a second cluster from another checkout (a git worktree of
the commit to compare with) beside the first, and ``--rounds N`` measures both, in
alternating order, N times: on shared cores only a side-by-side run tells a change from
the noise.

    .venv/bin/python bench/gateway.py                       # 10 s a run, all the ways
    .venv/bin/python bench/gateway.py --skip-litellm --json /tmp/gateway.json
    .venv/bin/python bench/gateway.py --skip-litellm --baseline /tmp/perf-base --rounds 3
    .venv/bin/python bench/gateway.py --skip-litellm --skip-external --levels --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gatewayreport import (  # noqa: E402
    fmt,
    report,
    split_profile,
)
from bench.host import machine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FAKE_ENGINE = REPO / "bench" / "fake_engine.py"
LITELLM_VENV = Path.home() / ".cache" / "llmgw" / "bench-litellm"
BODY = '{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'
STREAM_BODY = BODY[:-1] + ',"stream":true}'
EXTERNAL = "tiny-ext"
PATH = "/v1/chat/completions"
# Limits at every level, far above what a run asks (each is checked, none is reached).
HIGH_LIMITS = {"rpm": 10**9, "tpm": 10**9, "budget": 10**15, "models": ["tiny*"]}
# The control plane's event loop forced (``--loop``): uvloop's on a checkout that would
# not choose it, or asyncio's with uvloop kept from being imported.
LAUNCHERS = {
    "uvloop": "import asyncio, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())",
    "asyncio": "import sys; sys.modules['uvloop'] = None",
}
SCHEDULING = """
scheduling:
  interval: 0.5
"""


class BenchError(RuntimeError):
    """The benchmark could not go on; the message says why."""


class Stopped(BaseException):
    """SIGTERM (or the time limit): stop and clean up."""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(step)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def http(
    url: str,
    *,
    token: str | None = None,
    body: str | None = None,
    timeout: float = 10,
) -> tuple[int, bytes]:
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=None if body is None else body.encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def answers(url: str) -> bool:
    try:
        return http(url, timeout=2)[0] == 200
    except OSError:
        return False


# --- processes ---------------------------------------------------------------------------


class Processes:
    """Every process the benchmark starts, each in its own session, stopped at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> psutil.Process:
        logfile = (self.root / f"{name}.log").open("ab")
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        logfile.close()
        self.procs.append((name, popen))
        return psutil.Process(popen.pid)

    def check(self, name: str) -> bool:
        """False while ``name`` runs (so a wait's check can go on); BenchError once not."""
        for n, popen in self.procs:
            if n == name and popen.poll() is not None:
                raise BenchError(f"{name} exited ({popen.returncode}):\n{self.tail(name)}")
        return False

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.root / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_all(self) -> None:
        """Every process group we started, newest first; then anything still running
        from our directory (the agent starts its engines in sessions of their own)."""
        for _name, popen in reversed(self.procs):
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGTERM)
        for _name, popen in reversed(self.procs):
            try:
                popen.wait(8)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(5)
        self.procs = []
        mark = str(self.root)
        for p in psutil.process_iter(["cmdline"]):
            try:
                if p.pid != os.getpid() and any(mark in a for a in p.info["cmdline"] or []):
                    p.kill()
                    p.wait(5)
            except (psutil.Error, OSError):
                pass


def llmgw(*args: str, tree: Path = REPO, timeout: float = 60) -> str:
    """``llmgw ARGS`` as the checkout at ``tree`` has it (``-m`` puts the working
    directory first on the import path, ahead of the virtual environment's install)."""
    out = subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tree,
    )
    if out.returncode != 0:
        raise BenchError(f"llmgw {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
    return out.stdout


def rss_mb(procs: Sequence[psutil.Process]) -> float:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / 1e6


def cpu_seconds(procs: Sequence[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def tree(proc: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [proc, *proc.children(recursive=True)]
    return [proc]


def start_fake_engine(
    procs: Processes, name: str = "engine-direct", key: str = ""
) -> tuple[str, psutil.Process]:
    port = free_port()
    proc = procs.start(
        name,
        [sys.executable, str(FAKE_ENGINE), "--host", "127.0.0.1", "--port", str(port)],
        env={"LLAMA_API_KEY": key},
    )
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: procs.check(name) or answers(base + "/health"), 20, "the engine")
    return base, proc


@dataclasses.dataclass
class Cluster:
    """One control plane under test, its agent and engines, and the key to call it with."""

    label: str
    tree: Path
    commit: str
    loop: str
    base: str
    key: str
    cp: psutil.Process
    agent: psutil.Process
    engines: list[psutil.Process]
    # A key under an organisation, team and project with limits at each (``--levels``).
    levelled: str | None = None


def levelled_key(base: str, admin: str) -> str:
    """A key of project bench/p of organisation bench, each level and the key limited."""
    asks = [
        ("/api/v1/orgs", {"name": "bench"}),
        ("/api/v1/orgs/bench/teams", {"name": "bench"}),
        ("/api/v1/orgs/bench/projects", {"name": "p", "team": "bench"}),
        ("/api/v1/orgs/bench/limits", HIGH_LIMITS),
        ("/api/v1/orgs/bench/teams/bench/limits", HIGH_LIMITS),
        ("/api/v1/orgs/bench/projects/p/limits", HIGH_LIMITS),
        ("/api/v1/keys", {"name": "levels", "org": "bench", "project": "p", **HIGH_LIMITS}),
    ]
    answer = b""
    for path, body in asks:
        status, answer = http(base + path, token=admin, body=json.dumps(body))
        if status not in (200, 201):
            raise BenchError(f"POST {path}: {status} {answer.decode(errors='replace')}")
    return str(json.loads(answer)["key"])


def start_llmgw(
    procs: Processes,
    root: Path,
    tree: Path,
    label: str,
    loop: str,
    index: int = 0,
    levels: bool = False,
    tracing: str | None = None,
    slots: int = 16,
) -> Cluster:
    """A control plane from the checkout at ``tree``, one agent running the fake engine
    as llama.cpp, model ``tiny`` served on it with ``slots`` and Ready, model
    ``tiny-ext`` an external provider (another fake engine, with a key), and a key for
    the gateway (and, with ``levels``, a key under limits at every level)."""
    root = root / label
    root.mkdir()
    data = root / "cp"
    listen = f"127.0.0.1:{free_port()}"
    llmgw(
        "server", "init", "--data-dir", str(data), "--listen", listen,
        "--agent-port", str(free_port()), "--peer-port", str(free_port()), "--yes", tree=tree,
    )  # fmt: skip
    config = data / "server.yaml"
    # Each cluster's engines on ports of their own: two clusters share this one host.
    first = 41000 + 1000 * index
    ports = f"  engine_ports: {first}-{first + 999}\n"
    # ``--tracing``: every request a span, sent to the benchmark's OTLP sink.
    traced = f"tracing:\n  endpoint: {tracing}\n" if tracing else ""
    config.write_text(config.read_text() + SCHEDULING + ports + traced)
    entry = ["-m", "llmgw"]
    if loop in LAUNCHERS:
        entry = ["-c", f"{LAUNCHERS[loop]}; import sys; from llmgw.cli import main; "
                 "sys.exit(main(sys.argv[1:]))"]  # fmt: skip
    cp = procs.start(
        f"{label}-control-plane",
        [sys.executable, *entry, "server", "run", "--data-dir", str(data),
         "--log-level", "warning"],
        cwd=tree,
    )  # fmt: skip
    base = f"http://{listen}"
    wait_for(
        lambda: procs.check(f"{label}-control-plane") or answers(base + "/healthz"), 30, "the CP"
    )
    admin = (data / "admin.token").read_text().strip()

    # The fake engine as llama-server: the agent runs it with llama-server's arguments.
    wrapper = root / "fake-llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_ENGINE} "$@"\n')
    wrapper.chmod(0o755)
    token = llmgw("node", "token", "--data-dir", str(data), tree=tree).strip()
    agent = procs.start(
        f"{label}-agent",
        [sys.executable, "-m", "llmgw", "agent", "run", "--server", listen, "--token", token,
         "--state-dir", str(root / "agent"), "--node-id", "bench",
         "--weights-dir", str(root / "weights"), "--engine", f"llama.cpp={wrapper}",
         "--log-level", "warning"],
        cwd=tree,
    )  # fmt: skip

    def node_ready() -> bool:
        procs.check(f"{label}-agent")
        status, raw = http(base + "/api/v1/nodes", token=admin)
        return status == 200 and any(n["state"] == "Ready" for n in json.loads(raw))

    wait_for(node_ready, 60, "the agent's node to be Ready")

    sys.path.insert(0, str(REPO))
    from tests.support.tinymodel import write_tiny_model

    gguf = write_tiny_model(root / "tiny.gguf")
    llmgw(
        "ctl", "model", "serve", str(gguf), "--name", "tiny", "--context", "512",
        "--slots", str(slots),
        "--memory", "1GiB", "--data-dir", str(data), tree=tree,
    )  # fmt: skip

    def replica_ready() -> dict[str, Any] | None:
        procs.check(f"{label}-agent")
        status, raw = http(base + "/api/v1/replicas", token=admin)
        rows = [r for r in json.loads(raw) if r["model"] == "tiny"] if status == 200 else []
        for row in rows:
            if row["state"] == "failed":
                raise BenchError(f"{row['replica_id']} failed: {row.get('reason')}")
        return next((r for r in rows if r["state"] == "ready"), None)

    wait_for(replica_ready, 60, "the replica of tiny to be ready")

    # The provider: the same fake engine, asking for a key of its own.
    secret = "sk-provider-" + secrets.token_hex(16)
    provider, provider_proc = start_fake_engine(procs, f"{label}-engine-ext", secret)
    key_file = root / "provider.key"
    key_file.write_text(secret + "\n")
    llmgw(
        "ctl", "model", "external", EXTERNAL, "--base-url", provider + "/v1",
        "--key-file", str(key_file), "--data-dir", str(data), tree=tree,
    )  # fmt: skip

    key = json.loads(llmgw("ctl", "keys", "create", "--name", "bench", "--json",
                           "--data-dir", str(data), tree=tree))["key"]  # fmt: skip
    levelled = levelled_key(base, admin) if levels else None
    # The first answer through the gateway may come before its table has the replica.
    for model, with_key in [("tiny", key), (EXTERNAL, key)] + [("tiny", levelled)] * levels:
        body = body_for(model, stream=False)

        def answered(body: str = body, with_key: str | None = with_key) -> bool:
            return http(base + PATH, token=with_key, body=body)[0] == 200

        wait_for(answered, 20, f"a 200 from {model} via llmgw")
    engines = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(FAKE_ENGINE) in " ".join(p.info["cmdline"] or []) and str(root) in
        " ".join(p.info["cmdline"] or [])
    ]  # fmt: skip
    return Cluster(
        label,
        tree,
        commit(tree),
        loop_of(cp),
        base,
        key,
        cp,
        agent,
        [*engines, provider_proc],
        levelled,
    )


@dataclasses.dataclass
class Sink:
    """An OTLP/HTTP collector stand-in that is up: takes every export, decodes nothing."""

    endpoint: str = ""
    posts: int = 0
    bytes: int = 0


@contextlib.contextmanager
def otlp_sink() -> Iterator[Sink]:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    sink = Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            sink.bytes += len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            sink.posts += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sink.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()


def loop_of(proc: psutil.Process) -> str:
    """The event loop a process runs: uvloop's if its library is mapped in, else asyncio's."""
    with contextlib.suppress(OSError):
        if "uvloop" in Path(f"/proc/{proc.pid}/maps").read_text():
            return "uvloop"
    return "asyncio"


def start_litellm(procs: Processes, root: Path, engine: str) -> tuple[str, str, psutil.Process]:
    """LiteLLM's proxy, one worker, the fake engine its deployment of ``tiny``, a master
    key of its own (it refuses to start without one): (base URL, key, process)."""
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        raise BenchError(
            f"LiteLLM is not installed at {binary}; install it with: python3 -m venv "
            f"{LITELLM_VENV} && {LITELLM_VENV}/bin/pip install 'litellm[proxy]'"
        )
    config = root / "litellm.yaml"
    key = "sk-" + secrets.token_hex(32)
    config.write_text(
        "model_list:\n"
        "  - model_name: tiny\n"
        "    litellm_params:\n"
        "      model: openai/tiny\n"
        f"      api_base: {engine}/v1\n"
        "      api_key: x\n"
        "general_settings:\n"
        f"  master_key: {key}\n"
    )
    port = free_port()
    proc = procs.start(
        "litellm",
        [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
         "--num_workers", "1"],
        env={"LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        procs.check("litellm")
        try:
            return http(base + PATH, token=key, body=BODY, timeout=10)[0] == 200
        except OSError:
            return False

    wait_for(up, 180, "LiteLLM's proxy to answer", step=1)
    return base, key, proc


# --- wrk ---------------------------------------------------------------------------------


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if m is None:
        raise BenchError(f"wrk printed a latency it cannot read: {text!r}")
    return float(m[1]) * _UNITS[m[2]]


def parse_wrk(output: str) -> dict[str, Any]:
    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if rps is None:
        raise BenchError(f"wrk printed no Requests/sec:\n{output}")
    out: dict[str, Any] = {"rps": float(rps[1])}
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+(\S+)", output, re.MULTILINE)
        out[f"p{pct}_ms"] = _ms(m[1]) if m else None
    total = re.search(r"(\d+) requests in", output)
    out["requests"] = int(total[1]) if total else 0
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    sock = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    out["non_2xx"] = int(bad[1]) if bad else 0
    out["socket_errors"] = sum(int(x) for x in sock.groups()) if sock else 0
    return out


def body_for(model: str, stream: bool) -> str:
    return (STREAM_BODY if stream else BODY).replace('"tiny"', json.dumps(model), 1)


def lua(path: Path, body: str, key: str) -> Path:
    path.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = '{body}'\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
    )
    return path


# (name, threads, connections, streamed)
RUNS = (
    ("c1", 1, 1, False),
    ("c16", 2, 16, False),
    ("c64", 2, 64, False),
    ("stream16", 2, 16, True),
)


def wrk(url: str, script: Path, threads: int, conns: int, duration: int) -> dict[str, Any]:
    argv = [
        "wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", "--timeout", "10s",
        "--latency", "-s", str(script), url,
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
    if out.returncode != 0:
        raise BenchError(f"wrk failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    return parse_wrk(out.stdout)


def load(
    name: str,
    base: str,
    key: str,
    root: Path,
    duration: int,
    serving: Callable[[], list[psutil.Process]],
    model: str = "tiny",
    runs: Sequence[str] = (),
) -> dict[str, Any]:
    """Every run of the load against one way; RSS of its serving processes after."""
    plain = lua(root / f"{name}-post.lua", body_for(model, stream=False), key)
    streamed = lua(root / f"{name}-stream.lua", body_for(model, stream=True), key)
    # A short warm-up, so pools, caches and lazy imports are not in the first figure.
    wrk(base + PATH, plain, 2, 16, 2)
    result: dict[str, Any] = {}
    for run, threads, conns, stream in RUNS:
        if runs and run not in runs:
            continue
        before = cpu_seconds(serving())
        r = wrk(base + PATH, streamed if stream else plain, threads, conns, duration)
        # CPU time a request, which other work on shared cores moves much less than req/s.
        r["cpu_us"] = 1e6 * (cpu_seconds(serving()) - before) / max(r["requests"], 1)
        result[run] = r
        errors = r["non_2xx"] + r["socket_errors"]
        log(
            f"  {name:9} {run:9} {r['rps']:9.0f} req/s  p50 {fmt(r['p50_ms'])} ms  "
            f"p99 {fmt(r['p99_ms'])} ms  {r['cpu_us']:5.0f} us CPU a request"
            + (f"  ERRORS {errors}" if errors else "")
        )
    result["rss_mb"] = rss_mb([p for top in serving() for p in tree(top)])
    return result


def profile(pid: int, url: str, script: Path, duration: int, out: Path) -> list[str]:
    """py-spy over the control plane under a load of 16 connections: the CPU a request by
    part (``PARTS``), the top functions by own time and by time including callees (from
    its raw, collapsed stacks)."""
    # The checkout's virtual environment has it (make venv), else LiteLLM's.
    found = [p / "py-spy" for p in (Path(sys.executable).parent, LITELLM_VENV / "bin")]
    spy = next((p for p in found if p.exists()), None)
    if spy is None:
        return [f"no py-spy at {found[0]} or {found[1]} (make bench installs it)"]
    record = subprocess.Popen(
        [str(spy), "record", "-p", str(pid), "-d", str(duration + 1), "-r", "200",
         "-f", "raw", "-o", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    served = psutil.Process(pid)
    try:
        time.sleep(0.5)
        before = cpu_seconds([served])
        load = wrk(url, script, 2, 16, duration)
        cpu_us = 1e6 * (cpu_seconds([served]) - before) / max(load["requests"], 1)
    finally:
        record.wait(duration + 30)
    if not out.exists():
        return ["py-spy wrote nothing"]
    return split_profile(out.read_text(), load["requests"], cpu_us)


# --- report -------------------------------------------------------------------------------


def commit(tree: Path = REPO) -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=tree, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "llmgw")
    return head + (" + uncommitted changes in llmgw/" if dirty else "")


# --- main ---------------------------------------------------------------------------------


def _on(loop: str) -> str:
    return "" if loop == "default" else f" ({loop} forced)"


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=int, default=10, help="seconds each wrk run lasts")
    p.add_argument("--skip-litellm", action="store_true", help="measure direct and llmgw only")
    p.add_argument(
        "--skip-external", action="store_true", help="leave out the external provider's way"
    )
    p.add_argument(
        "--runs",
        default=",".join(r[0] for r in RUNS),
        help="which wrk runs, comma-separated (default: all of c1,c16,c64,stream16)",
    )
    p.add_argument("--tree", type=Path, default=REPO, help="the llmgw checkout measured")
    p.add_argument(
        "--slots",
        type=int,
        default=16,
        help="requests the replica of tiny serves at once (default 16, as many as the c=16 "
        "loads have connections; at 1 the gateway's queue holds the other 15 by design)",
    )
    p.add_argument(
        "--loop",
        choices=("default", "uvloop", "asyncio"),
        default="default",
        help="the control plane's event loop: its own choice, or one forced",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="TREE",
        help="also measure a control plane from this checkout (ways base, base-ext), "
        "alternating with the one measured",
    )
    p.add_argument(
        "--baseline-loop", choices=("default", "uvloop", "asyncio"), default="default",
        help="as --loop",
    )  # fmt: skip
    p.add_argument(
        "--levels",
        action="store_true",
        help="also measure way llmgw-levels: a key under an organisation, team and project "
        "with limits at each, beside llmgw's bare key",
    )
    p.add_argument(
        "--tracing",
        action="store_true",
        help="also measure way traced: a control plane from the same checkout with tracing "
        "on (tracing.endpoint, every request sampled) to an OTLP sink that is up, beside "
        "llmgw's, tracing off",
    )
    p.add_argument("--rounds", type=int, default=1, help="measure every llmgw way this often")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    p.add_argument(
        "--profile",
        metavar="PATH",
        help="after the measured runs, py-spy the control plane under the c=16 load for "
        "--duration seconds, print its hot spots and keep the raw stacks at PATH",
    )
    p.add_argument(
        "--profile-load", choices=("c16", "stream16"), default="c16",
        help="the load --profile runs under: plain requests or streams, 16 connections",
    )  # fmt: skip
    p.add_argument(
        "--profile-way", choices=("llmgw", "llmgw-ext"), default="llmgw",
        help="whose requests --profile sends: to the fleet's replica (llmgw) or to the "
        "external provider (llmgw-ext), so the two paths' splits can be set side by side",
    )  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--time-limit", type=float, default=1800, help="stop after this many s")
    args = p.parse_args(argv)
    if args.profile_way == "llmgw-ext" and args.skip_external:
        p.error("--profile-way llmgw-ext profiles the external way: leave out --skip-external")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        log("wrk is not installed (apt install wrk)")
        return 2
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = set(runs) - {r[0] for r in RUNS}
    if unknown:
        log(f"--runs: no run named {', '.join(sorted(unknown))}")
        return 2
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGALRM, _on_signal)
    signal.alarm(int(args.time_limit))
    root = Path(tempfile.mkdtemp(prefix="llmgw-bench-gateway-"))
    procs = Processes(root)
    tree = args.tree.resolve()
    results: dict[str, Any] = {
        "machine": machine(),
        "commit": commit(tree),
        "loop": args.loop,
        "duration_s": args.duration,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "ways": {},
    }
    if args.baseline:
        results["baseline"] = {"commit": commit(args.baseline), "loop": args.baseline_loop}
    title = f"llmgw at {results['commit']}" + _on(args.loop)
    if args.baseline:
        title += f"; base: llmgw at {results['baseline']['commit']}" + _on(args.baseline_loop)
    log(f"llmgw gateway benchmark: {results['machine']}; {title}")
    log(f"wrk runs of {args.duration} s: {', '.join(runs)}")
    code = 0
    stack = contextlib.ExitStack()
    sink: Sink | None = None
    try:
        engine, engine_proc = start_fake_engine(procs)
        log(f"fake engine on {engine}")
        ways: dict[str, list[dict[str, Any]]] = results["ways"]
        ways["direct"] = [
            load("direct", engine, "x", root, args.duration, lambda: [engine_proc], runs=runs)
        ]
        log("starting a control plane and an agent for llmgw")
        clusters = [
            start_llmgw(procs, root, tree, "llmgw", args.loop, levels=args.levels, slots=args.slots)
        ]
        if args.baseline:
            log(f"starting a control plane and an agent from {args.baseline}")
            clusters.append(
                start_llmgw(
                    procs,
                    root,
                    args.baseline.resolve(),
                    "base",
                    args.baseline_loop,
                    1,
                    slots=args.slots,
                )
            )
        if args.tracing:
            sink = stack.enter_context(otlp_sink())
            log(f"starting a control plane and an agent with tracing on, to {sink.endpoint}")
            clusters.append(
                start_llmgw(
                    procs,
                    root,
                    tree,
                    "traced",
                    args.loop,
                    2,
                    tracing=sink.endpoint,
                    slots=args.slots,
                )
            )
        for c in clusters:
            results.setdefault("loops", {})[c.label] = c.loop
            log(f"{c.label}: llmgw at {c.commit} from {c.tree}, on {c.loop}'s event loop")
        for i in range(args.rounds):
            # Alternate which cluster goes first, so neither always has the warmer machine.
            order = clusters if i % 2 == 0 else clusters[::-1]
            for c in order:
                ways_of = [("", "tiny", c.key)]
                if c.levelled is not None:
                    # Beside the bare key, alternating which goes first.
                    levelled = ("-levels", "tiny", c.levelled)
                    ways_of = [*ways_of, levelled] if i % 2 == 0 else [levelled, *ways_of]
                if not args.skip_external:
                    ways_of.append(("-ext", EXTERNAL, c.key))
                for suffix, model, key in ways_of:
                    name = c.label + suffix
                    cp = c.cp
                    r = load(
                        name, c.base, key, root, args.duration,
                        lambda: [cp], model=model, runs=runs,  # noqa: B023 (called at once)
                    )  # fmt: skip
                    r["agent_rss_mb"] = rss_mb([c.agent])
                    r["engine_rss_mb"] = rss_mb(c.engines)
                    ways.setdefault(name, []).append(r)
        if args.profile:
            cp = clusters[0].cp
            log(
                f"profiling the control plane (pid {cp.pid}) under {args.profile_load} "
                f"of {args.profile_way} for {args.duration} s"
            )
            load_kind = "stream" if args.profile_load == "stream16" else "post"
            hot = profile(
                cp.pid,
                clusters[0].base + PATH,
                root / f"{args.profile_way}-{load_kind}.lua",
                args.duration,
                Path(args.profile),
            )
            results["profile"] = hot
            log("\n".join(hot))
        if args.skip_litellm:
            log("LiteLLM skipped (--skip-litellm)")
        else:
            try:
                log("starting LiteLLM's proxy")
                lbase, lkey, lproc = start_litellm(procs, root, engine)
                ways["litellm"] = [
                    load("litellm", lbase, lkey, root, args.duration, lambda: [lproc], runs=runs)
                ]
            except BenchError as exc:
                log(f"LiteLLM not measured: {exc}")
                log(procs.tail("litellm"))
                ways["litellm"] = [{"error": str(exc).splitlines()[0]}]
        print()
        print(f"llmgw gateway benchmark: {results['machine']}; {title}")
        loops = ", ".join(f"{k} on {v}" for k, v in results.get("loops", {}).items())
        print(
            f"{args.duration} s a run; latencies in ms; CPU us: the serving process's CPU time "
            f"a request; RSS after the load (llmgw: control plane); {loops}"
        )
        if sink is not None:
            results["tracing_sink"] = {"posts": sink.posts, "bytes": sink.bytes}
            print(f"traced: its spans reached the OTLP sink in {sink.posts} exports, "
                  f"{sink.bytes / 1e6:.1f} MB")  # fmt: skip
        print("\n".join(report(results)))
    except (BenchError, KeyboardInterrupt, Stopped) as exc:
        log(f"stopped: {type(exc).__name__}: {exc}")
        for name, _popen in procs.procs:
            if name.endswith(("control-plane", "agent")):
                log(f"--- {name} log tail:\n{procs.tail(name)}")
        code = 1
    finally:
        signal.alarm(0)
        procs.stop_all()
        stack.close()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
