"""``/metrics``: the gateway's counters and the engines' own metrics, as Prometheus text.

The gateway counts in plain dicts on the request path (a few dictionary updates and a
bisect a request) and this module writes them out when scraped. Each Ready replica's
engine is scraped then too, with its key, and its samples re-exported with ``model``
and ``replica`` labels added, under Prometheus names (``enginefamilies.py``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

# A sample's key: its one label's value, or a tuple of them in the order of the labels.
_Key = TypeVar("_Key", bound=str | tuple[str, ...])

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
}


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str) -> Iterable[str]:
        running = 0
        for bound, count in zip((*BUCKETS, float("inf")), self.counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            yield f'{name}_bucket{{{labels},le="{le}"}} {running}'
        yield f"{name}_sum{{{labels}}} {self.total:.6f}"
        yield f"{name}_count{{{labels}}} {self.n}"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Recent:
    """The last hour of the gateway at ``step`` second slots: requests, errors, and the
    sum and count of times to first token, for the admin overview's charts. A slot no
    request fell in reads 0 requests (a quiet gateway), and no time to first token."""

    def __init__(self, step: float = 10.0, span: float = 3600.0) -> None:
        self.step = step
        self.slots = int(span // step)
        n = self.slots
        self.requests = [0] * n
        self.errors = [0] * n
        self.first_sum = [0.0] * n
        self.first_n = [0] * n
        self.last = -1  # the newest slot written

    def _at(self, now: float) -> int:
        slot = int(now // self.step)
        if slot > self.last:
            n = self.slots
            for s in range(max(self.last + 1, slot - n + 1), slot + 1):
                p = s % n
                self.requests[p] = self.errors[p] = self.first_n[p] = 0
                self.first_sum[p] = 0.0
            self.last = slot
        return slot % self.slots

    def add(self, error: bool, first: float | None, now: float) -> None:
        p = self._at(now)
        self.requests[p] += 1
        if error:
            self.errors[p] += 1
        elif first is not None:
            self.first_sum[p] += first
            self.first_n[p] += 1

    def series(self, now: float) -> dict[str, Sequence[float | None]]:
        """Oldest slot first: ``t`` (each slot's start), ``requests``, ``errors`` and
        ``ttft_ms`` (None where no answer began in the slot)."""
        end = int(now // self.step)
        self._at(now)
        t: list[float] = []
        requests: list[int] = []
        errors: list[int] = []
        ttft: list[float | None] = []
        for s in range(end - self.slots + 1, end + 1):
            p = s % self.slots
            t.append(s * self.step)
            requests.append(self.requests[p])
            errors.append(self.errors[p])
            count = self.first_n[p]
            ttft.append(round(1000 * self.first_sum[p] / count, 1) if count else None)
        return {"t": t, "requests": requests, "errors": errors, "ttft_ms": ttft}


class Metrics:
    def __init__(self) -> None:
        # The last hour, for the admin overview's charts.
        self.recent = Recent()
        self.requests: dict[tuple[str, int], int] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.latency: dict[str, Histogram] = {}
        self.first_byte: dict[str, Histogram] = {}
        self.tokens: dict[tuple[str, str], int] = {}
        # Answered (completion) tokens by (model, replica): energy per token's divisor.
        self.replica_tokens: dict[tuple[str, str], int] = {}
        # Seconds requests waited in the gateway's queue, by model (those that waited).
        self.queue_seconds: dict[str, Histogram] = {}

    def queued(self, model: str, seconds: float) -> None:
        hist = self.queue_seconds.get(model)
        if hist is None:
            hist = self.queue_seconds[model] = Histogram()
        hist.observe(seconds)

    def request(self, model: str, status: int, seconds: float, first: float | None) -> None:
        self.recent.add(status >= 400, first if first is not None else seconds, time.time())
        key = (model, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        if status >= 400:
            kind = ERROR_TYPES.get(status, "api_error" if status < 503 else "unavailable")
            ekey = (model, kind)
            self.errors[ekey] = self.errors.get(ekey, 0) + 1
            return
        hist = self.latency.get(model)
        if hist is None:
            hist = self.latency[model] = Histogram()
            self.first_byte[model] = Histogram()
        hist.observe(seconds)
        self.first_byte[model].observe(first if first is not None else seconds)

    def add_tokens(self, model: str, prompt: int, completion: int) -> None:
        for kind, n in (("prompt", prompt), ("completion", completion)):
            if n:
                self.tokens[(model, kind)] = self.tokens.get((model, kind), 0) + n

    def render(
        self,
        inflight: dict[tuple[str, str], int],
        prefix_hits: dict[str, int],
        engines: Iterable[str] = (),
        failures: dict[tuple[str, str], int] | None = None,
        breaker_opens: dict[tuple[str, str], int] | None = None,
        vouched: dict[tuple[str, str], int] | None = None,
        queue_depth: dict[str, int] | None = None,
    ) -> str:
        out: list[str] = []

        def head(name: str, kind: str, text: str) -> None:
            out.append(f"# HELP {name} {text}")
            out.append(f"# TYPE {name} {kind}")

        head("llmgw_requests_total", "counter", "Gateway requests by model and status.")
        for (model, status), n in sorted(self.requests.items()):
            out.append(f'llmgw_requests_total{{model="{_esc(model)}",code="{status}"}} {n}')
        head("llmgw_errors_total", "counter", "Gateway failures by model and error type.")
        for (model, kind), n in sorted(self.errors.items()):
            out.append(f'llmgw_errors_total{{model="{_esc(model)}",type="{kind}"}} {n}')
        head("llmgw_request_seconds", "histogram", "Whole request time, answered requests.")
        for model, hist in sorted(self.latency.items()):
            out.extend(hist.lines("llmgw_request_seconds", f'model="{_esc(model)}"'))
        head(
            "llmgw_time_to_first_token_seconds",
            "histogram",
            "Time to the first byte of the answer (a stream's first token).",
        )
        for model, hist in sorted(self.first_byte.items()):
            out.extend(hist.lines("llmgw_time_to_first_token_seconds", f'model="{_esc(model)}"'))
        head("llmgw_tokens_total", "counter", "Tokens by model and kind (prompt, completion).")
        for (model, kind), n in sorted(self.tokens.items()):
            out.append(f'llmgw_tokens_total{{model="{_esc(model)}",kind="{kind}"}} {n}')
        head("llmgw_replica_inflight", "gauge", "Requests in flight per replica.")
        for (model, replica), n in sorted(inflight.items()):
            out.append(
                f'llmgw_replica_inflight{{model="{_esc(model)}",replica="{_esc(replica)}"}} {n}'
            )
        head(
            "llmgw_router_prefix_hits_total",
            "counter",
            "Requests sent to a replica for its cached prompt prefix rather than the least busy.",
        )
        for model, n in sorted(prefix_hits.items()):
            out.append(f'llmgw_router_prefix_hits_total{{model="{_esc(model)}"}} {n}')
        per_replica = (
            (
                "llmgw_replica_failures_total",
                "counter",
                "Failures of a replica itself (refused, reset, connect timeout, 5xx to a "
                "checked request); never an answer about the request.",
                failures,
            ),
            (
                "llmgw_replica_breaker_opens_total",
                "counter",
                "Times a replica's breaker opened after failures in a row.",
                breaker_opens,
            ),
            (
                "llmgw_replica_vouched_by_probe",
                "gauge",
                "1 while a replica is routed to on the control plane's own probe because "
                "its node's agent is silent.",
                vouched,
            ),
        )
        for name, kind, text, counts in per_replica:
            head(name, kind, text)
            for (model, replica), n in sorted((counts or {}).items()):
                out.append(f'{name}{{model="{_esc(model)}",replica="{_esc(replica)}"}} {n}')
        out += family(
            "llmgw_gateway_queue_depth",
            "gauge",
            "Requests waiting in the gateway's queue for a model whose every replica is "
            "at its slots.",
            queue_depth or {},
            ("model",),
        )
        head(
            "llmgw_gateway_queue_seconds",
            "histogram",
            "Time requests waited in the gateway's queue, however they left it (served, "
            "refused at its deadline, or their client gone).",
        )
        for model, hist in sorted(self.queue_seconds.items()):
            out.extend(hist.lines("llmgw_gateway_queue_seconds", f'model="{_esc(model)}"'))
        out.extend(engines)
        return "\n".join(out) + "\n"


def family(
    name: str,
    kind: str,
    text: str,
    samples: Mapping[_Key, int | float],
    labels: tuple[str, ...],
) -> list[str]:
    """One family: HELP, TYPE and a sample for each key of ``samples`` (a label value,
    or a tuple of them in the order of ``labels``), sorted."""
    out = [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
    for key, n in sorted(samples.items()):
        values = key if isinstance(key, tuple) else (key,)
        pairs = ",".join(f'{k}="{_esc(str(v))}"' for k, v in zip(labels, values, strict=True))
        out.append(f"{name}{{{pairs}}} {n}" if pairs else f"{name} {n}")
    return out


def routing_lines(
    decisions: dict[tuple[str, str], int],
    kv_hits: dict[str, int],
    kv_blocks: dict[tuple[str, str], int],
    tokenize_failures: int,
) -> list[str]:
    """The router's own families: why each pick was made, and KV-event routing."""
    return [
        *family(
            "llmgw_router_decisions_total",
            "counter",
            "Replica picks by model and the reason "
            "(kv_events, approximate_prefix, least_outstanding, only_replica).",
            decisions,
            ("model", "reason"),
        ),
        *family(
            "llmgw_router_kv_hits_total",
            "counter",
            "Requests sent to a replica whose KV cache held the prompt's leading blocks, "
            "as its engine's events said.",
            kv_hits,
            ("model",),
        ),
        *family(
            "llmgw_router_kv_blocks",
            "gauge",
            "KV-cache blocks a replica holds, from its events.",
            kv_blocks,
            ("model", "replica"),
        ),
        *family(
            "llmgw_router_tokenize_failures_total",
            "counter",
            "Prompts routed without KV events because the replica's tokenizer did not answer.",
            {(): tokenize_failures},
            (),
        ),
    ]


def resume_lines(resumed: dict[str, int], failed: dict[tuple[str, str], int]) -> list[str]:
    """Streams whose replica failed mid-stream: those the gateway still ended normally
    (resume.py), and those it could not, by why."""
    return [
        *family(
            "llmgw_gateway_stream_resumed_total",
            "counter",
            "Streamed answers whose replica failed mid-stream that still ended normally: "
            "continued on another replica, or ended when nothing was left to say.",
            resumed,
            ("model",),
        ),
        *family(
            "llmgw_gateway_stream_resume_failures_total",
            "counter",
            "Streamed answers whose replica failed mid-stream that ended with an error "
            "event, by why they were not continued.",
            failed,
            ("model", "reason"),
        ),
    ]
