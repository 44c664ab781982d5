"""MCP gateway benchmark: a tool call through llmgw's ``/mcp`` against the same call made
to the tool server directly, in one run, with the same client and the same tool server.

The tool server is a bare aiohttp MCP server (handshake era, a session id, JSON
answers, ``echo`` answered with prepared bytes: as fast as a tool server gets, so what
llmgw adds is not hidden by the tool) in a process of its own. The gateway is llmgw's
own MCP gateway (``llmgw.server.mcp``: the key looked up, the grant, the rate window,
the breaker, our streamable-HTTP client, the call's record) behind the gateway's key
check, served by aiohttp in a second process, with the tool server added as ``bench``
and a key granted ``bench.*``; with ``--rate`` the server has a rate far above the
load, so the window is counted on every call. No guard policy: a key without policies
does not ask the guard at all.

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

TARGET_ADDED_P50_MS = 1.0
KEY = "sk-llmgw-bench-mcp"
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


def serve_gateway(port: int, tools_url: str, rate: bool) -> None:
    from llmgw.server.gateway.limits import KeyBook, Usage, key_hash
    from llmgw.server.mcp.parts import mcp_parts
    from llmgw.server.mcp.service import McpServerAdd
    from llmgw.server.principal import Principal
    from llmgw.server.store import ApiKeyRecord, SQLiteStore

    async def start() -> web.Application:
        store = SQLiteStore(Path(tempfile.mkdtemp()) / "bench.db")
        await store.open()
        session = aiohttp.ClientSession()
        parts = mcp_parts(store, b"b" * 32, lambda: session)
        await parts.registry.load()
        ask = McpServerAdd("bench", tools_url, rate=10**6 if rate else None)
        await parts.service.add(ask, Principal.system("bench"))
        keys = KeyBook(Usage(store))
        keys.load([ApiKeyRecord("k1", "bench", key_hash(KEY), tools=("bench.*",))])

        async def handle(request: web.Request) -> web.StreamResponse:
            key = keys.authorise(request.headers.get("Authorization", ""))
            if isinstance(key, web.Response):
                return key
            return await parts.gateway.handle(request, key)

        async def record(app: web.Application) -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(parts.calls.run(stop))
            yield  # type: ignore[misc]
            stop.set()
            await task

        app = web.Application()
        app.router.add_post("/mcp", handle)
        app.cleanup_ctx.append(record)  # type: ignore[arg-type]
        return app

    web.run_app(start(), host="127.0.0.1", port=port, print=None, access_log=None)


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


async def measure(args: argparse.Namespace, tools_url: str, gateway_url: str) -> dict[str, object]:
    direct_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Mcp-Session-Id": "s1",
        "MCP-Protocol-Version": "2025-11-25",
    }
    via_headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
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
    parser.add_argument("--serve-gateway", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--tools-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_tools:
        serve_tools(args.serve_tools)
        return 0
    if args.serve_gateway:
        serve_gateway(args.serve_gateway, args.tools_url, args.rate)
        return 0
    tools_port, gateway_port = free_port(), free_port()
    tools_url = f"http://127.0.0.1:{tools_port}/mcp"
    me = [sys.executable, __file__]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([*me, "--serve-tools", str(tools_port)], **quiet)]
    try:
        wait_port(tools_port, procs[0])
        gateway = [*me, "--serve-gateway", str(gateway_port), "--tools-url", tools_url]
        procs.append(subprocess.Popen(gateway + (["--rate"] if args.rate else []), **quiet))
        wait_port(gateway_port, procs[1])
        figures = asyncio.run(measure(args, tools_url, f"http://127.0.0.1:{gateway_port}/mcp"))
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
