"""MCP gateway benchmark: a tool call through llmgw's ``/mcp`` against the same call made
to the tool server directly, in one run, with the same client and the same tool server.

The tool server is a bare aiohttp MCP server (handshake era, a session id, JSON
answers, ``echo`` answered with prepared bytes: as fast as a tool server gets, so what
llmgw adds is not hidden by the tool) in a process of its own. The gateway is llmgw's
a real control plane (``llmgw server run``: its listener, the gateway's key check, the
grant, the rate window, the breaker, our streamable-HTTP client of the tool server, the
call's audit entry), with the tool server added as ``bench`` (``ctl mcp add``) and a key
granted ``bench.*`` (``ctl keys limits --tools``); with ``--rate`` the server has a rate
far above the load, so the window is counted on every call. No guard policy: a key
without policies does not ask the guard at all.

One client (aiohttp, keep-alive) makes ``--calls`` sequential ``tools/call`` requests
each way, alternating ways over ``--rounds`` rounds; p50 and p99 of each, calls a
second, and the p50 added against the target (under 1 ms).

    .venv/bin/python bench/mcp.py
    .venv/bin/python bench/mcp.py --calls 5000 --rounds 5 --rate
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

TARGET_ADDED_P50_MS = 1.0
REPO = Path(__file__).resolve().parent.parent
ECHO = {"content": [{"type": "text", "text": "pong"}], "isError": False}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ the tool server


def serve_tools(port: int) -> None:
    async def handle(request: web.Request) -> web.Response:
        message = json.loads(await request.read())
        if "id" not in message:
            return web.Response(status=202)
        method = message["method"]
        if method == "initialize":
            result: object = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench", "version": "0"},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
        else:
            result = ECHO
        body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
        return web.Response(
            body=body.encode(), content_type="application/json", headers={"Mcp-Session-Id": "s1"}
        )

    app = web.Application()
    app.router.add_post("/mcp", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# ------------------------------------------------------------------------ the gateway


def llmgw(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", *args], cwd=REPO, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"llmgw {' '.join(args)}: {done.stderr.strip() or done.stdout}")
    return done.stdout


def start_llmgw(root: Path, tools_url: str, rate: bool) -> tuple[subprocess.Popen[bytes], str, str]:
    """A real control plane (``llmgw server run``) with the tool server added as
    ``bench`` and a key granted ``bench.*``, as an operator does it: its process, its
    ``/mcp`` and the key."""
    data = root / "cp"
    port = free_port()
    llmgw("server", "init", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}",
          "--agent-port", str(free_port()), "--yes")  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "server", "run", "--data-dir", str(data),
         "--log-level", "warning"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_port(port, proc)
    given = ["--data-dir", str(data), "--json"]
    limit = ["--rate", str(10**6)] if rate else []
    llmgw("ctl", "mcp", "add", "bench", tools_url, *limit, *given)
    made = json.loads(llmgw("ctl", "keys", "create", "--name", "bench", *given))
    llmgw("ctl", "keys", "limits", made["id"], "--tools", "bench.*", *given)
    return proc, f"http://127.0.0.1:{port}/mcp", made["key"]


# ----------------------------------------------------------------------- the client


async def calls(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], n: int
) -> list[float]:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}
    )
    times: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as answer:
            got = await answer.read()
        times.append(time.perf_counter() - start)
        if b'"result"' not in got:
            raise SystemExit(f"{url} answered {got[:300]!r}")
    return times


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


async def measure(
    args: argparse.Namespace, tools_url: str, gateway_url: str, key: str
) -> dict[str, object]:
    direct_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Mcp-Session-Id": "s1",
        "MCP-Protocol-Version": "2025-11-25",
    }
    via_headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    gateway_body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "bench.echo"}}
    )
    results: dict[str, list[float]] = {"direct": [], "llmgw": []}
    async with aiohttp.ClientSession() as session:
        await calls(session, tools_url, direct_headers, 200)  # warm both ways
        async with session.post(gateway_url, data=gateway_body, headers=via_headers) as a:
            await a.read()
        for _ in range(args.rounds):
            results["direct"] += await calls(session, tools_url, direct_headers, args.calls)
            times: list[float] = []
            for _ in range(args.calls):
                start = time.perf_counter()
                async with session.post(gateway_url, data=gateway_body, headers=via_headers) as a:
                    got = await a.read()
                times.append(time.perf_counter() - start)
                if b'"result"' not in got:
                    raise SystemExit(f"/mcp answered {got[:300]!r}")
            results["llmgw"] += times
    out: dict[str, object] = {}
    for way, times in results.items():
        out[way] = {
            "p50_ms": round(percentile(times, 0.5) * 1000, 3),
            "p99_ms": round(percentile(times, 0.99) * 1000, 3),
            "calls_per_s": round(len(times) / sum(times), 1),
        }
    added = (percentile(results["llmgw"], 0.5) - percentile(results["direct"], 0.5)) * 1000
    out["added_p50_ms"] = round(added, 3)
    out["target_added_p50_ms"] = TARGET_ADDED_P50_MS
    out["met"] = added < TARGET_ADDED_P50_MS
    out["stdev_direct_ms"] = round(statistics.pstdev(results["direct"]) * 1000, 3)
    return out


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a benchmark server exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listened on {port}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls a way a round (2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, ways alternating (3)")
    parser.add_argument("--rate", action="store_true", help="give the server a rate (counted)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    parser.add_argument("--serve-tools", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_tools:
        serve_tools(args.serve_tools)
        return 0
    tools_port = free_port()
    tools_url = f"http://127.0.0.1:{tools_port}/mcp"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [
        subprocess.Popen([sys.executable, __file__, "--serve-tools", str(tools_port)], **quiet)
    ]
    try:
        wait_port(tools_port, procs[0])
        with tempfile.TemporaryDirectory() as root:
            cp, gateway_url, key = start_llmgw(Path(root), tools_url, args.rate)
            procs.append(cp)
            figures = asyncio.run(measure(args, tools_url, gateway_url, key))
    finally:
        for proc in procs:
            proc.kill()  # nothing of theirs is kept: no need to wait for a graceful end
            proc.wait(10)
    figures["calls"] = args.calls * args.rounds
    figures["rate"] = args.rate
    figures["cpus"] = os.cpu_count()
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
