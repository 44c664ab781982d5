"""Gateway benchmark: the same wrk load direct to a fake engine, through llmgw, through LiteLLM.

A fast fake OpenAI-compatible engine (``bench/fake_engine.py``: a bare asyncio HTTP/1.1
server answering every completion with prepared bytes, 20 SSE chunks when streamed)
runs on loopback in a process of its own, and wrk (Debian's) drives the same POST load
three ways:

- ``direct``: to the fake engine itself;
- ``llmgw``: through a real control plane's gateway (``llmgw server init`` and ``server
  run``), to a real agent (``llmgw agent run``) that runs the fake engine as its
  llama.cpp (a wrapper script named with ``--engine llama.cpp=PATH``) for a model served
  with ``llmgw ctl model serve``, with a key from ``llmgw ctl keys create``: keys, limits,
  routing all on the request path;
- ``litellm``: through LiteLLM's proxy (``litellm[proxy]`` in its own virtual
  environment, ``~/.cache/llmgw/bench-litellm``, one worker) with the fake engine as its
  deployment.

For each way: latency p50/p99 at concurrency 1, requests/s and p50/p99 at 16 and 64
connections, streamed requests/s at 16, and the RSS of the serving process after the
load; then llmgw against direct and against LiteLLM, and the issue's targets.

    .venv/bin/python bench/gateway.py                       # 10 s a run, all three ways
    .venv/bin/python bench/gateway.py --skip-litellm --json /tmp/gateway.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
FAKE_ENGINE = REPO / "bench" / "fake_engine.py"
LITELLM_VENV = Path.home() / ".cache" / "llmgw" / "bench-litellm"
BODY = '{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'
STREAM_BODY = BODY[:-1] + ',"stream":true}'
PATH = "/v1/chat/completions"
# The targets for one gateway process.
TARGET_ADDED_P50_MS = 0.7
TARGET_RPS_C16 = 2000.0
TARGET_STREAM_RPS_C16 = 1500.0
TARGET_VS_LITELLM = 20.0
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
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> psutil.Process:
        logfile = (self.root / f"{name}.log").open("ab")
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
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


def llmgw(*args: str, timeout: float = 60) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
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


def tree(proc: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [proc, *proc.children(recursive=True)]
    return [proc]


def start_fake_engine(procs: Processes) -> tuple[str, psutil.Process]:
    port = free_port()
    proc = procs.start(
        "engine-direct",
        [sys.executable, str(FAKE_ENGINE), "--host", "127.0.0.1", "--port", str(port)],
        env={"LLAMA_API_KEY": ""},
    )
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: procs.check("engine-direct") or answers(base + "/health"), 20, "the engine")
    return base, proc


def start_llmgw(procs: Processes, root: Path) -> tuple[str, str, list[psutil.Process]]:
    """A control plane, one agent running the fake engine as llama.cpp, model ``tiny``
    served on it and Ready, and a key: (gateway base URL, key, [cp, agent, engine])."""
    data = root / "cp"
    listen = f"127.0.0.1:{free_port()}"
    llmgw(
        "server", "init", "--data-dir", str(data), "--listen", listen,
        "--agent-port", str(free_port()), "--yes",
    )  # fmt: skip
    config = data / "server.yaml"
    config.write_text(config.read_text() + SCHEDULING)
    cp = procs.start(
        "control-plane",
        [sys.executable, "-m", "llmgw", "server", "run", "--data-dir", str(data),
         "--log-level", "warning"],
    )  # fmt: skip
    base = f"http://{listen}"
    wait_for(lambda: procs.check("control-plane") or answers(base + "/healthz"), 30, "the CP")
    admin = (data / "admin.token").read_text().strip()

    # The fake engine as llama-server: the agent runs it with llama-server's arguments.
    wrapper = root / "fake-llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_ENGINE} "$@"\n')
    wrapper.chmod(0o755)
    token = llmgw("node", "token", "--data-dir", str(data)).strip()
    agent = procs.start(
        "agent",
        [sys.executable, "-m", "llmgw", "agent", "run", "--server", listen, "--token", token,
         "--state-dir", str(root / "agent"), "--node-id", "bench",
         "--weights-dir", str(root / "weights"), "--engine", f"llama.cpp={wrapper}",
         "--log-level", "warning"],
    )  # fmt: skip

    def node_ready() -> bool:
        procs.check("agent")
        status, raw = http(base + "/api/v1/nodes", token=admin)
        return status == 200 and any(n["state"] == "Ready" for n in json.loads(raw))

    wait_for(node_ready, 60, "the agent's node to be Ready")

    sys.path.insert(0, str(REPO))
    from tests.support.tinymodel import write_tiny_model

    gguf = write_tiny_model(root / "tiny.gguf")
    llmgw(
        "ctl", "model", "serve", str(gguf), "--name", "tiny", "--context", "256",
        "--memory", "1GiB", "--data-dir", str(data),
    )  # fmt: skip

    def replica_ready() -> dict[str, Any] | None:
        procs.check("agent")
        status, raw = http(base + "/api/v1/replicas", token=admin)
        rows = [r for r in json.loads(raw) if r["model"] == "tiny"] if status == 200 else []
        for row in rows:
            if row["state"] == "failed":
                raise BenchError(f"{row['replica_id']} failed: {row.get('reason')}")
        return next((r for r in rows if r["state"] == "ready"), None)

    wait_for(replica_ready, 60, "the replica of tiny to be ready")
    key = json.loads(llmgw("ctl", "keys", "create", "--name", "bench", "--json",
                           "--data-dir", str(data)))["key"]  # fmt: skip
    # The first answer through the gateway may come before its table has the replica.
    wait_for(lambda: http(base + PATH, token=key, body=BODY)[0] == 200, 20, "a 200 via llmgw")
    engines = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(FAKE_ENGINE) in " ".join(p.info["cmdline"] or []) and str(root) in
        " ".join(p.info["cmdline"] or [])
    ]  # fmt: skip
    return base, key, [cp, agent, *engines]


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
) -> dict[str, Any]:
    """Every run of the load against one way; RSS of its serving processes after."""
    plain = lua(root / f"{name}-post.lua", BODY, key)
    streamed = lua(root / f"{name}-stream.lua", STREAM_BODY, key)
    # A short warm-up, so pools, caches and lazy imports are not in the first figure.
    wrk(base + PATH, plain, 2, 16, 2)
    result: dict[str, Any] = {}
    for run, threads, conns, stream in RUNS:
        r = wrk(base + PATH, streamed if stream else plain, threads, conns, duration)
        result[run] = r
        errors = r["non_2xx"] + r["socket_errors"]
        log(
            f"  {name:8} {run:9} {r['rps']:9.0f} req/s  p50 {_fmt(r['p50_ms'])} ms  "
            f"p99 {_fmt(r['p99_ms'])} ms" + (f"  ERRORS {errors}" if errors else "")
        )
    result["rss_mb"] = rss_mb([p for top in serving() for p in tree(top)])
    return result


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# --- profile ------------------------------------------------------------------------------


_OUTER = (
    "_run_module_as_main ", "_run_code ", "<module> ", "entry ", "main ", "run ",
    "cmd_server_run ", "Runner.run ", "BaseEventLoop.run", "BaseEventLoop._run_once ",
    "Handle._run ",
)  # fmt: skip


def profile(pid: int, url: str, script: Path, duration: int, out: Path) -> list[str]:
    """py-spy over the control plane under the c=16 load: the top functions by own time
    and by time including callees (from its raw, collapsed stacks)."""
    spy = LITELLM_VENV / "bin" / "py-spy"
    if not spy.exists():
        return [f"no py-spy at {spy} ({LITELLM_VENV}/bin/pip install py-spy)"]
    record = subprocess.Popen(
        [str(spy), "record", "-p", str(pid), "-d", str(duration + 1), "-r", "200",
         "-f", "raw", "-o", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(0.5)
        wrk(url, script, 2, 16, duration)
    finally:
        record.wait(duration + 30)
    if not out.exists():
        return ["py-spy wrote nothing"]
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        if not stack.strip():
            idle += n  # no Python frame: waiting in the kernel (epoll)
            continue
        frames = [re.sub(r" \((.*/)?([^/]+\.py):\d+\)", r" (\2)", f) for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{total} samples, {100 * idle / max(total, 1):.1f}% idle; own time:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(15)]
    lines.append("including callees (the event loop and the entry point left out):")
    shown = [(f, n) for f, n in inclusive.most_common() if not f.startswith(_OUTER)]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in shown[:25]]
    return lines


# --- report -------------------------------------------------------------------------------


def machine() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = psutil.virtual_memory().total / 1024**3
    return f"{psutil.cpu_count()} CPUs ({model}), {mem:.1f} GiB, Python {platform.python_version()}"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=REPO, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "llmgw")
    return head + (" + uncommitted changes in llmgw/" if dirty else "")


def report(results: dict[str, Any]) -> list[str]:
    ways = results["ways"]
    lines = [
        "way        c=1 p50  c=1 p99   c=16 req/s  p50    p99     c=64 req/s  p50    p99"
        "     stream c=16 req/s  RSS MB",
    ]
    for name, r in ways.items():
        if "error" in r:
            lines.append(f"{name:9}  not measured: {r['error']}")
            continue
        c1, c16, c64, s16 = r["c1"], r["c16"], r["c64"], r["stream16"]
        lines.append(
            f"{name:9}  {_fmt(c1['p50_ms']):>7}  {_fmt(c1['p99_ms']):>7}  "
            f"{c16['rps']:11.0f}  {_fmt(c16['p50_ms'], 2):>5}  {_fmt(c16['p99_ms'], 2):>6}  "
            f"{c64['rps']:11.0f}  {_fmt(c64['p50_ms'], 2):>5}  {_fmt(c64['p99_ms'], 2):>6}  "
            f"{s16['rps']:20.0f}  {r['rss_mb']:6.0f}"
        )
    errors = {
        f"{n}/{run}": r[run]["non_2xx"] + r[run]["socket_errors"]
        for n, r in ways.items()
        if "error" not in r
        for run, *_ in RUNS
        if r[run]["non_2xx"] + r[run]["socket_errors"]
    }
    lines.append(f"errors (non-2xx or socket): {errors or 'none'}")
    gw, direct, lite = ways.get("llmgw", {}), ways.get("direct", {}), ways.get("litellm", {})
    targets: dict[str, Any] = {}
    if "error" not in gw and "error" not in direct:
        added = gw["c1"]["p50_ms"] - direct["c1"]["p50_ms"]
        added99 = gw["c1"]["p99_ms"] - direct["c1"]["p99_ms"]
        lines.append(
            f"llmgw vs direct: {added:+.3f} ms p50 ({added99:+.3f} ms p99) at c=1; "
            f"req/s x{gw['c16']['rps'] / direct['c16']['rps']:.3f} at c=16, "
            f"x{gw['c64']['rps'] / direct['c64']['rps']:.3f} at c=64, "
            f"x{gw['stream16']['rps'] / direct['stream16']['rps']:.3f} streamed at c=16"
        )
        targets["added_p50_ms"] = (added, added <= TARGET_ADDED_P50_MS, TARGET_ADDED_P50_MS)
    if "error" not in gw and lite and "error" not in lite:
        added = lite["c1"]["p50_ms"] - direct["c1"]["p50_ms"]
        ratio = gw["c16"]["rps"] / lite["c16"]["rps"]
        lines.append(
            f"llmgw vs LiteLLM: req/s x{ratio:.1f} at c=16, "
            f"x{gw['c64']['rps'] / lite['c64']['rps']:.1f} at c=64, "
            f"x{gw['stream16']['rps'] / lite['stream16']['rps']:.1f} streamed at c=16; "
            f"LiteLLM adds {added:.2f} ms p50 at c=1"
        )
        targets["vs_litellm"] = (ratio, ratio >= TARGET_VS_LITELLM, TARGET_VS_LITELLM)
    if "error" not in gw:
        rps, srps = gw["c16"]["rps"], gw["stream16"]["rps"]
        targets["rps_c16"] = (rps, rps >= TARGET_RPS_C16, TARGET_RPS_C16)
        targets["stream_rps_c16"] = (srps, srps >= TARGET_STREAM_RPS_C16, TARGET_STREAM_RPS_C16)
    words = {
        "added_p50_ms": "added latency p50 at c=1 <= {t} ms",
        "rps_c16": ">= {t:,.0f} req/s at c=16",
        "stream_rps_c16": ">= {t:,.0f} streamed req/s at c=16",
        "vs_litellm": ">= {t:.0f}x LiteLLM's req/s at c=16",
    }
    for name, (value, met, target) in targets.items():
        lines.append(
            f"target {words[name].format(t=target)}: {'met' if met else 'NOT met'} ({value:,.3f})"
        )
    results["targets"] = {
        n: {"value": v, "met": m, "target": t} for n, (v, m, t) in targets.items()
    }
    return lines


# --- main ---------------------------------------------------------------------------------


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=int, default=10, help="seconds each wrk run lasts")
    p.add_argument("--skip-litellm", action="store_true", help="measure direct and llmgw only")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    p.add_argument(
        "--profile",
        metavar="PATH",
        help="after the measured runs, py-spy the control plane under the c=16 load for "
        "--duration seconds, print its hot spots and keep the raw stacks at PATH",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--time-limit", type=float, default=1200, help="stop after this many s")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        log("wrk is not installed (apt install wrk)")
        return 2
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGALRM, _on_signal)
    signal.alarm(int(args.time_limit))
    root = Path(tempfile.mkdtemp(prefix="llmgw-bench-gateway-"))
    procs = Processes(root)
    results: dict[str, Any] = {
        "machine": machine(),
        "commit": commit(),
        "duration_s": args.duration,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "ways": {},
    }
    log(f"llmgw gateway benchmark: {results['machine']}; llmgw at {results['commit']}")
    log(f"wrk runs of {args.duration} s: c=1 (-t1), c=16 and c=64 (-t2), streamed c=16 (-t2)")
    code = 0
    try:
        engine, engine_proc = start_fake_engine(procs)
        log(f"fake engine on {engine}")
        ways = results["ways"]
        ways["direct"] = load("direct", engine, "x", root, args.duration, lambda: [engine_proc])
        log("starting a control plane and an agent for llmgw")
        base, key, (cp, agent, *engines) = start_llmgw(procs, root)
        ways["llmgw"] = load("llmgw", base, key, root, args.duration, lambda: [cp])
        ways["llmgw"]["agent_rss_mb"] = rss_mb([agent])
        ways["llmgw"]["engine_rss_mb"] = rss_mb(engines)
        if args.profile:
            log(f"profiling the control plane (pid {cp.pid}) under c=16 for {args.duration} s")
            hot = profile(
                cp.pid, base + PATH, root / "llmgw-post.lua", args.duration, Path(args.profile)
            )
            results["profile"] = hot
            log("\n".join(hot))
        if args.skip_litellm:
            log("LiteLLM skipped (--skip-litellm)")
        else:
            try:
                log("starting LiteLLM's proxy")
                lbase, lkey, lproc = start_litellm(procs, root, engine)
                ways["litellm"] = load("litellm", lbase, lkey, root, args.duration,
                                       lambda: [lproc])  # fmt: skip
            except BenchError as exc:
                log(f"LiteLLM not measured: {exc}")
                log(procs.tail("litellm"))
                ways["litellm"] = {"error": str(exc).splitlines()[0]}
        print()
        print(f"llmgw gateway benchmark: {results['machine']}; llmgw at {results['commit']}")
        print(
            f"{args.duration} s a run; latencies in ms; RSS after the load (llmgw: control plane)"
        )
        print("\n".join(report(results)))
    except (BenchError, KeyboardInterrupt, Stopped) as exc:
        log(f"stopped: {type(exc).__name__}: {exc}")
        for name in ("control-plane", "agent"):
            if (root / f"{name}.log").exists():
                log(f"--- {name} log tail:\n{procs.tail(name)}")
        code = 1
    finally:
        signal.alarm(0)
        procs.stop_all()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
