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
- Record: each call is an audit entry (``mcp.call`` by ``gateway``, target
  ``SERVER.TOOL``, detail ``key K; 12.3 ms; ok``), queued on the ``AuditTrail`` and
  written with the second's others, never on a call's path; a standby's go to the
  leader's store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from llmgw.server.audittrail import AuditTrail
from llmgw.server.gateway.levels import Window
from llmgw.server.gateway.metrics import Histogram

log = logging.getLogger("llmgw.mcp")

Outcome = Literal["ok", "error", "timeout", "refused", "rate_limited", "unavailable"]
FAILURES = 5
OUT_FOR = 60.0


@dataclass
class Breaker:
    failures: int = 0
    out_until: float | None = None


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class McpCalls:
    def __init__(self, trail: AuditTrail, clock: Callable[[], float] = time.time) -> None:
        self.trail = trail
        self.clock = clock
        self.rates: dict[tuple[str, str], Window] = {}
        self.breakers: dict[str, Breaker] = {}
        self.outcomes: dict[tuple[str, Outcome], int] = {}
        self.seconds: dict[str, Histogram] = {}

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
        outcomes = self.outcomes
        outcomes[(server, outcome)] = outcomes.get((server, outcome), 0) + 1
        hist = self.seconds.get(server)
        if hist is None:
            hist = self.seconds[server] = Histogram()
        hist.observe(seconds)
        detail = f"key {key_name}; {seconds * 1000:.1f} ms; {outcome}"
        self.trail.add("gateway", "mcp.call", f"{server}.{tool}", detail)

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
