"""What the MCP gateway keeps of its calls: each caller's calls a minute to a server,
each server's breaker, the metrics, and the record of every call.

- Rate: a server's ``rate`` bounds each key's calls to it a minute (``levels.Window``:
  exact to the second). A call over it is refused with the seconds to wait.
- Breaker: ``FAILURES`` failures in a row (it could not be reached, answered an HTTP
  error or garbage, dropped the call, or timed out) take a server out for ``OUT_FOR``
  seconds: its tools leave the list and a call is refused saying until when. After
  that one call is let through: its success closes the breaker, its failure takes the
  server out again. A tool that answers ``isError``, or a JSON-RPC error, is the
  server answering: no failure.
- Metrics: ``llmgw_mcp_calls_total{server,outcome}``, ``llmgw_mcp_call_seconds{server}``
  and ``llmgw_mcp_server_up{server}``, written into the gateway's ``/metrics``.
- Record: each call is counted in memory per (day, key, server, tool) and queued for
  the audit log (``mcp.call``, target ``SERVER.TOOL``, detail ``key K; 12.3 ms; ok``);
  ``run`` writes the queue once a second, never on a call's path. What the store does
  not take stays queued (up to ``MAX_QUEUED``, the oldest dropped past it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from llmgw.server.gateway.levels import Window
from llmgw.server.gateway.metrics import Histogram
from llmgw.server.store import Store, StoreUnavailable

log = logging.getLogger("llmgw.mcp")

Outcome = Literal["ok", "error", "timeout", "refused", "rate_limited", "unavailable"]
FAILURES = 5
OUT_FOR = 60.0
MAX_QUEUED = 10_000
# The days of counts kept in memory.
KEEP_DAYS = 31


@dataclass
class Breaker:
    failures: int = 0
    out_until: float | None = None


@dataclass(frozen=True)
class CallRecord:
    at: float
    key_id: str
    key_name: str
    server: str
    tool: str
    seconds: float
    outcome: Outcome


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class McpCalls:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.rates: dict[tuple[str, str], Window] = {}
        self.breakers: dict[str, Breaker] = {}
        self.outcomes: dict[tuple[str, Outcome], int] = {}
        self.seconds: dict[str, Histogram] = {}
        # (day, key id, server, tool) -> [calls, failed]
        self.counts: dict[tuple[str, str, str, str], list[int]] = {}
        self.queued: deque[CallRecord] = deque(maxlen=MAX_QUEUED)
        self.written = 0

    # ------------------------------------------------------------------ rate

    def over_rate(self, key_id: str, server: str, rate: int | None) -> int | None:
        """Counts this call when under ``rate`` a minute (None: no limit) and answers
        None; else the seconds until one more is taken."""
        if rate is None:
            return None
        window = self.rates.get((key_id, server))
        if window is None:
            window = self.rates[(key_id, server)] = Window()
        now = self.clock()
        if window.count(now) >= rate:
            return max(1, window.retry_after(now, rate))
        window.add(now, 1)
        return None

    # --------------------------------------------------------------- breaker

    def out_until(self, server: str) -> float | None:
        """Until when ``server`` is out (epoch seconds), or None when it is in."""
        breaker = self.breakers.get(server)
        if breaker is None or breaker.out_until is None:
            return None
        if self.clock() >= breaker.out_until:
            # Its minute is over: the next call may go, and one failure puts it out again.
            breaker.out_until = None
            breaker.failures = FAILURES - 1
            return None
        return breaker.out_until

    def failed(self, server: str) -> None:
        breaker = self.breakers.setdefault(server, Breaker())
        breaker.failures += 1
        if breaker.failures >= FAILURES and breaker.out_until is None:
            breaker.out_until = self.clock() + OUT_FOR
            log.warning(
                "MCP server %s failed %d times in a row: out for %g s",
                server,
                breaker.failures,
                OUT_FOR,
            )

    def succeeded(self, server: str) -> None:
        breaker = self.breakers.get(server)
        if breaker is not None:
            breaker.failures, breaker.out_until = 0, None

    # ---------------------------------------------------------------- record

    def record(
        self, key_id: str, key_name: str, server: str, tool: str, seconds: float, outcome: Outcome
    ) -> None:
        now = self.clock()
        outcomes = self.outcomes
        outcomes[(server, outcome)] = outcomes.get((server, outcome), 0) + 1
        hist = self.seconds.get(server)
        if hist is None:
            hist = self.seconds[server] = Histogram()
        hist.observe(seconds)
        day = time.strftime("%Y-%m-%d", time.gmtime(now))
        counted = self.counts.get((day, key_id, server, tool))
        if counted is None:
            counted = self.counts[(day, key_id, server, tool)] = [0, 0]
            self._trim_days(day)
        counted[0] += 1
        counted[1] += outcome != "ok"
        self.queued.append(CallRecord(now, key_id, key_name, server, tool, seconds, outcome))

    def _trim_days(self, today: str) -> None:
        days = sorted({d for d, _, _, _ in self.counts})
        for old in days[:-KEEP_DAYS] if len(days) > KEEP_DAYS else ():
            for k in [k for k in self.counts if k[0] == old]:
                del self.counts[k]

    async def flush(self) -> None:
        """Write what is queued to the audit log; what the store refuses stays queued."""
        while self.queued:
            call = self.queued[0]
            detail = f"key {call.key_name}; {call.seconds * 1000:.1f} ms; {call.outcome}"
            await self.store.audit("gateway", "mcp.call", f"{call.server}.{call.tool}", detail)
            self.queued.popleft()
            self.written += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Write the calls' record once a second."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                pass
            try:
                await self.flush()
            except StoreUnavailable:
                pass  # said by the store; kept and written later
            except Exception:
                log.exception("could not write the MCP calls' record (kept, retried in 1 s)")

    # --------------------------------------------------------------- metrics

    def metric_lines(self, servers: Iterable[tuple[str, bool]]) -> list[str]:
        """The MCP families; ``servers``: each server's name and whether it is on."""
        out = [
            "# HELP llmgw_mcp_calls_total MCP tool calls through /mcp by server and outcome.",
            "# TYPE llmgw_mcp_calls_total counter",
        ]
        for (server, outcome), n in sorted(self.outcomes.items()):
            out.append(f'llmgw_mcp_calls_total{{server="{_esc(server)}",outcome="{outcome}"}} {n}')
        out += [
            "# HELP llmgw_mcp_call_seconds Whole MCP tool call time by server.",
            "# TYPE llmgw_mcp_call_seconds histogram",
        ]
        for server, hist in sorted(self.seconds.items()):
            out.extend(hist.lines("llmgw_mcp_call_seconds", f'server="{_esc(server)}"'))
        out += [
            "# HELP llmgw_mcp_server_up Whether an MCP server is on and not out (its breaker).",
            "# TYPE llmgw_mcp_server_up gauge",
        ]
        for server, enabled in sorted(servers):
            up = int(enabled and self.out_until(server) is None)
            out.append(f'llmgw_mcp_server_up{{server="{_esc(server)}"}} {up}')
        return out
